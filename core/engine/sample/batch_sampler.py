"""One sampling call for the whole decoding batch, each row with its own parameters and seed.

mlx-lm's `GenerationBatch._step` samples a batch in one call only when every row has the same
sampler; otherwise it slices the logits row by row and calls each row's sampler on its own
slice. Every sampled request had its own sampler (its PRNG stream makes a seed survive
batching), so at 32 chat users with a temperature that was 32 calls a step, each a handful of
ops and, with top-p, a sort of the whole vocabulary: on the bundled model on this CPU it cut
output from ~820 to ~570 tokens/s against greedy (loadtests/bench_host --temperature).

Here every row's sampler is one `BatchSampler` (the generator's fallback sampler, which mlx-lm
gives every row inserted without one), so the step calls it once with the batch's logits. It
reads the rows' order from the decoding batch and each row's `Draw` from the engine:

- greedy rows: one argmax over the batch;
- sampled rows (a `Draw`): grouped by their filters (top-p, top-k, min-p: mlx-lm's, which
  work on a batch), the temperature a per-row column, and the draw one vmapped
  `mx.random.categorical` over per-row keys;
- grammar rows (a `Constrained`): every one's mask filled in one call on llguidance's threads
  while the step's forward runs, applied with one `where`, then drawn as their own sampler
  says (greedy, a `Draw` with the others);
- anything else a row was given (logit_bias): that row's own function on its own row, as the
  library would have called it.

Penalties (repetition, presence, frequency) come first, for every penalized row at once: the
same arithmetic as mlx-lm's processors over the same context (a row's last PENALTY_CONTEXT
tokens, its current input included), with per-row values as columns. mlx-lm's step applies a
processor row by row (0.45 ms of the engine thread a step at 32 rows on the bundled model),
and the default model's card asks for a repetition penalty.

A row's key for its n-th token is a fixed mix of its seed (or a random 64-bit base) and n,
built on the host, so a seeded reply is the same alone or in any batch, and rewinding after a
preemption is setting n back (`Draw.rewind`). Runs in the engine thread only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from radixchat.core.engine.sample.constrain import Constrained, masks
from radixchat.core.engine.step.unnormalized import normalized

if TYPE_CHECKING:
    from mlx_lm.sample_utils import Sampler

    from radixchat.core.engine.active import Active

_MASK64 = 2**64 - 1
# the tokens penalties look back on: the sequence's last ones, its prompt's end included,
# as mlx-lm's own processors do (their default is 20); a reply's loops are shorter than this
PENALTY_CONTEXT = 64
# one categorical draw per row, each from its own key (checked equal to drawing row by row)
_categorical = mx.vmap(lambda logits, key: mx.random.categorical(logits, key=key))


def _mix(base: int, n: int) -> int:
    """splitmix64 of (base, n): well spread 64-bit keys from a seed and a counter."""
    z = (base + (n + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class Draw:
    """A sampled request's parameters and its place in its random stream."""

    __slots__ = ("base", "calls", "filters", "inv_temp")

    def __init__(self, temperature: float, top_p: float, top_k: int, min_p: float, seed: int | None):
        self.inv_temp = 1.0 / temperature
        self.filters = (top_p if 0 < top_p < 1.0 else 0.0, max(top_k, 0), min_p if min_p > 0 else 0.0)
        self.base = seed if seed is not None else random.getrandbits(64)
        self.calls = 0  # tokens drawn so far: the next one's key is _mix(base, calls)

    def key(self) -> tuple[int, int]:
        """The next token's key, as `mx.random.key` lays one out (high word, low word)."""
        z = _mix(self.base, self.calls)
        self.calls += 1
        return z >> 32, z & 0xFFFFFFFF

    def rewind(self, delivered: int) -> None:
        """Draw the tokens after the first `delivered` again, with the same keys: the batch
        samples a step ahead, and a preempted request's sample ahead was thrown away."""
        self.calls = delivered

    def __call__(self, logits: mx.array) -> mx.array:
        """This row alone (a grammar's or a bias's sampler calls it on its row)."""
        return draw(logits, [self])


