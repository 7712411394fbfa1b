"""One engine step under a token budget: mlx-lm's BatchGenerator with its step reordered.

mlx-lm's `BatchGenerator._next` decodes the running batch, then prefills up to
`prefill_batch_size` prompts by `prefill_step_size` tokens each, and only at the *next*
call moves a finished prompt to the decoding batch; its first token comes out one call
later still. A newcomer therefore waits three full-batch steps for its first token, and a
step that prefills 4 x 512 prompt tokens stalls every running stream for all of them.

`BudgetedBatchGenerator` keeps the library's batches, caches, samplers and stop handling
and changes only the order and size of the work in one step (chunked prefill, as vLLM and
SGLang schedule it):

1. prompts are prefilled first, in chunks that share `step_tokens` with the decode rows
   (each decoding stream counts one token; prefill always gets at least a quarter of the
   budget, so a full batch cannot starve newcomers); how many prompts prefill together
   follows that room too (`_joining`: many short ones, a few long ones);
2. a prompt whose prefill ends in this step joins the decoding batch in this step, its
   last prompt token still to run;
3. the whole batch decodes one token: for a newcomer that forward is its last prompt
   token's, which samples its first token. (mlx-lm runs that token as a forward of its
   own, and every forward reads all the weights: on this CPU, with SmolLM2 and 32 users,
   230 ms a join against 390 ms for the whole batch's decode; loadtests/bench_profile.)

So a newcomer's first token comes out of the step after the one it joined in (its prefill
plus one batched forward), and a running stream's time per token is bounded by the budget,
not by the length of the prompts that arrive. The step that runs a newcomer's last prompt
token returns that token as mlx-lm returns every input; `_next` drops it, and the row's
count and stop matcher are set so that it neither counts nor stops there.

Two things keep a newcomer's first token from waiting on others' work:
- an owner's first prompt (the engine hurries it) when that owner has no row and others have,
  or join in the same turn (the engine marks it `alone`), takes a step of its own (`_first_alone`: its prefill, its
  last token's forward and one step of its small batch, no one else's rows), which returns
  its first token; it joins the decoding batch at the next call. Its first token then costs
  the step in flight and its own work, not a step of a flood's rows (their grammars' masks)
  or chunks (their long prefill); an ordinary step always runs between two such;
- the step in flight is short: the shared prefill's chunk is cut to what fits `prefill_s` at
  the latest chunks' cost per token (`_timed`), and runs in forwards of about PIECE_S, after
  any of which a newcomer waiting for a step alone ends it (`newcomer`, the engine's).

The engine learns about prefill progress through `on_prompt`, called inside the step at
the moment the caches match what the responses say (a segment's end before the next
chunk, a prompt's end before its first decode), so it can snapshot the K/V there.

It relies on the private layout of mlx-lm 0.32's BatchGenerator (`_prompt_batch`,
`_generation_batch`, `_unprocessed_sequences`, `_currently_processing`) and GenerationBatch
(the per-row lists `_next_tokens` ... `_matchers` that its constructor fills); pyproject pins
the minor version and `check_layout` refuses a generator that does not have it, in which
case the engine falls back to the library's own order. Runs in the engine thread only.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch, StopSequences, TokenBuffer
from mlx_lm.models.cache import BatchKVCache

from radixchat.core.cache.batch.coded import CodedSlotKVCache
from radixchat.core.cache.batch.layout import over_cap
from radixchat.core.cache.batch.slots import SlotKVCache, swap_order
from radixchat.core.cache.rounded import RoundedBatchKVCache, format_of
from radixchat.core.engine.sample.batch_sampler import BatchSampler
from radixchat.core.engine.step.decode_batch import DecodingBatch
from radixchat.core.engine.step.generator import Generator, LibraryGenerator
from radixchat.core.engine.step.speculate import Speculator, usable, verify_step

if TYPE_CHECKING:
    from typing import TypeAlias

    import mlx.nn as nn

    from radixchat.core.config import Settings
    from radixchat.core.engine.step.decode_batch import Running

    OnPrompt: TypeAlias = Callable[[list[PromptProcessingBatch.Response]], None]  # the engine's `_on_prompt`
    Responses: TypeAlias = Sequence[GenerationBatch.Response | Running]  # a step's (a running row's: a Running)

_LAYOUT = (
    "_prompt_batch",
    "_generation_batch",
    "_unprocessed_sequences",
    "_currently_processing",
    "_make_batch",
    "_counters",
    "completion_batch_size",
    "prefill_batch_size",
    "prefill_step_size",
)


_ROWS = (
    "uids",
    "prompt_cache",
    "tokens",
    "samplers",
    "logits_processors",
    "stop_sequences",
    "max_tokens",
    "_next_tokens",
    "_next_logprobs",
    "_token_context",
    "_num_tokens",
    "_matchers",
)
TIME_PLAIN_EVERY = 8  # with speculation on, one plain step in so many is timed (core.engine.step.speculate)
MIN_CHUNK = 64  # the least prompt tokens a step gives each long prompt being prefilled
TOKEN_EMA = 0.5  # weight of the latest chunk in the cost of a prompt token (`_timed`)
PIECE_S = 0.05  # a forward of the shared prefill, about, where a newcomer may cut it short (`_piece`)
NEVER_STOPS = StopSequences()  # a matcher of it never completes a stop sequence


def check_layout(gen: BatchGenerator) -> bool:
    """Does this mlx-lm's generator have the parts the budgeted step reorders?"""
    rows = (
        GenerationBatch.empty(gen.model, gen._generation_batch.fallback_sampler)
        if hasattr(gen, "_generation_batch")
        else None
    )
    return (
        all(hasattr(gen, name) for name in _LAYOUT)
        and hasattr(PromptProcessingBatch, "Response")
        and rows is not None
        and all(hasattr(rows, name) for name in _ROWS)
    )


