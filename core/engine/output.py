"""The engine's output thread: a step's tokens become text and events beside the next step.

Detokenizing, building each request's events and handing them to the callers' event loops
is pure Python that the next step does not wait for, so it need not sit on the engine
thread's path between two steps. The engine thread gathers what a step has to say as calls
(`add`: a function and its arguments, in order) and hands them over once per step (`send`,
where the loop flushed the outbox before); this thread runs them in that order and then
flushes the outbox: one wake-up of each event loop per step, as before. Between steps the
engine thread mostly waits on MLX with the GIL released (`mx.async_eval` and `mx.eval` let
it go), and that is when this thread runs (loadtests/bench_host measures what it moves).

One queue keeps each request's events in the engine's order: its text, then its end. What
the engine itself must know at once stays on the engine thread (core.engine.emit: a request
with stop strings, whose text decides when it ends, or with log-probabilities, which need
MLX); its events come through here all the same, so they stay in order with the others.

Nothing here runs MLX. `add` and `send` are called by the engine thread, and by a sharded
engine's watchdog when it fails everything (core.engine.shard.recorder._fatal), hence the lock;
the calls run in this thread, or in the caller's once it has stopped (`send` after `stop`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVarTuple

from radixchat.core.seam.handle import Outbox

log = logging.getLogger("radixchat.engine")

# The engine thread gives up the GIL during every MLX evaluation and wants it back at once:
# with Python's default 5 ms switch interval it waits behind whichever thread holds it (the
# HTTP server's event loop, the output thread), which slowed every decode step under load.
# A process that runs an engine sets this (`radixchat serve`, `worker`, the benchmarks).
SWITCH_INTERVAL_S = 0.0005

Ts = TypeVarTuple("Ts")
_Call = tuple[Callable[..., object], tuple[Any, ...]]  # a function and its arguments


class OutputThread:
    def __init__(self, outbox: Outbox):
        self._outbox = outbox
        self._pending: list[_Call] = []
        self._lock = threading.Lock()
        self._q: queue.SimpleQueue[list[_Call] | None] = queue.SimpleQueue()
        self._open = False  # the thread takes what is sent (between `start` and `stop`)
        self._thread = threading.Thread(target=self._run, name="radixchat-output", daemon=True)

    def start(self) -> None:
        with self._lock:
            self._open = True
        self._thread.start()

    def add(self, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        """Run fn(*args) in the output thread, after what was added before it."""
        with self._lock:
            self._pending.append((fn, args))

    def send(self) -> None:
        """Hand over what was added since the last send (once per engine step)."""
        with self._lock:
            calls, self._pending = self._pending, []
            if calls and self._open:  # under the lock: before `stop`'s end marker, never after it
                self._q.put(calls)
                return
        if calls:  # not started, or stopped: the caller runs them (an engine's last words)
            self._run_calls(calls)

    def stop(self, timeout: float = 30.0) -> None:
        """Run what was sent, then end the thread (the engine thread, as it ends)."""
        self.send()
        with self._lock:
            if not self._open:
                return
            self._open = False
            self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            calls = self._q.get()
            if calls is None:
                return
            stop = False
            while True:  # what piled up while this thread waited goes in one flush
                try:
                    more = self._q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                calls.extend(more)
            self._run_calls(calls)
            if stop:
                return

    def _run_calls(self, calls: list[_Call]) -> None:
        for fn, args in calls:
            try:
                fn(*args)
            except Exception:  # each call guards its own request; this keeps the thread alive
                log.exception("engine output failed")
        self._outbox.flush()
