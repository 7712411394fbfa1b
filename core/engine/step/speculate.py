"""Prompt-lookup (n-gram) speculative decoding, verified inside the batched decode step.

A reply often repeats its context: code it is asked to change, names, a quoted sentence, a
list's pattern. For each greedy row, `Drafts` looks up the row's last 3 (else 2) tokens in
everything the row has seen (its prompt and reply) and, where they occurred before, proposes
the tokens that followed there (prompt lookup decoding: Saxena 2023; vLLM's "ngram"
speculator). `verify_step` runs the whole batch's current tokens and drafts in one forward,
[B, 1 + K] (K the step's width, shorter drafts padded), keeps each row's drafts while the
model's own argmax agrees, and adds the model's next token after them: a greedy row gets 1 to
K + 1 tokens from one forward, exactly the tokens plain greedy decoding would give.

Where it pays: a forward reads every weight once whatever its width, so at one row extra
tokens are cheap ([1, 2] 1.11x a [1, 1] forward on this CPU), at 32 rows they are not ([32, 2]
1.35x, [32, 4] 2.4x): `python -m loadtests.bench_decode --widths 1,2,3,4` prints the costs and
loadtests.bench_speculate the end-to-end speed-up (BENCHMARKS.md: 1.15-1.21x at one user,
0.95-1.08x at 8 and 32 users here, so it is off by default). `Speculator.width` picks each step's
width from this server's own timings. Rows that sample (temperature > 0), follow a grammar or
a logit_bias, and newcomers on their last prompt token, draft nothing and take their token
from position 0 through their own sampler, as in mlx-lm's step; so does every row when no
row has a draft, or when not even every likely row's full draft could pay for the wider forward
(`Speculator.promising`, asked before the step waits for the rows' current tokens): then the
library's own pipelined step runs.

A row's rejected drafts stay in its K/V as holes (core.cache.batch.slots.SlotKVCache.reject),
masked for that row and dropped when the cache compacts. Only runs with every layer's cache
a SlotKVCache (not hybrid or rotating models), and not under mlx.launch (core.engine.
lockstep: drafts would be one more thing the ranks must agree on). Engine thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.sample_utils import greedy_sampler

from radixchat.core.cache.batch.slots import SlotKVCache
from radixchat.core.engine.sample.batch_sampler import BatchSampler

if TYPE_CHECKING:
    from radixchat.core.engine.step.decode_batch import DecodingBatch

NGRAMS = (3, 2)  # the lookup's n, longest first: a 1-token match guesses too often to pay
COMPACT_AT = 32  # holes in a row before the batch's caches are re-laid without them


PRIOR_COST = 0.25  # a forward's extra time per extra input token per row, as a share of a
# one-token forward, until this server has timed both (SmolLM2 on this CPU: 0.17-0.33)
PRIOR_ACCEPT = 0.6  # a new row's acceptance
RECENT = 0.5  # weight of a row's latest draft in its acceptance: a reply quotes in runs (a code
# block copied whole, then prose that copies nothing), so the last drafts tell the next best
EMA = 0.2  # weight of the newest timing in a forward's cost
MARGIN = 0.15  # from 8 rows on, a verify step must promise this much more than a plain one: what
# the timings miss (the engine's per-row work, which a plain step overlaps with its forward and a
# verify step waits for; the holes' columns; compaction) cost 6-12% at 8 rows here when steps
# verified on thinner promises, and next to nothing at one row


class Drafts:
    """A row's tokens in its K/V (mirrored from the batch's lists), where each n-gram of them
    last occurred, and how many of its drafts the model accepted."""

    def __init__(self) -> None:
        self.seq: list[int] = []
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram -> the index of the token that followed it
        self.acceptance = PRIOR_ACCEPT  # share of a draft's tokens the model took, recent drafts first

    def sync(self, tokens: list[int]) -> None:
        """Catch up with the row's tokens (they only ever grow)."""
        self.extend(tokens[len(self.seq) :])

    def extend(self, tokens: list[int]) -> None:
        seq, follows = self.seq, self.follows
        for t in tokens:
            end = len(seq)  # t's index: it follows the n-grams that end just before it
            for n in NGRAMS:
                if end >= n:
                    follows[tuple(seq[end - n : end])] = end
            seq.append(t)

    def likely(self) -> bool:
        """Did the last words occur before (so the row is in a part that repeats)? Cheap, and
        known before the current token is: a step where no row is likely to draft keeps the
        library's pipelined step, which never waits for that token."""
        seq = self.seq
        return any(len(seq) >= n and tuple(seq[-n:]) in self.follows for n in NGRAMS)

    def propose(self, current: int, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the last words,
        `current` (the token the row is about to run) the last of them."""
        seq = self.seq
        for n in NGRAMS:
            if len(seq) < n - 1:
                continue
            at = self.follows.get(tuple(seq[len(seq) - n + 1 :]) + (current,))
            if at is not None:
                return seq[at : at + k]
        return []


class Speculator:
    """Drafts for a decoding batch's rows, how wide a step verifies, and the counters."""

    def __init__(self, k: int):
        self.k = k
        self.rows: dict[int, Drafts] = {}  # uid -> its drafts
        self.steps = self.drafted = self.accepted = 0
        self.waits = 0  # steps that waited for the batch's current tokens to build drafts
        self.rows_drafting = 0  # rows that brought a draft to a verify step
        self.rows_verified = 0  # rows in verify steps, drafting or not
        self.seconds: dict[tuple[int, int], float] = {}  # (batch size's bit length, tokens per row) -> a step's time

    def candidates(self, gen: DecodingBatch, skip: set[int]) -> list[Drafts | None]:
        """Each row's Drafts, caught up with its tokens, or None where it cannot draft
        (sampling, processors, a newcomer's last prompt token: uids in `skip`)."""
        live = set(gen.uids)
        for uid in [u for u in self.rows if u not in live]:
            del self.rows[uid]
        out: list[Drafts | None] = []
        for i, uid in enumerate(gen.uids):
            # the library gives a request without a sampler its argmax one, or the batch's
            sampler = gen.samplers[i] if gen.samplers else None
            greedy = sampler in (None, greedy_sampler) or (isinstance(sampler, BatchSampler) and sampler.greedy(uid))
            greedy = greedy and not gen.logits_processors[i]
            if not greedy or uid in skip:
                out.append(None)
                continue
            d = self.rows.get(uid)
            if d is None:
                d = self.rows[uid] = Drafts()
            d.sync(gen.tokens[i])
            out.append(d)
        return out

    def kept(self, uid: int, drafted: int, took: int) -> None:
        """A row of a verify step drafted this many tokens and the model took the first `took`."""
        self.rows_verified += 1
        self.drafted += drafted
        self.accepted += took
        self.rows_drafting += bool(drafted)
        d = self.rows.get(uid)
        if d is not None and drafted:
            d.acceptance = (1 - RECENT) * d.acceptance + RECENT * took / drafted

    def promising(self, uids: list[int], likely: list[bool], k: int) -> bool:
        """Could a verify step pay if every likely row drafted k tokens? Asked before the step
        waits for the rows' current tokens (what drafting needs): where even that does not
        beat a plain step, the library's pipelined step runs without the wait."""
        return self.width(uids, [[0] * k if hit else [] for hit in likely]) > 0

    def width(self, uids: list[int], drafts: list[list[int]]) -> int:
        """How many draft tokens per row this step verifies: the K that gives the most
        tokens per second by this server's timings, each row's acceptance so far (a draft's
        j-th token is taken with probability acceptance^j), and 0 when none beats a plain step
        by MARGIN."""
        b = len(drafts)
        best, value = 0, b * (1 + MARGIN * min(1.0, (b - 1) / 7))
        for k in range(1, max(len(d) for d in drafts) + 1):
            gain = 0.0
            for uid, d in zip(uids, drafts):
                if d:
                    a = self.rows[uid].acceptance
                    gain += sum(a**j for j in range(1, min(len(d), k) + 1))
            v = (b + gain) / self.cost(b, k + 1)
            if v > value:
                best, value = k, v
        return best

    def cost(self, b: int, n: int) -> float:
        """A [b, n] forward's time over a [b, 1] one's, as timed here (else the prior)."""
        bucket = b.bit_length()
        one, wide = self.seconds.get((bucket, 1)), self.seconds.get((bucket, n))
        if one and wide:
            return wide / one
        return 1 + PRIOR_COST * (n - 1)

    def timed(self, b: int, n: int, seconds: float) -> None:
        """A decode step of b rows and n tokens each took this long."""
        key = (b.bit_length(), n)
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else (1 - EMA) * old + EMA * seconds

    def summary(self) -> dict[str, Any]:
        return {
            "max_draft": self.k,
            "steps": self.steps,
            "waits": self.waits,
            "rows_verified": self.rows_verified,
            "rows_drafting": self.rows_drafting,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.accepted / self.drafted, 3) if self.drafted else None,
            # tokens a drafting row got from one forward (1 without speculation)
            "tokens_per_draft": round(1 + self.accepted / self.rows_drafting, 2) if self.rows_drafting else None,
        }


