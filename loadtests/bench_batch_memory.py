"""Benchmark what the decoding batch's K/V buffers hold against the room the engine admits by.

Runs an in-process engine on a random model (tests/support/randmodel.py, 4096-token context)
whose K/V budget gives the running batch --room tokens, and --users closed-loop users, each
sending --turns prompts of mixed lengths (60 to 800 tokens, --max-tokens each). A sampler
thread reads, every 2 ms, what the batch holds: each row's own tokens (their sum), the rows
padded to the longest (what admission and preemption count, core.cache.batch.layout), and the token
slots of the slot buffers themselves (rows and columns, spare room included). Prints the most
and the mean of each, as multiples of the room, and the engine's steps and preemptions.

What this owns: the measurement. The engine is the project's; tokens, not bytes, so the
figures hold for any model's bytes per token.

    python -m loadtests.bench_batch_memory [--users 32] [--turns 3] [--room 8738] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path

from radixchat.core.cache.batch.layout import BATCH_SHARE
from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.seam.requests import Sampling
from tests.support.randmodel import build_random_model

LENGTHS = (60, 120, 200, 300, 500, 800)


def buffer_slots(eng: Engine) -> int:
    """Rows x columns of the decoding batch's first layer's buffers (0 when there is none)."""
    batch = getattr(eng._gen, "_generation_batch", None)
    caches = getattr(batch, "prompt_cache", None) if batch is not None else None
    if not caches:
        return 0
    k = getattr(caches[0], "_k", None)
    k = caches[0].keys if k is None else k
    return 0 if k is None else k.shape[0] * k.shape[2]


def sample(eng: Engine, stop: threading.Event, seen: dict) -> None:
    while not stop.is_set():
        held = [len(a.prompt) + a.generated for a in list(eng._by_uid.values())]
        now = {"own": sum(held), "padded": len(held) * max(held, default=0), "buffers": buffer_slots(eng)}
        for k, v in now.items():
            seen[k] = max(seen.get(k, 0), v)
            seen[k + " sum"] = seen.get(k + " sum", 0) + v
        seen["n"] = seen.get("n", 0) + 1
        time.sleep(0.002)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--room", type=int, default=8738, help="tokens the running batch may hold")
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args()
    model = build_random_model(Path(tempfile.mkdtemp()) / "model", context=4096)
    probe = Engine(Settings(model=str(model), cache_bytes=1 << 30)).start(timeout=120)
    bpt = probe.kv_bytes_per_token
    probe.stop()
    budget = int(args.room * bpt / BATCH_SHARE) + bpt
    eng = Engine(Settings(model=str(model), cache_bytes=budget, max_batch=32, max_tokens=args.max_tokens))
    eng.start(timeout=120)

    def user(i: int) -> None:
        rng = random.Random(i)
        for _ in range(args.turns):
            prompt = [rng.randrange(5, 400) for _ in range(rng.choice(LENGTHS))]
            eng.submit_tokens(prompt, Sampling(max_tokens=args.max_tokens, ignore_eos=True), owner=f"u{i}").result()

    stop, seen = threading.Event(), {}
    sampler = threading.Thread(target=sample, args=(eng, stop, seen))
    sampler.start()
    t0 = time.time()
    users = [threading.Thread(target=user, args=(i,)) for i in range(args.users)]
    for u in users:
        u.start()
    for u in users:
        u.join()
    stop.set()
    sampler.join()
    room = eng.stats().batch_tokens
    print(
        f"{args.users} users x {args.turns} turns, room {room} tokens, {eng.steps} steps, "
        f"{eng.stats().preemptions} preemptions, {time.time() - t0:.1f} s"
    )
    for k, what in (("own", "rows' own tokens"), ("padded", "rows padded to the longest"), ("buffers", "slot buffers")):
        mean = seen[k + " sum"] / max(1, seen["n"])
        print(f"  {what:28s} most {seen[k]:7d} ({seen[k] / room:.2f}x room)  mean {mean:8.0f} ({mean / room:.2f}x)")
    eng.stop()


if __name__ == "__main__":
    main()