# the prompt batches whose K/V the decoding batch's slots take over (plain, or at a --kv-bits precision)
ADOPTED = (BatchKVCache, RoundedBatchKVCache)


def make_room(caches: list[Any], tokens: int) -> None:
    """Give a batch of prompts' K/V buffers room for `tokens` more columns, in one pad, before
    its chunk. mlx-lm's BatchKVCache, out of room, grows by 256 zeroed columns and a copy of
    the whole buffer, every layer; a prompt batch merged from the prefix cache is exactly as
    wide as what it holds, so every step that started one paid that in its first forward.
    Under a flood of one-token requests (a dozen 14-token prompts a step, 9 tokens each
    cached), that forward took 30-80 ms against 9-15 for the next, on the bundled model on
    this CPU (with the pad: 31 ms, median), and a newcomer's prompt waited for it. For a long
    prompt the one pad replaces the growths its chunks would have made, each copying what was
    there."""
    for c in caches:
        if type(c) in ADOPTED and c.keys is not None and c.keys.shape[2] < c._idx + tokens:
            pad = [(0, 0), (0, 0), (0, c._idx + tokens - c.keys.shape[2]), (0, 0)]
            c.keys, c.values = mx.pad(c.keys, pad), mx.pad(c.values, pad)


class BudgetedBatchGenerator(BatchGenerator):
    def __init__(
        self,
        model: nn.Module,
        *,
        step_tokens: int,
        on_prompt: OnPrompt,
        slots: bool = True,
        codes: bool = False,
        speculate: int = 0,
        prefill_s: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(model, **kwargs)
        self.step_tokens = step_tokens
        self.prefill_s = prefill_s  # what a step's shared prefill may take, about (0: no limit)
        self._token_s = 0.0  # seconds a prompt token took in the latest chunks (a moving average)
        self.on_prompt = on_prompt
        self.slots = slots
        self.codes = codes  # the slots of --kv-bits layers hold codes (core.cache.batch.coded)
        # drafts need the slot cache's holes (core.engine.step.speculate)
        self.speculator = Speculator(speculate) if speculate and slots else None
        self._plain = 0  # plain steps taken while speculating (some are timed)
        self._warming: set[int] = set()  # rows whose last prompt token the next decode runs
        self._hurried: set[int] = set()  # waiting prompts that join the prefill at the next step
        self._alone: set[int] = set()  # hurried prompts that may take a step of their own
        self._was_alone = False  # the last call was a step of newcomers alone (`_first_alone`)
        # is a newcomer waiting who would take a step alone? (the engine's; None: never asked)
        self.newcomer: Callable[[], bool] | None = None
        # is a row's first token due from the decoding batch, its owner's only row? (the engine's)
        self.first_due: Callable[[], bool] | None = None
        self._side: GenerationBatch | None = None  # that step's rows, until they join the decoding batch
        self.batch_sampler: BatchSampler | None = None  # every row's sampler, once make_generator has set it
        # the decoding batch keeps a step's logits whole (core.engine.step.decode_batch)
        self._generation_batch = DecodingBatch.empty(self.model, self._generation_batch.fallback_sampler)
        if slots:
            # rows leave in the order that moves fewest slot rows; the batch's lists follow it
            gen = self._generation_batch
            keep_in_order = gen.filter
            gen.filter = lambda keep: keep_in_order(swap_order(list(keep)))

    def hurry(self, uids: list[int], alone: list[int] | None = None) -> None:
        """These waiting prompts join the prefill at the next step, ahead of the others and
        beyond `prefill_batch_size` if need be (the engine hurries an owner's first prompt in
        prefill, so a flood of long prompts cannot hold a newcomer's back). Those also `alone`
        (hurried too; the engine's: an owner with no row beside others' rows; all of them
        when not said) may take a step of their own (`_first_alone`)."""
        self._hurried.update(uids)
        self._alone.update(uids if alone is None else alone)

    def _next(self) -> tuple[list[PromptProcessingBatch.Response], Responses]:
        self._merge()
        gen = self._generation_batch
        if len(gen) < self.completion_batch_size:
            room = max(self.step_tokens - len(gen), self.step_tokens // 4)
            hurried = self._hurry_first()
            if hurried and (first := self._first_alone(hurried, room)) is not None:
                self._was_alone = True
                return [], first
            self._shared_prefill(self._timed(room), hurried)
        self._was_alone = False
        responses: Responses = []
        if len(gen):
            tic = time.perf_counter()
            responses = self._decode(gen)
            if self._warming:
                responses = self._warmed(gen, responses)
            self._counters.decode_time += time.perf_counter() - tic
            self._counters.generation_tokens += len(responses)
            self._counters.generation_steps += 1
        return [], responses

    def extract_cache(self, uids: list[int]) -> dict[int, tuple[list[Any], list[int]]]:
        """mlx-lm's, and the rows of a step alone not yet in the decoding batch (the engine
        stores a newcomer's prompt while its first token is on the way)."""
        side = self._side
        if side is None:
            return super().extract_cache(uids)  # type: ignore[no-untyped-call, no-any-return]  # (mlx-lm's)
        here = {u: (side.extract_cache(i), side.tokens[i]) for i, u in enumerate(side.uids) if u in uids}
        rest = [u for u in uids if u not in here]
        return {**(super().extract_cache(rest) if rest else {}), **here}  # type: ignore[no-untyped-call]  # (as above)

    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        self._merge()  # a row of the last step alone is a decoding row like the others
        return super().remove(uids, return_prompt_caches)  # type: ignore[no-untyped-call, no-any-return]  # (mlx-lm's)

    def _decode(self, gen: DecodingBatch) -> Responses:
        """The batch's decode: with drafts, verified in one forward (core.engine.step.speculate);
        else the library's own step. Drafts share the step's budget: a row and its drafts
        count 1 + K tokens."""
        spec = self.speculator
        if spec is None:
            return gen.next()
        b, tic = len(gen), None
        k = min(spec.k, self.step_tokens // b - 1) if usable(gen) else 0
        rows = spec.candidates(gen, self._warming) if k > 0 else []
        likely = [d is not None and d.likely() for d in rows]
        if any(likely) and spec.promising(gen.uids, likely, k):
            spec.waits += 1
            tokens = cast("list[int]", gen._next_tokens.tolist())  # waits for the last step's forward
            drafts = [d.propose(t, k) if d is not None else [] for d, t in zip(rows, tokens)]
            k = spec.width(gen.uids, drafts) if any(drafts) else 0
            if k > 0:
                tic = time.perf_counter()
                responses: Responses = verify_step(gen, tokens, [d[:k] for d in drafts], spec)
                spec.timed(b, k + 1, time.perf_counter() - tic)
                return responses
        if rows:
            self._plain += 1
            if self._plain % TIME_PLAIN_EVERY == 0:  # a forward of one token per row, timed alone
                mx.eval(gen._next_tokens)
                tic = time.perf_counter()
        responses = gen.next()
        if tic is not None and gen._next_tokens is not None:
            mx.eval(gen._next_tokens)  # this once, not overlapped with the engine's own work
            spec.timed(b, 1, time.perf_counter() - tic)
        return responses

    def _start_decoding(self, alone: list[GenerationBatch] | None = None) -> list[PromptProcessingBatch.Response]:
        """Move the prompts that are down to their last token to the decoding batch, or to
        `alone` (a list) as batches of their own.

        That token runs in the decode at the end of this step, beside the batch's (see the
        module's docstring); for the rows going `alone`, and a row with no K/V before that
        token, in a forward of their own, as in mlx-lm's order, which also samples their
        first token. Returns their end-of-prompt responses; their caches then hold the whole
        prompt but that token, which the responses' progress says (or the whole prompt, for
        the rows whose last token had its own forward)."""
        rows = self._currently_processing
        split = [i for i, (segs, _, _) in enumerate(rows) if len(segs) == 1 and len(segs[0]) == 1]
        if not split:
            return []
        last = [rows[i][0][0] for i in split]
        totals = [rows[i][2] for i in split]
        moving = set(split)
        self._currently_processing = [r for i, r in enumerate(rows) if i not in moving]
        if len(split) == len(rows):  # all of them (the usual case): the batch itself, not a copy
            prompts = self._prompt_batch  # (mlx-lm's split deep-copies every layer's K/V, then gathers)
            self._prompt_batch = PromptProcessingBatch.empty(
                prompts.model, prompts.fallback_sampler, prompts.prefill_step_size
            )
        else:
            prompts = self._prompt_batch.split(split)
        # A row with no K/V before its last token (a one-token prompt, nothing cached) runs
        # as mlx-lm runs it. One whose prompt the cache held but for that token folds too:
        # a retried or repeated prompt costs the batch no forward of its own.
        folded = alone is None and all(prompts.tokens)
        if folded:
            batch = self._unstepped(prompts, last)
        else:
            inputs = mx.array([t[-1] for t in last], dtype=mx.uint32)
            with self._sampling(prompts.uids, prompts.tokens, inputs):
                batch = prompts.generate(last)
        if alone is not None:
            alone.append(batch)
        else:
            self._join(batch)
        return [PromptProcessingBatch.Response(uid, (t - folded, t), True, True) for uid, t in zip(batch.uids, totals)]

    def _shared_prefill(self, room: int, hurried: int) -> None:
        """The step's prefill: waiting prompts join as `_joining` says (the first `hurried`
        always), and every prompt being prefilled gets an equal chunk of `room`, run in
        pieces of about PIECE_S where the chunk would take longer (`_piece`): after each, a
        newcomer waiting to take a step alone (`newcomer`) ends the prefill there, so its
        first prompt waits for a piece, not the whole chunk."""
        n = min(
            max(self.prefill_batch_size - len(self._prompt_batch), hurried),
            self.completion_batch_size - len(self._generation_batch),
            len(self._unprocessed_sequences),
        )
        n = self._joining(n, room, hurried)
        if n > 0:
            self._prompt_batch.extend(self._make_batch(n))
        through = self._start_decoding()  # restored from the cache up to the last token
        while self._currently_processing and room > 0:
            piece = self._piece(room)
            responses, used = self._prefill_chunk(piece)
            self.on_prompt(responses)
            through += self._start_decoding()
            room -= used
            if piece >= room + used or self.newcomer is None or self.newcomer():
                break  # (the whole room in one forward, as without pieces)
        if through:
            self.on_prompt(through)

    def _piece(self, room: int) -> int:
        """The tokens of the chunk's next forward: all of `room`, or what fits PIECE_S at the
        latest chunks' cost per token (never under MIN_CHUNK) when a newcomer may cut it short."""
        if self.newcomer is None or not self._token_s:
            return room
        return min(room, max(MIN_CHUNK, int(PIECE_S / self._token_s)))

    def _sampling(self, uids: list[int], tokens: list[list[int]], inputs: mx.array) -> AbstractContextManager[None]:
        """While rows other than the decoding batch's sample (BatchSampler.sampling), when the
        engine's batch sampler is in place."""
        return self.batch_sampler.sampling(uids, tokens, inputs) if self.batch_sampler else nullcontext()

    def _join(self, batch: GenerationBatch) -> None:
        """Rows that start decoding join the decoding batch."""
        if self.slots and not self._generation_batch.prompt_cache:
            # the first rows of a decoding batch: from here on, joins write into their slots
            most = self.completion_batch_size
            batch.prompt_cache = [  # each layer re-lays at a step of its own (SlotKVCache.stagger)
                self._slots_of(c).adopt(c, most, stagger=i) if type(c) in ADOPTED else c
                for i, c in enumerate(batch.prompt_cache)
            ]
        self._generation_batch.extend(batch)

    def _slots_of(self, c: BatchKVCache) -> type[SlotKVCache]:
        return CodedSlotKVCache if self.codes and format_of(c) is not None else SlotKVCache

    def _timed(self, room: int) -> int:
        """The shared prefill's room, cut to what fits `prefill_s` at the latest chunks' cost
        per token (never under MIN_CHUNK): a chunk of long prompts costs more as their context
        grows (SmolLM2 on this CPU: 256 tokens took 0.4 s at the start of 1,500-token prompts
        and 1.9 s near their end), and a newcomer's prompt waits for the step in flight."""
        if not self.prefill_s or not self._token_s:
            return room
        return min(room, max(MIN_CHUNK, int(self.prefill_s / self._token_s)))

    def _first_alone(self, k: int, room: int) -> list[GenerationBatch.Response] | None:
        """A step of newcomers alone: the first of the `k` hurried waiting prompts that fit
        `room` together (in order, passing those that do not) are prefilled whole in a batch
        of their own, their last prompt token runs in a forward of their own (which samples
        their first token), and one step of that small batch returns their first tokens.
        Nothing else runs in this call: not others' prefill, whose chunks cost more as their
        context grows (SmolLM2 here: 64-token chunks of four 1,500-token prompts took 0.8 to
        1.9 s a step), nor the decoding batch, whose rows (a flood's 32 of them, their
        grammars' masks) would otherwise be in the step a newcomer's first token comes out of. The rows join the decoding batch at the
        next call (`_merge`); its own step waits one short step.

        Only for prompts the engine marked `alone` (their owner had no row beside others'
        rows, or others' joining with it: one user's own stream of requests keeps the
        ordinary, batched order), when others have work (a decoding batch, a prefill
        part-way, prompts waiting that are not alone), not while the decoding batch owes a
        first token to a user with that one row (prefilled the ordinary way, on an engine that
        was idle when it came: another newcomer's step alone would hold it back a step), and
        never twice in a row: one
        ordinary step runs between two such, so a stream of newcomers (a flood of one-token
        requests, each its owner's first in prefill) cannot stall the batch.
        The hurried prompts that do not fit stay hurried for the next step. Returns the
        responses, or None when this call is an ordinary one."""
        gen = self._generation_batch
        waiting = self._unprocessed_sequences
        if self._was_alone or not (
            len(gen) or self._currently_processing or any(seq[0] not in self._alone for seq in waiting)
        ):
            return None
        if self.first_due is not None and self.first_due():
            return None  # a user's one row came first: the ordinary step returns its first token
        alone: list[Any]  # mlx-lm's waiting sequences (tuples it leaves untyped)
        rest: list[Any]
        free, tokens, alone, rest = self.completion_batch_size - len(gen), 0, [], []
        for seq in itertools.islice(waiting, k):
            size = sum(len(s) for s in seq[1])
            fits = seq[0] in self._alone and len(alone) < free and tokens + size <= room
            (alone if fits else rest).append(seq)
            tokens += size if fits else 0
        self._alone.difference_update(seq[0] for seq in alone)
        if not alone:
            return None
        self._hurried.update(seq[0] for seq in rest)  # (a flood's long prompt, hurried too)
        later = list(itertools.islice(waiting, k, None))
        waiting.clear()
        waiting.extend(alone + rest + later)
        shared = self._prompt_batch, self._currently_processing
        self._currently_processing = []
        self._prompt_batch = self._make_batch(len(alone))
        started: list[GenerationBatch] = []
        try:
            through = self._start_decoding(started)  # restored from the cache up to the last token
            while self._currently_processing:
                self.on_prompt(self._prefill_chunk(room, timed=False)[0])
                through += self._start_decoding(started)
        finally:
            self._prompt_batch, self._currently_processing = shared
        side = started[0]
        for batch in started[1:]:
            side.extend(batch)  # type: ignore[no-untyped-call]  # (mlx-lm's)
        self._side = side  # where extract_cache finds them until they join
        self.on_prompt(through)
        tic = time.perf_counter()
        with self._sampling(side.uids, side.tokens, side._next_tokens):
            responses = side.next()
        self._counters.decode_time += time.perf_counter() - tic
        self._counters.generation_tokens += len(responses)
        return responses

    def _merge(self) -> None:
        """The rows of the last step alone join the decoding batch (their K/V written into
        its slots now, while the step they were in has had a whole turn of the engine to
        end, rather than before their first tokens could go out)."""
        side, self._side = self._side, None
        if side is not None and side.uids:
            self._join(side)

    def _hurry_first(self) -> int:
        """Move the hurried waiting prompts to the front; returns how many there are."""
        if not self._hurried:
            return 0
        waiting = self._unprocessed_sequences
        first = [s for s in waiting if s[0] in self._hurried]
        self._hurried.clear()  # a hurried prompt joins now (removed ones are simply gone)
        self._alone.intersection_update(s[0] for s in first)  # (nor do those that went to the shared prefill)
        if first:
            moved = {s[0] for s in first}
            rest = [s for s in waiting if s[0] not in moved]
            waiting.clear()
            waiting.extend(first + rest)
        return len(first)

    def _joining(self, n: int, room: int, hurried: int = 0) -> int:
        """How many of the first `n` waiting prompts join the prefill in this step (the
        first `hurried` of them always do).

        Every prompt being prefilled gets an equal chunk of `room` (a batched forward pads to
        its longest row), so each joiner shrinks everyone's chunk. One joins while the chunk
        still covers what is left of every prompt in the prefill, or MIN_CHUNK tokens when some
        are longer: 32 users' short follow-up turns start together, long cold prompts a few at
        a time (all of them at once would all finish late), and the first always joins."""
        rows = [total - done for _, done, total in self._currently_processing]
        k = 0
        for seq in itertools.islice(self._unprocessed_sequences, n):
            rows.append(sum(len(s) for s in seq[1]))
            if k >= hurried and len(rows) > 1 and room // len(rows) < min(max(rows), MIN_CHUNK):
                break
            k += 1
        return k

    def _prefill_chunk(self, room: int, timed: bool = True) -> tuple[list[PromptProcessingBatch.Response], int]:
        """Prefill every waiting prompt by an equal chunk that fits `room` tokens; a chunk
        never crosses a segment's end. Returns the responses and the tokens it took. A
        `timed` chunk's cost per token is what `_timed` sizes the next ones by (a newcomer's
        short prompt alone says little about them)."""
        rows = self._currently_processing
        per_row = max(1, min(self.prefill_step_size, room // len(rows)))
        # room for every row's whole prompt (its chunks are right-padded to the longest), and
        # for the one token a step alone decodes in these buffers (`_first_alone`)
        make_room(self._prompt_batch.prompt_cache, max(sum(map(len, seq[0])) for seq in rows) + 1)
        prompts, responses = [], []
        for uid, seq in zip(self._prompt_batch.uids, rows):
            segments = seq[0]
            take = segments[0][:per_row]
            segments[0] = segments[0][len(take) :]
            end_of_segment = not segments[0]
            if end_of_segment:
                segments.pop(0)
            seq[1] += len(take)
            prompts.append(take)
            responses.append(PromptProcessingBatch.Response(uid, (seq[1], seq[2]), end_of_segment, False))
        n = sum(len(p) for p in prompts)
        self._counters.prompt_tokens += n
        timed = timed and self.prefill_s > 0
        if timed and self._generation_batch._next_tokens is not None:
            mx.eval(self._generation_batch._next_tokens)  # the decode in flight: not the chunk's time
        tic = time.perf_counter()
        self._prompt_batch.prompt(prompts)
        took = time.perf_counter() - tic
        self._counters.prompt_time += took
        if timed:
            last = took / n
            self._token_s = (1 - TOKEN_EMA) * self._token_s + TOKEN_EMA * last if self._token_s else last
        return responses, n

    def _unstepped(self, prompts: PromptProcessingBatch, last: list[list[int]]) -> GenerationBatch:
        """These prompts as decoding rows whose next input is their last prompt token (what
        mlx-lm's `PromptProcessingBatch.generate` builds, without its one-token forward)."""
        rows: GenerationBatch = GenerationBatch.empty(prompts.model, prompts.fallback_sampler)
        n = len(prompts.uids)
        rows.uids, rows.prompt_cache, rows.tokens = prompts.uids, prompts.prompt_cache, prompts.tokens
        rows.samplers, rows.logits_processors = prompts.samplers, prompts.logits_processors
        rows.stop_sequences = prompts.stop_sequences
        rows.max_tokens = [m + 1 for m in prompts.max_tokens]  # the last prompt token comes back once
        rows._next_tokens = mx.array([t[-1] for t in last], dtype=mx.uint32)
        rows._next_logprobs = [mx.zeros((1,))] * n  # returned with that token, which is dropped
        rows._token_context = [TokenBuffer(t) for t in prompts.tokens]  # type: ignore[no-untyped-call]  # (mlx-lm's)
        rows._num_tokens = [0] * n
        rows._matchers = [NEVER_STOPS.matcher() for _ in range(n)]
        self._warming.update(rows.uids)
        return rows

    def _warmed(self, gen: GenerationBatch, responses: Responses) -> list[GenerationBatch.Response | Running]:
        """Drop the responses that carry a newcomer's last prompt token; from here on its
        stop sequences count."""
        for i, uid in enumerate(gen.uids):
            if uid in self._warming:
                gen._matchers[i] = gen.stop_sequences[i].matcher()
        kept = [r for r in responses if r.uid not in self._warming]
        self._warming.clear()
        return kept


def make_generator(
    model: nn.Module, settings: Settings, stream: mx.Stream, on_prompt: OnPrompt, speculate: int, codes: bool = False
) -> Generator:
    """The engine's batch generator: this module's budgeted one (--step-tokens), or mlx-lm's
    own where the installed BatchGenerator is not the one it reorders. The budgeted one has a
    `batch_sampler`: rows go in without samplers of their own, and it asks the engine for each
    row's (`BatchSampler.request`); mlx-lm's own takes each row's sampler as it always did."""
    s = settings
    kwargs: dict[str, Any] = dict(  # (BatchGenerator's keywords)
        max_tokens=s.max_tokens,
        completion_batch_size=over_cap(s.max_batch),
        prefill_batch_size=s.max_prefill_batch,
        prefill_step_size=s.prefill_step,
        stream=stream,
    )
    if s.step_tokens:
        sampler = BatchSampler()  # every row's, so a step samples in one call (core.engine.sample.batch_sampler)
        gen = BudgetedBatchGenerator(
            model,
            step_tokens=s.step_tokens,
            on_prompt=on_prompt,
            slots=s.kv_slots,
            codes=codes,
            speculate=speculate,
            prefill_s=s.prefill_s,
            sampler=sampler,
            **kwargs,
        )
        if check_layout(gen):
            rows = gen._generation_batch  # the one batch a step samples
            sampler.rows = lambda: (rows.uids, rows.tokens, rows._current_tokens)
            gen.batch_sampler = sampler
            return gen
        gen.close()  # type: ignore[no-untyped-call]  # (mlx-lm's)
        logging.getLogger("radixchat.engine").warning(
            "this mlx-lm's BatchGenerator is not the one --step-tokens reorders: "
            "running with its own order (decode, then prefill)"
        )
    return LibraryGenerator(model, **kwargs)
