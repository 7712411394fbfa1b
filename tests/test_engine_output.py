"""The engine's output thread (core.engine.output) on its own: calls run in the order they
were added, in that thread, one outbox flush per batch; before it starts and once it has
stopped, in the caller's thread; a call that raises leaves the ones after it alone."""

from __future__ import annotations

import threading

from radixchat.core.engine.output import OutputThread


class Box:
    def __init__(self):
        self.flushes: list[str] = []

    def flush(self):
        self.flushes.append(threading.current_thread().name)


def test_calls_run_in_order_in_the_output_thread_and_in_the_caller_around_it():
    box = Box()
    out = OutputThread(box)
    seen = []
    here = threading.current_thread().name

    def note(i):
        seen.append((i, threading.current_thread().name))

    def boom():
        raise RuntimeError("one request's text failed")

    out.add(note, 0)  # not started yet: the caller runs it
    out.send()
    assert seen == [(0, here)] and box.flushes == [here]
    out.start()
    for i in range(1, 60):
        out.add(note, i)
        if i == 30:
            out.add(boom)
        if i % 7 == 0:
            out.send()
    out.stop()  # sends the rest first
    assert [i for i, _ in seen] == list(range(60))
    assert {name for _, name in seen[1:]} == {"radixchat-output"}
    assert "radixchat-output" in box.flushes and len(box.flushes) <= 1 + 60 // 7 + 1
    out.add(note, 60)  # stopped: the caller runs it (an engine's last words)
    out.send()
    assert seen[-1] == (60, here)
    out.send()  # nothing added: nothing to run, no flush
    assert box.flushes[-1] == here and box.flushes.count(here) == 2
