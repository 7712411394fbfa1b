"""The engine thread's scheduling cost per turn under a flood: `FairQueue.pick` and
`admission.choose` with many requests waiting, on plain objects (no model, no MLX).

The engine asks admission every turn while anything waits, so under a flood its cost is
paid every step: hundreds of requests waiting while the batch is full (each turn turns
them all away) or while it has room for many. Each case is timed over --repeats fresh
queues (their making not timed); printed: the median ms of one call. Compare two versions
of the code by running this on each (a git worktree).

    python -m loadtests.bench_admission [--waiting 1024] [--owners 64] [--running 32] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from radixchat.core.engine.sched.admission import choose
from radixchat.core.engine.sched.fairness import FairQueue


@dataclass
class Req:
    owner: int
    tokens: int
    prefilled: bool = True
    done: bool = False


def size(r: Req) -> int:
    return r.tokens


def cost(rows: int, longest: int) -> int:
    """The engine's shape of cost: every row padded to the longest (core.engine.sched.preempt)."""
    return rows * longest


def queue(waiting: int, owners: int) -> FairQueue:
    fair = FairQueue()
    for i in range(waiting):
        fair.push(Req(i % owners, 300 + i % 200))
    return fair


def admitting(running: list[Req], room: int):
    """One turn's `choose` over a queue, with `room` for the batch."""
    return lambda fair: choose(
        fair,
        running,
        max_batch=256,
        max_prefill_batch=32,
        room=room,
        size=size,
        cost=cost,
        blocked=lambda r, p: False,
    )


def timed(call, fresh, repeats: int) -> float:
    """The median ms of `call` on a `fresh()` queue each time (its making is not timed)."""
    times = []
    for _ in range(repeats):
        fair = fresh()
        t = time.perf_counter()
        call(fair)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--waiting", type=int, default=1024)
    p.add_argument("--owners", type=int, default=64)
    p.add_argument("--running", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    running = [Req(i, 400) for i in range(a.running)]
    room = cost(len(running), 400) + 1  # full: the first waiting request does not fit
    cases = {
        "pick, every request blocked": lambda fair: fair.pick(256, lambda r, p: True),
        "pick, 256 slots free": lambda fair: fair.pick(256, lambda r, p: False),
        "choose, the batch full": admitting(running, room),
        "choose, room for all": admitting(running, 10**12),
    }
    print(f"{a.waiting} waiting of {a.owners} owners, {a.running} running; median of {a.repeats}, ms a call")
    print("| case | ms |")
    print("|---|---|")
    for name, call in cases.items():
        print(f"| {name} | {timed(call, lambda: queue(a.waiting, a.owners), a.repeats):.2f} |")


if __name__ == "__main__":
    main()
