"""The batched step hands samplers logits, not log-probabilities: no logsumexp over the vocabulary.

mlx-lm's `GenerationBatch._step` normalizes every row every step,
`logits - mx.logsumexp(logits, axis=-1, keepdims=True)`, before sampling. Nothing in the engine
needs that for most rows: argmax, temperature sampling (`mx.random.categorical` takes logits),
top-k, a grammar's mask and logit_bias (which renormalizes on its own) all choose the same token
from logits shifted by a per-row constant. On the CPU it is not cheap: 31 ms for 32 rows of
SmolLM2's 49,152-token vocabulary (`mx.exp` is slow there, see cpu_ops), ~10% of a 32-row
decode step. So in the engine thread the step's logsumexp is a zero, and the few consumers that
need probabilities normalize their own row: top-p (core.engine.sample.sampling) and the log-probabilities
a request asked for (the engine's `_token_logprob`), each one row, only when asked.

`install` rebinds `mx` in `mlx_lm.generate` to a view of `mlx.core` whose `logsumexp` returns 0
in a thread that asked (`use_here`); every other name, and every other thread, gets `mlx.core`'s
own. If a later mlx-lm stops calling `mx.logsumexp` in its step, the rows come normalized
again, which every consumer here accepts as well.

One more name differs there: the prompt step's `clear_cache` after every chunk does nothing.
The engine bounds MLX's buffer cache with a limit (core.platform.memory) and empties it when
its model is unloaded; emptying the cache at every chunk cost the engine thread 0.25 ms a step
at 32 users on the bundled model (its own work is ~2 ms) and made the next step allocate its
buffers afresh.

Runs in the engine thread (and `install` wherever the engine starts).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import mlx.core as mx

_here = threading.local()


def use_here(on: bool) -> None:
    """In this thread, mlx_lm.generate's logsumexp is 0 (once `install` ran)."""
    _here.on = on


class _StepMx:
    """`mlx.core` as mlx_lm.generate sees it."""

    library = mx

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)

    @staticmethod
    def logsumexp(a: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if getattr(_here, "on", False):
            return mx.array(0.0, a.dtype)
        return mx.logsumexp(a, *args, **kwargs)

    @staticmethod
    def clear_cache() -> None:
        if not getattr(_here, "on", False):
            mx.clear_cache()


def skipped_here() -> bool:
    """Does mlx_lm.generate's step leave the logits unnormalized in this thread?"""
    return getattr(_here, "on", False) and isinstance(step_module().mx, _StepMx)


def install() -> None:
    """Idempotent."""
    generate = step_module()

    if not isinstance(generate.mx, _StepMx):
        generate.mx = _StepMx()


def step_module() -> Any:  # (not ModuleType: `install` sets its `mx`, which that type does not declare)
    """mlx_lm.generate the module (the package's `generate` attribute is its function)."""
    return importlib.import_module("mlx_lm.generate")


def normalized(logits: mx.array) -> mx.array:
    """Log-probabilities from logits (or from log-probabilities: then the same)."""
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)
