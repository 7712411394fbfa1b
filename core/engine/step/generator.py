"""What the engine asks of a batch generator, and mlx-lm's own generator made to answer it.

The engine drives one of two generators (core.engine.step.stepper.make_generator): the budgeted
one (`BudgetedBatchGenerator`: a token budget a step, newcomers hurried, one sampler for the
batch, drafts) or, where the installed mlx-lm's generator is not the one it reorders, mlx-lm's
`BatchGenerator` as it is. `Generator` is everything the engine, its parts and a sharded
follower use of either, so they call it without probing for attributes; `LibraryGenerator` is
mlx-lm's with the budgeted one's extras present and idle (no drafts, no batch sampler, its own
prefill order). Runs in the engine thread only (a generator is MLX work).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from mlx_lm.generate import BatchGenerator


@runtime_checkable
class Generator(Protocol):
    speculator: Any  # core.engine.step.speculate.Speculator, or None: no drafts
    batch_sampler: Any  # core.engine.sample.batch_sampler.BatchSampler, or None: each row's own sampler
    newcomer: Callable[[], bool] | None  # the engine's: is a newcomer waiting for a step alone?

    def insert_segments(self, segments: list, **kwargs: Any) -> list[int]: ...

    def next(self) -> tuple[list, list]: ...

    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> dict: ...

    def extract_cache(self, uids: list[int]) -> dict: ...

    def hurry(self, uids: list[int], alone: list[int] | None = None) -> None: ...

    def close(self) -> None: ...


class LibraryGenerator(BatchGenerator):
    """mlx-lm's `BatchGenerator` unchanged, with the budgeted generator's extras idle: it
    prefills in its own order (decode, then prefill), takes each row's sampler and drafts nothing."""

    speculator = None
    batch_sampler = None
    newcomer: Callable[[], bool] | None = None  # never asked: it has no step alone

    def hurry(self, uids: list[int], alone: list[int] | None = None) -> None:
        pass
