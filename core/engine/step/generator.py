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
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from mlx_lm.generate import BatchGenerator

if TYPE_CHECKING:
    from mlx_lm.generate import StopSequences
    from mlx_lm.sample_utils import LogitsProcessor

    from radixchat.core.engine.sample.batch_sampler import BatchSampler
    from radixchat.core.engine.step.speculate import Speculator


@runtime_checkable
class Generator(Protocol):
    speculator: Speculator | None  # None: no drafts
    batch_sampler: BatchSampler | None  # None: each row's own sampler
    newcomer: Callable[[], bool] | None  # the engine's: is a newcomer waiting for a step alone?
    first_due: Callable[[], bool] | None  # the engine's: is a lone row's first token due from the batch?

    # mlx-lm's keywords; a row's cache and sampler may be None, which its annotations leave out
    def insert_segments(
        self,
        segments: list[list[list[int]]],
        max_tokens: list[int] | None = None,
        caches: list[Any] | None = None,
        all_tokens: list[list[int]] | None = None,
        samplers: list[Any] | None = None,
        logits_processors: list[list[LogitsProcessor]] | None = None,
        stop_sequences: list[StopSequences] | None = None,
    ) -> list[int]: ...

    # (prompt responses, generation responses): mlx-lm's, or the decoding batch's (core.engine.step.decode_batch)
    def next(self) -> tuple[list[Any], list[Any]]: ...

    # uid -> (caches, tokens); Any keys, as the engine looks its rows up by `Active.uid` (an int | None)
    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> dict[Any, Any]: ...

    def extract_cache(self, uids: list[int]) -> dict[int, Any]: ...

    def hurry(self, uids: list[int], alone: list[int] | None = None) -> None: ...

    def close(self) -> None: ...


class LibraryGenerator(BatchGenerator):
    """mlx-lm's `BatchGenerator` unchanged, with the budgeted generator's extras idle: it
    prefills in its own order (decode, then prefill), takes each row's sampler and drafts nothing."""

    speculator: Speculator | None = None
    batch_sampler: BatchSampler | None = None
    newcomer: Callable[[], bool] | None = None  # never asked: it has no step alone
    first_due: Callable[[], bool] | None = None  # (nor this)

    def hurry(self, uids: list[int], alone: list[int] | None = None) -> None:
        pass
