"""A request's preparation before it is queued: the cheap bounds checked first, then its
templating (or tokenizing) and grammar compiling in a small pool of threads shared fairly
by user.

Preparation costs CPU the batch needs: a long conversation's chat template takes tens of
milliseconds, a body near the size limit seconds of tokenizing, a large JSON schema a
second of compiling. So `check_bounds` refuses, from sizes alone and without running the
tokenizer or the compiler, a text longer than the context could hold whatever its tokens
and a grammar over the size limit; and `FairPool` runs what is left on a few threads of
its own (never asyncio's default executor, which any library shares), one FIFO queue per
owner, the next job taken from the owner with the fewest jobs started (an owner coming back
from idle starts level with the least served, as the engine's fair queue lifts it). An owner
with nothing running starts at once even when every worker is busy with others' jobs, on a
thread beyond them (`_may_start`): a user whose request arrives behind another user's flood
of slow preparations waits for none of them. Jobs marked `serial`
(those that hold the tokenizer's lock) run one at a time, so a worker never sits blocked
on that lock holding a job while another owner's job could run. Jobs marked `heavy`
(grammar compiles, and the templating or tokenizing of a text of `HEAVY_TEXT_CHARS` or more:
each a core's work for tens of milliseconds) run at most one fewer at
once than there are cores, but for one of each owner with none running, so a flood's
compiles leave the engine's forward a core. And while anyone else is at work (`others`:
core.engine.sched.owners), an owner's heavy jobs fill at most `HEAVY_SHARE` of the time: after
one that took d seconds, their next starts no sooner than 2d after it ended. A spare core is
not there when other programs hold the machine's cores, and a compile beside another user's
step then slows that step, however short it is (under a flood of distinct 64 KB regex schemas
with two CPU-bound processes beside the server, a compile ran in every one of alice's slow
first steps; BENCHMARKS.md, Fairness). The user who sends them waits for their own compiles.
A long text's job also holds the tokenizer's lock, which every other user's templating
needs: paced, it holds it at most a third of the time.

Left to others: what a job does (core.engine.intake templates, tokenizes and compiles), the
per-user and queue limits (Intake counts a request before it reaches this pool).
Threads: `submit` and `check_bounds` run in any caller's thread; the pool's workers
(`radixchat-prepare-N`) run the jobs, start when work comes and end after IDLE_S with
nothing queued, so an engine that is not serving holds no thread. No MLX here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar, TypeVarTuple

from radixchat.core.seam.requests import ChatRequest, PromptRequest, RequestError

IDLE_S = 5.0  # a worker with nothing to do for this long ends (the next job starts one)
HEAVY_SHARE = 1 / 3  # of the time, what an owner's heavy jobs may fill while others are at work
# characters of text whose templating or tokenizing is a heavy job (SmolLM2's tokenizer: ~1 us
# a character; 100,000-character /v1/messages/count_tokens floods held its lock back to back)
HEAVY_TEXT_CHARS = 20_000

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


@dataclass
class _Job:
    owner: Hashable
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    serial: bool
    heavy: bool = False


def _room_for(running: Counter[Hashable], owner: Hashable, limit: int) -> bool:
    """Is there room for one more of `owner`'s jobs among those `running` (by owner)? Below
    `limit` in all, yes; beyond it, only for an owner with none running, up to twice `limit`."""
    total = sum(running.values())
    return total < limit or (running[owner] == 0 and total < 2 * limit)


class FairPool:
    """Up to `workers` jobs running at once (and, beyond them, one each of owners with nothing
    else running, up to as many again), each owner's in the order given. The next job
    is the one of the owner with the fewest jobs started so far; an owner who had nothing
    queued or running comes in at the lowest count of those who have (no credit saved up
    while away, as the engine's fair queue does it), and wins ties with owners already
    served, so a newcomer's job is next once a worker is free."""

    def __init__(
        self,
        workers: int,
        name: str = "radixchat-prepare",
        heavy: int | None = None,
        others: Callable[[Hashable], bool] | None = None,
    ):
        self.workers = workers
        self._others = others  # is anyone but this owner at work? (None: never paced)
        self._rest: dict[Hashable, float] = {}  # owner -> when their next heavy job may start (monotonic s)
        # heavy jobs (grammar compiles: a core each, GIL released) at once: all cores but one,
        # which the engine's forward keeps (`_may_compile`)
        self.heavy = max(1, (os.cpu_count() or 2) - 1) if heavy is None else heavy
        self._heavy: Counter[Hashable] = Counter()  # heavy jobs running, by owner
        self._name = name
        self._cond = threading.Condition()
        self._queues: dict[Hashable, deque[_Job]] = {}  # owners with jobs queued
        # the owners with jobs queued or running only: an idle owner is forgotten
        self._served: dict[Hashable, int] = {}  # jobs started
        self._last: dict[Hashable, int] = {}  # when its last job started (-1: none yet)
        self._running: Counter[Hashable] = Counter()
        self._turns = itertools.count()
        self._threads = 0
        self._started = 0
        self._serial_busy = False

    def submit(
        self,
        owner: Hashable,
        fn: Callable[[*Ts], T],
        *args: *Ts,
        serial: bool = False,
        heavy: bool = False,
    ) -> Future[T]:
        """Queue `fn(*args)` as one of `owner`'s jobs; its future holds the answer. Cancelling
        the future before a worker takes the job means it never runs. `heavy`: it keeps a core
        busy for long (`_may_compile`)."""
        job = _Job(owner, Future(), fn, args, serial, heavy)
        with self._cond:
            if owner not in self._served:
                self._served[owner] = min(self._served.values(), default=0)
                self._last[owner] = -1
            self._queues.setdefault(owner, deque()).append(job)
            idle = self._threads - sum(self._running.values())
            if self._threads < self.workers or (
                idle <= 0 and self._threads < 2 * self.workers and self._may_start(owner)
            ):
                self._threads += 1
                self._started += 1
                name = f"{self._name}-{self._started}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
            self._cond.notify()
        return job.future

    def _take(self) -> _Job | None:
        """The next job to run (with the lock held), of the least-served owner whose next
        job can run now: a serial job waits while another serial job runs."""
        while True:
            ready = [
                o
                for o, jobs in self._queues.items()
                if not (jobs[0].serial and self._serial_busy)
                and not (jobs[0].heavy and not (self._may_compile(o) and self._rested(o)))
                and self._may_start(o)
            ]
            if not ready:
                return None
            owner = min(ready, key=lambda o: (self._served[o], self._last[o]))
            jobs = self._queues[owner]
            job = jobs.popleft()
            if not jobs:
                del self._queues[owner]
            if job.future.set_running_or_notify_cancel():
                self._served[owner] += 1
                self._last[owner] = next(self._turns)
                self._running[owner] += 1
                self._heavy[owner] += job.heavy
                self._serial_busy |= job.serial
                return job
            self._forget_if_idle(owner)  # its caller gave up while it waited: nothing to run

    def _may_start(self, owner: Hashable) -> bool:
        """May a job of `owner` start now (the lock held)? While fewer than `workers` jobs
        run, any; beyond that, only one of an owner with nothing running, on a thread beyond
        `workers` (at most as many again): a flood's slow jobs (a 64 KB regex schema
        compiles in ~155 ms here) hold every worker, and a newcomer's short templating
        waited for one of them to end."""
        return _room_for(self._running, owner, self.workers)

    def _may_compile(self, owner: Hashable) -> bool:
        """May a heavy job of `owner` start now (the lock held)? While fewer than `heavy` run,
        any; beyond that, only one of an owner with none running (up to as many again). Under
        a flood of 64 KB regex schemas on 2 cores, two of a user's compiles at once beside the
        forward made 11-18 of the engine's steps in 50 s take over 200 ms, one at a time 2-5
        (alice's first token p95 0.19-0.30 s against 0.16-0.23 s)."""
        return _room_for(self._heavy, owner, self.heavy)

    def _rested(self, owner: Hashable) -> bool:
        """Is `owner`'s rest after their last heavy job over, or nobody else at work (the
        lock held)? Kept when the owner goes idle: a flood that sends its next request the
        moment one ends would otherwise never rest."""
        until = self._rest.get(owner)
        if until is None:
            return True
        if time.monotonic() >= until:
            del self._rest[owner]
            return True
        return self._others is None or not self._others(owner)

    def _forget_if_idle(self, owner: Hashable) -> None:
        if owner not in self._queues and not self._running[owner]:
            del self._served[owner], self._last[owner], self._running[owner], self._heavy[owner]

    def _next(self) -> _Job | None:
        """Wait for a job this worker may run; None when it should end (idle too long)."""
        with self._cond:
            while (job := self._take()) is None:
                # a heavy job resting wakes a worker when its rest ends
                resting = [self._rest[o] for o in self._queues if o in self._rest]
                wait = min(resting, default=time.monotonic() + IDLE_S) - time.monotonic()
                if not self._cond.wait(max(wait, 0.001)) and not self._queues:
                    # ended under the lock: a job queued after this sees one thread fewer
                    self._threads -= 1
                    return None
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            started = time.monotonic()
            try:
                job.future.set_result(job.fn(*job.args))
            except BaseException as e:  # the caller's to handle: it waits on the future
                job.future.set_exception(e)
            finally:
                with self._cond:
                    if job.heavy:  # the rest is charged whatever the job came to (a refused schema too)
                        now = time.monotonic()
                        rest = now + (now - started) * (1 / HEAVY_SHARE - 1)
                        self._rest[job.owner] = max(self._rest.get(job.owner, 0.0), rest)
                        for o in [o for o, t in self._rest.items() if t <= now]:
                            del self._rest[o]
                    self._running[job.owner] -= 1
                    self._heavy[job.owner] -= job.heavy
                    self._forget_if_idle(job.owner)
                    if job.serial:
                        self._serial_busy = False
                    if job.serial or job.heavy:
                        self._cond.notify_all()  # serial or heavy jobs that waited may run now
                job = None  # hold nothing of a request (or its engine) between jobs


def wait(futures: list[Future[Any]]) -> list[Any]:
    """The jobs' answers, for a caller that blocks; the first failure is raised, and the jobs
    not started yet are dropped."""
    try:
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        failed = [e for f in done if (e := f.exception()) is not None]
        if failed:  # without waiting for the others: their answers are not needed now
            raise failed[0]
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()


async def await_all(futures: list[Future[Any]]) -> list[Any]:
    """`wait` for asyncio callers: the loop is free meanwhile, and a caller cancelled while
    its jobs wait in the pool (a client that hung up) takes them out of the queue."""
    try:
        return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    finally:
        for f in futures:
            f.cancel()


def text_chars(request: ChatRequest | PromptRequest) -> int:
    """The characters of a request's text, as few as any rendering of it holds: each
    message's content, and the tools and tool calls its chat template renders (as compact
    JSON, the shortest form a template writes them in)."""
    if isinstance(request, PromptRequest):
        return len(request.prompt)
    n = sum(len(m.content) for m in request.messages)
    structured = [m.tool_calls for m in request.messages if m.tool_calls]
    if request.tools:
        structured.append(request.tools)
    return n + (len(json.dumps(structured, separators=(",", ":"))) if structured else 0)


def long_text(chars: int) -> bool:
    """Is templating or tokenizing a text of `chars` characters (`text_chars`) a heavy job?"""
    return chars >= HEAVY_TEXT_CHARS


def check_bounds(
    request: ChatRequest | PromptRequest, chars: int, context_length: int, max_token_chars: int, max_schema_bytes: int
) -> None:
    """Refuse, from sizes alone (no tokenizer, no compiler), a request whose text (`chars`
    characters: `text_chars`) is longer than `context_length` tokens of at most
    `max_token_chars` characters each could be, or whose grammar is over `max_schema_bytes`.
    Raises RequestError."""
    if max_token_chars > 0:
        most = context_length * max_token_chars
        if chars > most:
            # OpenAI's wording, as for a count of tokens: clients recognise an overflow by it
            raise RequestError(
                f"This model's maximum context length is {context_length} tokens. However, your "
                f"messages are {chars:,} characters long, more than {context_length} tokens can "
                f"hold ({most:,} characters at most). Please reduce the length of the messages.",
                413,
                "context_length_exceeded",
            )
    sampling = request.sampling
    if sampling.json_schema is not None:
        what, size = "response_format: the JSON schema", len(json.dumps(sampling.json_schema))
    elif sampling.lark is not None:
        what, size = "tools: the forced tool call's grammar", len(sampling.lark.encode())
    else:
        return
    if size > max_schema_bytes:
        raise RequestError(
            f"{what} is {size:,} bytes, over this server's limit of {max_schema_bytes:,} bytes (--max-schema-bytes)",
            400,
            "schema_too_large",
        )