def usable(gen: GenerationBatch) -> bool:
    """Can this batch verify drafts (every layer's K/V can hold holes)?"""
    return bool(gen.prompt_cache) and all(type(c) is SlotKVCache for c in gen.prompt_cache)


def verify_step(
    gen: DecodingBatch, tokens: list[int], drafts: list[list[int]], spec: Speculator
) -> list[GenerationBatch.Response]:
    """One decode step of `gen` with drafts: what `GenerationBatch.next` does, for 1 + K
    tokens per row. `tokens` are the rows' current tokens (gen._next_tokens, evaluated)."""
    b, k = len(gen.uids), max(len(d) for d in drafts)
    x = mx.array([[t] + d + [t] * (k - len(d)) for t, d in zip(tokens, drafts)], dtype=mx.uint32)
    logits = gen.model(x, cache=gen.prompt_cache)
    first, context = _processed(gen, x, logits[:, 0, :])
    gen._current_tokens = x[:, 0]  # the inputs the batch sampler penalizes with, as in mlx-lm's step
    sampled = _sample(gen, first)
    argmax = mx.argmax(logits, axis=-1)  # [b, 1 + k]: the model's own choice after each input
    mx.eval(sampled, argmax, context)
    sampled_ids, argmax_ids = cast("list[int]", sampled.tolist()), cast("list[list[int]]", argmax.tolist())

    spec.steps += 1
    responses, keep, rejected, nexts, next_logprobs = [], [], [], [], []
    for i, uid in enumerate(gen.uids):
        d = drafts[i]
        took = 0
        while took < len(d) and argmax_ids[i][took] == d[took]:
            took += 1
        out = [tokens[i]] + d[:took]
        # the logits each token was chosen from: the current one's came with the last step
        logprobs = [gen._next_logprobs[i]] + [logits[i, j] for j in range(took)]
        n, finish = _advance(gen, i, out)
        gen.tokens[i].extend(out[:n])
        spec.kept(uid, len(d), took)
        rejected.append(k + 1 - n)
        nexts.append(argmax_ids[i][took] if took else sampled_ids[i])
        next_logprobs.append(first[i] if not took else logits[i, took])
        for j in range(n):
            responses.append([i, out[j], logprobs[j], finish if j == n - 1 else None])
        if finish is None:
            keep.append(i)
    for c in gen.prompt_cache:
        c.reject(rejected)
    replies = _responses(gen, responses)
    gen._next_tokens = mx.array(nexts, dtype=mx.uint32)
    gen._next_logprobs = next_logprobs
    if len(keep) < b:
        gen.filter(keep)
    if gen.prompt_cache and gen.prompt_cache[0].most_holes >= COMPACT_AT:
        for c in gen.prompt_cache:
            c.compact()
    return replies