def draw(logits: mx.array, rows: list[Draw]) -> mx.array:
    """One token for each row of `logits` (n, V), rows sharing their filters; logits may be
    shifted by a per-row constant (core.engine.step.unnormalized), which only top-p and min-p mind."""
    top_p, top_k, min_p = rows[0].filters
    if top_p:
        logits = apply_top_p(normalized(logits), top_p)
    if 0 < top_k < logits.shape[-1]:  # k = the whole vocabulary filters nothing
        logits = apply_top_k(logits, top_k)
    if min_p:
        logits = apply_min_p(normalized(logits), min_p)
    temps = {r.inv_temp for r in rows}
    scale = next(iter(temps)) if len(temps) == 1 else mx.array([r.inv_temp for r in rows])[:, None]
    keys = mx.array([r.key() for r in rows], dtype=mx.uint32)
    return _categorical(logits * scale, keys)


class Penalty:
    """A request's repetition (multiplicative), presence and frequency (subtracted) penalties."""

    __slots__ = ("frequency", "presence", "repetition")

    def __init__(self, repetition: float = 1.0, presence: float = 0.0, frequency: float = 0.0):
        self.repetition, self.presence, self.frequency = repetition, presence, frequency


NEUTRAL = Penalty()


def penalize(logits: mx.array, pens: list[Penalty], past: list[list[int]], inputs: mx.array) -> mx.array:
    """mlx-lm's repetition, presence and frequency processors, in that order, over rows (n, V)
    whose tokens so far are `past` (host lists) and whose current inputs are `inputs` (n,)."""
    n, keep = logits.shape[0], PENALTY_CONTEXT - 1
    # a short past is padded with -1, which becomes the row's input: set-like penalties
    # (repetition, presence) write a token's value once however often it is listed, and the
    # frequency penalty counts only the real entries
    rows = [[-1] * (keep - len(p)) + p[-keep:] if keep else [] for p in past]
    current = inputs.astype(mx.int32)[:, None]
    idx = mx.concatenate([mx.array(rows, dtype=mx.int32).reshape(n, keep), current], axis=1)
    real = idx >= 0
    idx = mx.where(real, idx, current)

    def column(values: list[float]) -> mx.array:
        return mx.array(values, dtype=logits.dtype)[:, None]

    if any(p.repetition != 1.0 for p in pens):
        penalty = column([p.repetition for p in pens])
        chosen = mx.take_along_axis(logits, idx, axis=-1)
        logits = mx.put_along_axis(logits, idx, mx.where(chosen < 0, chosen * penalty, chosen / penalty), axis=-1)
    if any(p.presence for p in pens):
        chosen = mx.take_along_axis(logits, idx, axis=-1)
        logits = mx.put_along_axis(logits, idx, chosen - column([p.presence for p in pens]), axis=-1)
    if any(p.frequency for p in pens):
        counted = column([p.frequency for p in pens]) * real.astype(logits.dtype)
        logits = logits.at[mx.arange(n)[:, None], idx].subtract(counted)
    return logits


