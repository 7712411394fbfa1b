"""Where a newcomer's first token goes while one user floods: engine step times by kind.

In-process engine (no HTTP): user A keeps --flood requests going (each a seed-scenario system
prompt and a numbered question, --flood-tokens long, ignore_eos, sent again as soon as it
ends), so A's requests keep joining and leaving the batch; user B sends --turns short turns
one at a time. Prints B's queue time (submit to the start of the step that prefills it) and time to first
token, and the engine's step times split by what the step did: decode only, a prefill (a
prompt joining the batch), a request leaving, or both. mlx-lm's batched cache pads every row
to the longest and copies the whole batch when a row joins: this shows what that costs.
Wraps the generator's `next` to time it (engine thread; appending to a list is safe there).

    python -m loadtests.bench_churn [--model tiny] [--flood 32] [--set kv_slots=false]
"""

from __future__ import annotations

import argparse
import random
import threading
import time

from loadtests.benchmodel import add_model_args, resolve_model
from loadtests.figures import pct
from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest

PROMPTS = assets.prompts()
SYSTEMS = [s["text"] for s in PROMPTS["system_prompts"]]
QUESTIONS = PROMPTS["questions"]


def turn(owner: str, tag: str, rng: random.Random, max_tokens: int, ignore_eos: bool) -> ChatRequest:
    return ChatRequest(
        owner=owner,
        messages=[
            {"role": "system", "content": rng.choice(SYSTEMS)},
            {"role": "user", "content": f"[{tag}] {rng.choice(QUESTIONS)}"},
        ],
        sampling={"max_tokens": max_tokens, "ignore_eos": ignore_eos, "temperature": 0},
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--flood", type=int, default=32, help="A's requests in flight")
    p.add_argument("--flood-tokens", type=int, default=64)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--think", type=float, default=0.3)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an engine setting, e.g. --set kv_slots=false (repeatable)",
    )
    args = p.parse_args()
    reexec_with_openblas("auto")

    from radixchat.core.engine.engine import Engine

    model = resolve_model(args)
    extra = dict(kv.split("=", 1) for kv in args.set)
    eng = Engine(Settings(model=model, max_user_requests=max(32, args.flood), **extra)).start()
    print(
        f"model {model}; blas {active_blas()}; A: {args.flood} in flight, {args.flood_tokens} tokens each; "
        f"settings {extra or 'default'}"
    )
    steps: list[tuple[float, int, int]] = []  # (seconds, requests that left, prompt tokens)
    gen = eng._gen
    plain_next = gen.next

    def timed_next():
        before = gen._counters.prompt_tokens
        t = time.perf_counter()
        out = plain_next()
        steps.append(
            (
                time.perf_counter() - t,
                sum(r.finish_reason is not None for r in out[1]),
                gen._counters.prompt_tokens - before,
            )
        )
        return out

    gen.next = timed_next
    stop = threading.Event()

    def flood(w: int) -> None:
        rng = random.Random(w)
        for n in range(10**9):
            if stop.is_set():
                return
            eng.submit(turn("A", f"A{w}-{n}", rng, args.flood_tokens, True)).result()

    workers = [threading.Thread(target=flood, args=(w,), daemon=True) for w in range(args.flood)]
    for w in workers:
        w.start()
    time.sleep(3)
    first = len(steps)
    rng = random.Random(1)
    queue_ms, ttft_ms = [], []
    for i in range(args.turns):
        final = eng.submit(turn("B", f"B{i}", rng, 4, False)).result()
        queue_ms.append(final.usage.queue_ms)
        ttft_ms.append(final.usage.ttft_ms)
        time.sleep(args.think)
    stop.set()
    measured = steps[first:]
    print(
        f"B ({args.turns} turns): queue p50 {pct(queue_ms, 0.5):.0f} p95 {pct(queue_ms, 0.95):.0f} ms; "
        f"TTFT p50 {pct(ttft_ms, 0.5):.0f} p95 {pct(ttft_ms, 0.95):.0f} ms"
    )
    print(f"{'engine step':>24} {'steps':>6} {'p50 ms':>7} {'p95 ms':>7}")
    kinds = {
        "decode only": lambda left, pre: not left and not pre,
        "a prompt joins": lambda left, pre: not left and pre,
        "a request leaves": lambda left, pre: left and not pre,
        "both": lambda left, pre: left and pre,
    }
    for name, sel in kinds.items():
        d = [s for s, left, pre in measured if sel(left, pre)]
        if d:
            print(f"{name:>24} {len(d):>6} {1e3 * pct(d, 0.5):>7.1f} {1e3 * pct(d, 0.95):>7.1f}")
    eng.stop()


if __name__ == "__main__":
    main()