def _processed(gen: DecodingBatch, x: mx.array, first: mx.array) -> tuple[mx.array, list[mx.array]]:
    """The logits at each row's current token after its logits processors (grammars,
    logit_bias), and the token contexts those processors were given."""
    context = []
    if any(gen.logits_processors):  # as the library's step: only rows with processors need a context
        rows = []
        for e in range(len(gen.uids)):
            row = first[e : e + 1]
            if gen.logits_processors[e]:
                ctx = gen._token_context[e].update_and_fetch(x[e, :1])  # type: ignore[no-untyped-call]  # (mlx-lm's)
                context.append(ctx)
                for processor in gen.logits_processors[e]:
                    row = processor(ctx, row)
            rows.append(row)
        first = mx.concatenate(rows, axis=0)
    return first, context


def _sample(gen: GenerationBatch, first: mx.array) -> mx.array:
    """Each row's token from its own sampler, in one call where all rows share one."""
    # samplers take logits up to a per-row constant (core.engine.step.unnormalized)
    samplers = [gen.fallback_sampler if s is None else s for s in (gen.samplers or [None] * len(gen.uids))]  # type: ignore[list-item]  # (mypy types the [None]s by gen.samplers)
    if all(s is samplers[0] for s in samplers):
        return samplers[0](first)
    return mx.concatenate([s(first[e : e + 1]) for e, s in enumerate(samplers)], axis=0)


def _advance(gen: GenerationBatch, i: int, out: list[int]) -> tuple[int, str | None]:
    """Count row `i`'s accepted tokens `out` against its max_tokens and stop sequences: how
    many of them it keeps, and why it finished there (None: it goes on)."""
    finish, n = None, 0
    for n, t in enumerate(out, 1):  # noqa: B007
        gen._num_tokens[i] += 1
        if gen._num_tokens[i] >= gen.max_tokens[i]:
            finish = "length"
        if gen._matchers[i].advance(t):
            finish = "stop"
        if finish is not None:
            break
    return n, finish


def _responses(gen: GenerationBatch, responses: list[list[Any]]) -> list[GenerationBatch.Response]:
    """The step's responses, a finished row's with its cache and tokens."""
    out = []
    for i, token, logprobs, finish in responses:
        done = finish is not None
        out.append(
            GenerationBatch.Response(
                gen.uids[i],
                token,
                logprobs,
                finish,
                gen.extract_cache(i) if done else None,
                gen.tokens[i] if done else None,
            )
        )
    return out
