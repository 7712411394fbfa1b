"""The decoding batch: mlx-lm's `GenerationBatch` with its step's logits kept whole.

mlx-lm's `GenerationBatch._step` splits every step's logits into one array per row
(`list(logprobs)`) and hands each of them to `async_eval` and then `eval`; its `next` gives
every row's response its row. At 32 rows that is ~50 us of the engine thread a step on this
CPU (`list` alone ~45 us), against ~2 ms of the engine's own work in a 20 ms step of the
bundled model. Almost nothing reads a row's logits: only a request that asked for
log-probabilities (core.engine.emit), a verified draft (core.engine.step.speculate) and a finished
row. So `DecodingBatch` keeps a step's logits as one array (`Rows`), sliced when a row is
read, and a running row's response (`Running`) reads its row only if asked.

Everything else is the library's, in its order: the forward, the one batched sampler call,
launching the next step before waiting on this one, the per-row counts and stop matchers,
leaving rows filtered out (the rows that move, and the rows that join, written after one
evaluation for every layer: core.cache.batch.slots.one_eval). A batch with a row that has logits
processors, or rows whose samplers differ, takes the library's step unchanged (the engine
gives its rows neither: one `BatchSampler` samples every row). Logits are normalized as the
library's step normalizes them (core.engine.step.unnormalized: not in the engine thread). Runs
in the engine thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, cast

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from radixchat.core.cache.batch.slots import one_eval
from radixchat.core.engine.step.cpu_ops import shared_positions
from radixchat.core.engine.step.unnormalized import normalized, skipped_here

if TYPE_CHECKING:
    from mlx_lm.sample_utils import LogitsProcessor, Sampler


class Rows:
    """One step's logits (rows, V), a row sliced when read. Rows that leave (`take`, what the
    batch's `filter` keeps) and rows that join (`extend`, what mlx-lm's
    `GenerationBatch.extend` calls) change which rows it holds, never slicing one: a row
    finishes or joins in most steps of a busy batch."""

    __slots__ = ("_all", "_index", "_more", "_n")

    def __init__(self, logits: mx.array):
        self._all, self._n = logits, logits.shape[0]
        self._index: list[int] | None = None  # held rows, as positions in `_all` then `_more`
        self._more: list[mx.array] = []  # the rows of those that joined

    def __len__(self) -> int:
        return len(self._index) if self._index is not None else self._n + len(self._more)

    def __getitem__(self, i: int) -> mx.array:
        j = i if self._index is None else self._index[i]
        return self._all[j] if j < self._n else self._more[j - self._n]

    def __iter__(self) -> Iterator[mx.array]:
        return (self[i] for i in range(len(self)))

    def extend(self, more: Iterable[mx.array]) -> None:
        more = list(more)
        if self._index is not None:
            start = self._n + len(self._more)
            self._index.extend(range(start, start + len(more)))
        self._more.extend(more)

    def take(self, keep: list[int]) -> Rows:
        """These rows, in this order."""
        rows = Rows(self._all)
        rows._more = list(self._more)
        rows._index = list(keep) if self._index is None else [self._index[k] for k in keep]
        return rows

    def arrays(self) -> list[mx.array]:
        return [self._all, *self._more]


def _arrays(logprobs: Rows | list[mx.array]) -> list[mx.array]:
    return logprobs.arrays() if isinstance(logprobs, Rows) else logprobs


class Running:
    """A response of a row that goes on decoding: `GenerationBatch.Response`'s fields, its
    logits read from the step's `Rows` only when asked."""

    __slots__ = ("_i", "_rows", "token", "uid")
    finish_reason = prompt_cache = all_tokens = None

    def __init__(self, uid: int, token: int, rows: Rows | list[mx.array], i: int):
        self.uid, self.token, self._rows, self._i = uid, token, rows, i

    @property
    def logprobs(self) -> mx.array:
        return self._rows[self._i]


class DecodingBatch(GenerationBatch):
    # mlx-lm leaves the first three unannotated, so mypy knows them only by what its constructor
    # sets (None, []); its per-row lists may be None by its annotations, and never are here
    _current_tokens: mx.array | None  # type: ignore[assignment]
    _current_logprobs: Rows | list[mx.array]  # type: ignore[assignment]
    _next_logprobs: Rows | list[mx.array]  # type: ignore[assignment]
    samplers: list[Sampler]
    logits_processors: list[list[LogitsProcessor]]

    def _step(self) -> tuple[list[int], Rows | list[mx.array]]:  # type: ignore[override]  # (Rows, not a list)
        sampler = self.samplers[0] if self.samplers else None
        if any(self.logits_processors) or any(s is not sampler for s in self.samplers):
            self._next_logprobs = list(self._next_logprobs)  # the library's step wants a list
            return super()._step()
        self._current_tokens = inputs = self._next_tokens
        self._current_logprobs = self._next_logprobs
        with shared_positions(self.prompt_cache):  # its layers' rows sit at the same positions
            logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        if not skipped_here():
            logits = normalized(logits)
        self._next_tokens = (sampler or self.fallback_sampler)(logits)  # one call, as the library's
        self._next_logprobs = Rows(logits)
        mx.async_eval(self._next_tokens, logits)  # type: ignore[no-untyped-call]  # (MLX's stub leaves it unannotated)
        mx.eval(inputs, _arrays(self._current_logprobs))
        tokens = cast("list[int]", inputs.tolist())  # (a row's input: a token id)
        for sti, ti in zip(self.tokens, tokens):
            sti.append(ti)
        return tokens, self._current_logprobs

    def next(self) -> list[GenerationBatch.Response | Running]:  # type: ignore[override]  # (a running row's: a Running)
        if not self.uids:
            return []
        tokens, logprobs = self._step()
        responses: list[GenerationBatch.Response | Running]
        keep, responses = [], []
        for i, uid in enumerate(self.uids):
            n = self._num_tokens[i] = self._num_tokens[i] + 1
            finish = "length" if n >= self.max_tokens[i] else None
            if self._matchers[i].advance(tokens[i]):
                finish = "stop"
            if finish is None:
                keep.append(i)
                responses.append(Running(uid, tokens[i], logprobs, i))
            else:
                responses.append(
                    self.Response(
                        uid=uid,
                        token=tokens[i],
                        logprobs=logprobs[i],
                        finish_reason=finish,
                        prompt_cache=self.extract_cache(i),
                        all_tokens=self.tokens[i],
                    )
                )
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses

    def filter(self, keep: list[int]) -> None:
        rows = self._next_logprobs
        if isinstance(rows, Rows):  # the library's filter picks from a list: indices, not slices
            self._next_logprobs = range(len(rows))  # type: ignore[assignment]  # (in this call only)
        with one_eval(self.prompt_cache):  # the rows that move, every layer's in one eval
            super().filter(keep)
        if isinstance(rows, Rows):
            self._next_logprobs = rows.take(cast("list[int]", self._next_logprobs))  # (the range, filtered)

    def extend(self, batch: GenerationBatch) -> None:
        with one_eval(self.prompt_cache):  # the joining rows' K/V, every layer's in one eval
            super().extend(batch)  # type: ignore[no-untyped-call]  # (mlx-lm leaves it unannotated)
