"""The line in front of sign-in hashing: fair by client address, bounded, trusted browsers first.

A password check costs one scrypt (~0.4 s of one core) and runs on `workers` threads (one by
default, at the lowest CPU priority where the system allows it for a thread) so that a crowd
of sign-ins cannot take the engine's cores. First come first served made a crowd's cost
everyone's: 300 wrong sign-ins queued ahead of alice made her wait 300 hashes. `FairQueue` serves lanes instead of arrivals: each attempt waits in the lane of where
it came from (a client address, an IPv6 /64; or, for a browser holding a valid device cookie,
its user's lane), and lanes take turns (start-time fair queueing, every hash costing 1): a
newcomer is served within about one hash per lane that has attempts waiting, whatever those
lanes have queued, and a lane that keeps refilling itself gets no more than its turn. At equal
turns a trusted attempt goes first, so alice signing in from a browser she used before waits
for the hash in progress and little else. Memory is bounded: `per_lane` attempts per lane and
`total` in all; when the whole queue is full a newcomer takes the place of the newest attempt
of the longest lane, unless its own lane is that long (`QueueFull` to whoever loses).

`HashingLine` puts the queue in front of the threads: attempts are handed over one at a time
as a thread frees, so the order is decided at the last moment. Its methods run on the event
loop (the queue needs no lock); the hashing runs in its threads. What is hashed and what a
failure counts against is webui/auth/signin.py's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import ipaddress
import math
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")


class SignInRefused(Exception):
    """A sign-in answered 429 without its password being checked."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(SignInRefused):
    def __init__(self, whole: bool, retry_after_s: float = 2.0):
        where = "on this server" if whole else "from this address"
        super().__init__(f"too many sign-ins waiting {where}: try again in {math.ceil(retry_after_s)} s", retry_after_s)


def address_lane(addr: str) -> str:
    """The lane of a client address: the address itself, or its /64 for IPv6, which one host
    usually holds whole (so it cannot take a lane per address of it)."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass(order=True)
class _Turn:
    start: int  # the lane's turn: its virtual start time
    untrusted: int  # 0 sorts first: at equal turns a trusted attempt goes ahead
    seq: int  # then arrival order
    lane: Hashable = field(compare=False)
    item: Any = field(compare=False)


@dataclass
class _Lane:
    waiting: deque[_Turn] = field(default_factory=deque)
    finish: int = 0  # the turn after its last attempt's


class FairQueue:
    """Lanes served in turn (see the module's docstring). Not thread-safe: one thread uses it."""

    def __init__(self, per_lane: int = 64, total: int = 10_000):
        self.per_lane, self.total = per_lane, total
        self._lanes: dict[Hashable, _Lane] = {}
        self._heads: list[_Turn] = []  # each waiting lane's first attempt; stale entries skipped
        self._now = 0  # the turn of the attempt served last
        self._seq = 0
        self._size = 0
        self._sweep_at = 64  # lanes in the table when idle ones are next looked for

    def __len__(self) -> int:
        return self._size

    def push(self, lane: Hashable, item: Any, trusted: bool = False) -> list[Any]:
        """Queue `item` in `lane`. Returns the items pushed out to make room (their callers
        are to be refused); raises QueueFull when `item` itself cannot wait."""
        entry = self._lanes.get(lane)
        if entry is not None and len(entry.waiting) >= self.per_lane:
            raise QueueFull(whole=False)
        pushed_out = []
        if self._size >= self.total:
            pushed_out.append(self._push_out(len(entry.waiting) if entry else 0))
        if entry is None:
            entry = self._lanes[lane] = _Lane(finish=self._now)
        turn = _Turn(max(self._now, entry.finish), 0 if trusted else 1, self._seq, lane, item)
        self._seq += 1
        entry.finish = turn.start + 1
        entry.waiting.append(turn)
        self._size += 1
        if len(entry.waiting) == 1:
            heapq.heappush(self._heads, turn)
        return pushed_out

    def pop(self) -> Any | None:
        """The next item to serve (None when nothing waits)."""
        while self._heads:
            turn = heapq.heappop(self._heads)
            entry = self._lanes.get(turn.lane)
            if entry is None or not entry.waiting or entry.waiting[0] is not turn:
                continue  # not its lane's head (defensive: a lane keeps one entry here)
            entry.waiting.popleft()
            self._size -= 1
            self._now = turn.start
            if entry.waiting:
                heapq.heappush(self._heads, entry.waiting[0])
            self._forget_idle()
            return turn.item
        return None

    def _push_out(self, own: int) -> Any:
        """Room for one more: the newest attempt of the longest lane goes, unless the
        newcomer's own lane would be as long (then the newcomer is refused)."""
        _, longest = max(self._lanes.items(), key=lambda kv: len(kv[1].waiting))
        if len(longest.waiting) <= own + 1:
            raise QueueFull(whole=True)
        turn = longest.waiting.pop()
        self._size -= 1
        longest.finish = turn.start  # its turn is given back
        return turn.item

    def _forget_idle(self) -> None:
        """Lanes with nothing waiting are kept only while their turn is ahead of the clock
        (a lane that refills at once must not start a fresh turn); the rest go, so the table
        stays about as big as what waits and was served last."""
        if len(self._lanes) < self._sweep_at:
            return
        for lane in [k for k, v in self._lanes.items() if not v.waiting and v.finish <= self._now]:
            del self._lanes[lane]
        self._sweep_at = 2 * len(self._lanes) + 64  # a sweep per as many new lanes: O(1) each


def lowest_priority() -> None:
    """This thread at the lowest CPU priority (nice 19), where the system can set it for one
    thread (Linux: a thread is a task of its own): hashing takes the cores only when the
    engine and the event loop leave them idle. Elsewhere (macOS) it runs as it was."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class HashingLine:
    """`FairQueue` in front of `workers` hashing threads (see the module's docstring)."""

    def __init__(self, workers: int = 1, per_lane: int = 64, total: int = 10_000):
        self.queue = FairQueue(per_lane, total)
        self._workers = workers
        self._busy = 0
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="radixchat-signin", initializer=lowest_priority
        )
        self.refused = 0  # attempts refused for want of room

    async def run(self, lane: Hashable, fn: Callable[[], _T], trusted: bool = False) -> _T:
        """fn() in a hashing thread once `lane`'s turn comes; QueueFull if it cannot wait."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_T] = loop.create_future()
        try:
            pushed_out = self.queue.push(lane, (fn, done), trusted)
        except QueueFull:
            self.refused += 1
            raise
        for _, other in pushed_out:
            self.refused += 1
            if not other.done():
                other.set_exception(QueueFull(whole=True))
        self._hand_over(loop)
        return await done  # cancelled (the client went away): skipped when its turn comes

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._busy < self._workers:
            item = self.queue.pop()
            if item is None:
                return
            fn, done = item
            if done.done():
                continue
            self._busy += 1
            job = self._pool.submit(fn)
            job.add_done_callback(functools.partial(self._when_done, loop, done))

    def _when_done(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any], job: Future[Any]) -> None:
        """A job ended, in the pool's thread: its end is the event loop's to handle."""
        _call_soon(loop, self._finished, loop, job, done)

    def _finished(self, loop: asyncio.AbstractEventLoop, job: Future[Any], done: asyncio.Future[Any]) -> None:
        self._busy -= 1
        if not done.done():
            if job.cancelled():
                done.cancel()
            elif (error := job.exception()) is not None:
                done.set_exception(error)
            else:
                done.set_result(job.result())
        self._hand_over(loop)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed while the hash ran: nobody waits for it any more
        pass
