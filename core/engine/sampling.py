"""Per-request samplers with their own PRNG stream (so a seed survives batching).

mlx-lm's `make_sampler` draws from MLX's global random state, which every request in a
batch shares; here each request carries its own key, split once per step. The top-p, top-k
and min-p filters are mlx-lm's. Greedy requests get `None`, so BatchGenerator samples a
batch of them in one call with its own argmax sampler.

A sampler takes a row's logits up to a constant (core.engine.unnormalized: the batched step
does not normalize them), so whatever needs probabilities normalizes the row itself.
"""

from __future__ import annotations

import random
from collections import deque

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from radixchat.core.engine.requests import Sampling
from radixchat.core.engine.unnormalized import normalized

REWIND = 16  # samples a sampler can draw again (a preemption throws away one, or a step's drafts)
# the tokens penalties look back on: the sequence's last ones, its prompt's end included,
# as mlx-lm's own processors do (their default is 20); a reply's loops are shorter than this
PENALTY_CONTEXT = 64


def penalties(s: Sampling) -> list:
    """A request's logits processors (mlx-lm's, which BatchGenerator applies to its row
    alone before sampling): none when every penalty is off, so such a row costs nothing."""
    if not (s.presence_penalty or s.frequency_penalty or s.repetition_penalty != 1.0):
        return []
    return make_logits_processors(
        repetition_penalty=s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        repetition_context_size=PENALTY_CONTEXT,
        presence_penalty=s.presence_penalty or None,
        presence_context_size=PENALTY_CONTEXT,
        frequency_penalty=s.frequency_penalty or None,
        frequency_context_size=PENALTY_CONTEXT,
    )


def _biased(bias: dict[int, float]):
    """logprobs (1, V) -> the same with `bias` added to those tokens, renormalized (OpenAI
    adds logit_bias to the logits before any sampling step)."""
    ids, values, vec = mx.array(list(bias)), mx.array(list(bias.values()), dtype=mx.float32), {}

    def apply(logprobs: mx.array) -> mx.array:
        if "v" not in vec:
            vec["v"] = mx.zeros((logprobs.shape[-1],), dtype=logprobs.dtype).at[ids].add(values.astype(logprobs.dtype))
        return normalized(logprobs + vec["v"])

    return apply


def make_request_sampler(s: Sampling, constraint=None):
    """Return a sampler `logprobs (1, V) -> token (1,)`, or None for plain greedy.
    `constraint` (core.engine.constrain.Constraint) masks what its grammar forbids first."""
    if constraint is not None:
        inner = make_request_sampler(s) or (lambda logprobs: mx.argmax(logprobs, axis=-1))

        def constrained(logprobs: mx.array) -> mx.array:
            token = inner(constraint.mask(logprobs))
            constraint.chose(token)
            return token

        def rewind(delivered: int) -> None:
            constraint.rewind(delivered)
            getattr(inner, "rewind", lambda n: None)(delivered)

        constrained.rewind = rewind
        return constrained
    bias = _biased(s.logit_bias) if s.logit_bias else None
    if s.temperature == 0:
        if bias is None:
            return None
        return lambda logprobs: mx.argmax(bias(logprobs), axis=-1)
    state = {"key": mx.random.key(s.key_seed if s.seed is not None else random.getrandbits(63)), "calls": 0}
    past = deque(maxlen=REWIND)  # (call number, the key it started from)
    inv_temp = 1.0 / s.temperature

    def sample(logprobs: mx.array) -> mx.array:
        if bias is not None:
            logprobs = bias(logprobs)
        if 0 < s.top_p < 1.0:  # it exponentiates the row: raw logits could overflow
            logprobs = apply_top_p(normalized(logprobs), s.top_p)
        if 0 < s.top_k < logprobs.shape[-1]:  # k = the whole vocabulary filters nothing
            logprobs = apply_top_k(logprobs, s.top_k)
        if s.min_p > 0:  # relative to the most likely token: needs the row normalized too
            logprobs = apply_min_p(normalized(logprobs), s.min_p)
        past.append((state["calls"], state["key"]))
        keys = mx.random.split(state["key"])
        state["key"] = keys[0]
        state["calls"] += 1
        return mx.random.categorical(logprobs * inv_temp, key=keys[1])

    def rewind(delivered: int) -> None:
        """Draw the samples after the first `delivered` again with the same keys: those
        were made ahead (the batch samples a step before it returns) and thrown away when
        the request was preempted, so a seeded reply goes on as it would have."""
        for n, key in past:
            if n == delivered:
                state["key"], state["calls"] = key, n
                return

    sample.rewind = rewind
    return sample


def guarded(a, sampler):
    """Wrap request `a`'s sampler so its failure ends that request (noted in `a.error`),
    not the batch: the step goes on with the argmax for that row."""
    if sampler is None:
        return None

    def guarded_sampler(logprobs):
        try:
            return sampler(logprobs)
        except Exception as e:
            a.error = e
            return mx.argmax(logprobs, axis=-1)

    guarded_sampler.rewind = getattr(sampler, "rewind", None)

    return guarded_sampler