class BatchSampler:
    """The decoding batch's one sampler. At the moment a step samples, `rows` gives the
    batch's uids in row order, each row's tokens so far (those in its cache) and the step's
    inputs (n,); `request` a uid's request (None: gone), whose `sampler` is None (greedy), a
    `Draw`, or a function of its row's logits (1, V) -> token (1,), and whose `penalty` is a
    `Penalty` or None."""

    def __init__(self) -> None:
        self.rows: Callable[[], tuple[list[int], list[list[int]], mx.array | None]] = lambda: ([], [], None)
        self.request: Callable[[int], Active | None] = lambda uid: None

    def greedy(self, uid: int) -> bool:
        """Is this row's next token its argmax (what prompt-lookup drafts are checked against)?"""
        r = self.request(uid)
        return getattr(r, "sampler", None) is None and getattr(r, "penalty", None) is None

    @contextmanager
    def sampling(self, uids: list[int], tokens: list[list[int]], inputs: mx.array) -> Iterator[None]:
        """Rows other than the decoding batch's sample meanwhile (mlx-lm's one-token prompts
        take their first token in a batch of their own)."""
        rows, self.rows = self.rows, lambda: (uids, tokens, inputs)
        try:
            yield
        finally:
            self.rows = rows

    def __call__(self, logits: mx.array) -> mx.array:
        uids, tokens, inputs = self.rows()
        if len(uids) != logits.shape[0]:
            raise RuntimeError(f"the batch sampler got {logits.shape[0]} rows for a batch of {len(uids)}")
        requests = [self.request(u) for u in uids]
        pens = [getattr(r, "penalty", None) for r in requests]
        if any(pens):  # a row without penalties takes neutral ones, which change nothing
            # (the inputs are there whenever a step samples)
            logits = penalize(logits, [p or NEUTRAL for p in pens], tokens, cast(mx.array, inputs))
        specs: list[Sampler | None] = [getattr(r, "sampler", None) for r in requests]
        grammar = [i for i, s in enumerate(specs) if isinstance(s, Constrained)]
        if not grammar:
            return self._sample(logits, specs)
        rows = cast("list[Constrained]", [specs[i] for i in grammar])
        logits, masked = _masked(logits, requests, grammar, rows)
        for i, c in zip(grammar, rows):  # each masked row draws by its own sampler; a failed one its argmax
            specs[i] = c.inner if i in masked else None
        out = self._sample(logits, specs)
        for i, c in zip(grammar, rows):
            if i in masked:
                c.constraint.chose(out[i : i + 1])
        return out

    def _sample(self, logits: mx.array, specs: list[Sampler | None]) -> mx.array:
        if all(s is None for s in specs):
            return mx.argmax(logits, axis=-1)
        groups: dict[tuple[float, int, float], list[int]] = {}
        custom: list[int] = []
        for i, s in enumerate(specs):
            if isinstance(s, Draw):
                groups.setdefault(s.filters, []).append(i)
            elif s is not None:
                custom.append(i)
        b = len(specs)
        if len(groups) == 1 and not custom and len(next(iter(groups.values()))) == b:
            return draw(logits, cast("list[Draw]", specs))  # every row samples alike: the common case
        tokens = mx.argmax(logits, axis=-1)
        for rows in groups.values():
            idx = mx.array(rows)
            tokens[idx] = draw(logits[idx], cast("list[Draw]", [specs[i] for i in rows]))
        for i in custom:
            tokens[i : i + 1] = cast("Sampler", specs[i])(logits[i : i + 1]).astype(tokens.dtype)
        return tokens


def _masked(
    logits: mx.array, requests: list[Active | None], grammar: list[int], rows: list[Constrained]
) -> tuple[mx.array, set[int]]:
    """`logits` with each grammar row's forbidden tokens at -inf, and the rows masked (a row
    whose grammar failed is not: its request's `error` says why, and it ends). The step's
    forward is launched first, so it runs while llguidance fills the masks; the masks are
    filled one owner at a time, so each owner's rows are timed by their own grammars
    (core.engine.sched.mask_share charges them to that owner)."""
    mx.async_eval(logits)  # type: ignore[no-untyped-call]  # (MLX's stub leaves it unannotated)
    by_owner: dict[object, list[int]] = {}
    for k, i in enumerate(grammar):
        by_owner.setdefault(getattr(requests[i], "owner", None), []).append(k)
    allowed: dict[int, np.ndarray] = {}  # batch row -> its mask
    for ks in by_owner.values():
        ok, failed = masks([rows[k].constraint for k in ks], logits.shape[-1])
        for j, (k, f) in enumerate(zip(ks, failed)):
            if f is None:
                allowed[grammar[k]] = ok[j]
            else:
                cast("Active", requests[grammar[k]]).error = f  # (the Active whose sampler it is)
    if not allowed:
        return logits, set()
    masked = sorted(allowed)
    keep = mx.array(np.stack([allowed[i] for i in masked]))
    if len(masked) == logits.shape[0]:  # every row has a grammar: one where over the batch
        return mx.where(keep, logits, -mx.inf), set(masked)
    idx = mx.array(masked)
    logits[idx] = mx.where(keep, logits[idx], -mx.inf)
    return logits, set(masked)
