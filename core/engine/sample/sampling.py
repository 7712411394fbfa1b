"""Per-request samplers with their own PRNG stream (so a seed survives batching).

mlx-lm's `make_sampler` draws from MLX's global random state, which every request in a
batch shares; here each request carries its own. A plain sampled request gets a `Draw`
(core.engine.sample.batch_sampler), which the decoding batch draws with its other sampled rows in
one call; a logit_bias wraps it (or an argmax) in a function of the request's own row, and a
grammar in a `Constrained` (core.engine.sample.constrain), whose rows the batch sampler masks together. The top-p, top-k and min-p filters are mlx-lm's. Greedy requests get `None`, so a
batch of them is one argmax. Penalties go to the batch sampler too (`processors`), or to
mlx-lm's per-row processors where it is not there or the request asked for log-probabilities.

A sampler takes a row's logits up to a constant (core.engine.step.unnormalized: the batched step
does not normalize them), so whatever needs probabilities normalizes the row itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors

from radixchat.core.engine.sample.batch_sampler import PENALTY_CONTEXT, Draw, Penalty
from radixchat.core.engine.sample.constrain import Constrained
from radixchat.core.engine.step.unnormalized import normalized
from radixchat.core.seam.requests import Sampling

if TYPE_CHECKING:
    from mlx_lm.sample_utils import LogitsProcessor, Sampler

    from radixchat.core.engine.active import Active
    from radixchat.core.engine.sample.constrain import Constraint


def processors(a: Active, batched: bool) -> list[LogitsProcessor]:
    """Request `a`'s logits processors for mlx-lm's step; where the batch sampler applies its
    penalties (`batched`), none, and `a.penalty` says what it applies. A request that asked for
    log-probabilities keeps the library's: they are reported after its penalties."""
    s = a.sampling
    a.penalty = None
    if batched and s.logprobs is None and _penalized(s):
        a.penalty = Penalty(s.repetition_penalty, s.presence_penalty or 0.0, s.frequency_penalty or 0.0)
        return []
    return penalties(s)


def penalties(s: Sampling) -> list[LogitsProcessor]:
    """A request's logits processors (mlx-lm's, which BatchGenerator applies to its row
    alone before sampling): none when every penalty is off, so such a row costs nothing."""
    if not _penalized(s):
        return []
    return make_logits_processors(
        repetition_penalty=s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        repetition_context_size=PENALTY_CONTEXT,
        presence_penalty=s.presence_penalty or None,
        presence_context_size=PENALTY_CONTEXT,
        frequency_penalty=s.frequency_penalty or None,
        frequency_context_size=PENALTY_CONTEXT,
    )


def _penalized(s: Sampling) -> bool:
    return bool(s.presence_penalty or s.frequency_penalty or s.repetition_penalty != 1.0)


def _biased(bias: dict[int, float]) -> Callable[[mx.array], mx.array]:
    """logprobs (1, V) -> the same with `bias` added to those tokens, renormalized (OpenAI
    adds logit_bias to the logits before any sampling step)."""
    ids, values, vec = mx.array(list(bias)), mx.array(list(bias.values()), dtype=mx.float32), {}

    def apply(logprobs: mx.array) -> mx.array:
        if "v" not in vec:
            vec["v"] = mx.zeros((logprobs.shape[-1],), dtype=logprobs.dtype).at[ids].add(values.astype(logprobs.dtype))
        return normalized(logprobs + vec["v"])

    return apply


def make_request_sampler(s: Sampling, constraint: Constraint | None = None) -> Sampler | None:
    """Return a sampler `logprobs (1, V) -> token (1,)`, or None for plain greedy.
    `constraint` (core.engine.sample.constrain.Constraint) masks what its grammar forbids first."""
    if constraint is not None:
        return Constrained(constraint, make_request_sampler(s))
    bias = _biased(s.logit_bias) if s.logit_bias else None
    if s.temperature == 0:
        if bias is None:
            return None
        return lambda logprobs: mx.argmax(bias(logprobs), axis=-1)
    # drawn with the batch's other sampled rows, in one call (core.engine.sample.batch_sampler)
    d = Draw(s.temperature, s.top_p, s.top_k, s.min_p, s.key_seed)
    if bias is None:
        return d

    def biased(logprobs: mx.array) -> mx.array:
        return d(bias(logprobs))

    biased.rewind = d.rewind  # type: ignore[attr-defined]  # (a function's attribute: what a preemption rewinds)
    return biased


def guarded(a: Active, sampler: Sampler | None) -> Sampler | None:
    """Wrap request `a`'s sampler so its failure ends that request (noted in `a.error`),
    not the batch: the step goes on with the argmax for that row. The sampler is kept on `a`
    (`a.sampler`), so it refers back to `a` weakly: a strong reference would make every such
    request a reference cycle, freed only by Python's cyclic collector, whose pauses stall
    every thread (the engine's steps among them)."""
    if sampler is None or isinstance(sampler, Draw):
        return sampler  # (a Draw runs no code of its own that could fail for one request)
    if isinstance(sampler, Constrained):
        sampler.request = weakref.proxy(a)  # (the batch sampler masks its rows together: it notes failures there)
        return sampler
    ref = weakref.ref(a)

    def guarded_sampler(logprobs: mx.array) -> mx.array:
        try:
            return sampler(logprobs)
        except Exception as e:
            if (request := ref()) is not None:
                request.error = e
            return mx.argmax(logprobs, axis=-1)

    guarded_sampler.rewind = getattr(sampler, "rewind", None)  # type: ignore[attr-defined]  # (as above)

    return guarded_sampler
