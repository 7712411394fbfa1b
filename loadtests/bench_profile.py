"""Where an engine's time goes while chat users keep it busy: a profile of the engine loop.

One in-process engine (no HTTP) on the model, --users threads each holding one seed-scenario
conversation (a system prompt, then --turns questions, the history growing, greedy, --max-tokens
per reply, no think time). The engine thread's wall time is split into:

- prefill chunks: forwards of new prompts' tokens (core.engine.step.stepper._prefill_chunk);
- first tokens: the one-token forward of prompts joining the decoding batch (_start_decoding);
- decode: the batched decode step (mlx-lm's GenerationBatch.next: the forward, sampling, and
  the wait for the previous step's tokens);
- engine rest: everything else in the loop (commands, scheduling, admission and prefix-cache
  lookups, snapshots, text decoding, events to callers);
- commands: taking callers' commands, including the wait for one when nothing runs.

It also prints output tok/s, decode steps and the decoding batch's mean size (whose raw
ceiling loadtests.bench_decode measures). On Linux it first re-executes itself with
OpenBLAS (core.platform.blas).

    python -m loadtests.bench_profile [--model tiny] [--users 32] [--turns 3] [--set cpu_ops=false]
        [--first-token-forward] [--normalize-every-step]
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import defaultdict

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest, Finished

PROMPTS = assets.prompts()


class Clock:
    """Wall seconds per part, measured in the engine thread by wrapping methods."""

    def __init__(self):
        self.parts: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.batch_rows = 0

    def wrap(self, owner, name: str, part: str):
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = real(*args, **kwargs)
            self.parts[part] += time.perf_counter() - t0
            self.calls[part] += result is None or bool(result)  # calls that did something
            return result

        setattr(owner, name, timed)


def run_all(threads: list[threading.Thread]) -> float:
    """Start the users' threads together and wait for every one; the wall seconds it took."""
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def user(engine, rng: random.Random, turns: int, max_tokens: int | dict, out: list) -> None:
    """One conversation, blocking; `max_tokens` a reply's length or the whole sampling."""
    sampling = max_tokens if isinstance(max_tokens, dict) else {"max_tokens": max_tokens}
    messages = [{"role": "system", "content": rng.choice(PROMPTS["system_prompts"])["text"]}]
    for _ in range(turns):
        messages.append({"role": "user", "content": rng.choice(PROMPTS["questions"])})
        final = engine.submit(ChatRequest(messages=list(messages), sampling=sampling)).result()
        if not isinstance(final, Finished):
            raise SystemExit(f"a request failed: {final}")
        out.append(final.usage.generated_tokens)
        messages.append({"role": "assistant", "content": final.text})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an engine setting, e.g. --set cpu_ops=false (repeatable)",
    )
    p.add_argument(
        "--first-token-forward",
        action="store_true",
        help="run a newcomer's last prompt token in a forward of its own, as mlx-lm does "
        "(the stepper's order before it ran that token in the batch's decode)",
    )
    p.add_argument(
        "--normalize-every-step",
        action="store_true",
        help="let the batched step normalize every row's logits, as mlx-lm does (core/engine/step/unnormalized.py off)",
    )
    args = p.parse_args()
    reexec_with_openblas()
    from mlx_lm.generate import GenerationBatch

    from radixchat.core.engine import engine as engine_module
    from radixchat.core.engine.step.stepper import BudgetedBatchGenerator

    if args.normalize_every_step:
        from radixchat.core.engine.step import unnormalized

        unnormalized.use_here = lambda on: None
    if args.first_token_forward:
        BudgetedBatchGenerator._unstepped = lambda self, prompts, last: prompts.generate(last)
    clock = Clock()
    clock.wrap(BudgetedBatchGenerator, "_prefill_chunk", "prefill chunks")
    clock.wrap(BudgetedBatchGenerator, "_start_decoding", "first tokens")
    real_next = GenerationBatch.next

    def decode(self):
        clock.batch_rows += len(self.uids)
        return real_next(self)

    GenerationBatch.next = decode
    clock.wrap(GenerationBatch, "next", "decode")
    clock.wrap(engine_module.Engine, "_drain_commands", "commands (incl. idle)")

    overrides = dict(kv.split("=", 1) for kv in args.set)
    settings = Settings(model=resolve_model(args), **overrides)
    engine = engine_module.Engine(settings).start()
    print(
        f"model {settings.model}; BLAS {active_blas()}; {args.users} users x {args.turns} turns, "
        f"max_tokens {args.max_tokens}; settings {overrides or 'defaults'}"
        f"{'; first-token forward' if args.first_token_forward else ''}"
        f"{'; every step normalized' if args.normalize_every_step else ''}"
    )
    tokens: list[int] = []
    rng = random.Random(args.seed)
    threads = [
        threading.Thread(target=user, args=(engine, random.Random(rng.random()), args.turns, args.max_tokens, tokens))
        for _ in range(args.users)
    ]
    base = dict(clock.parts), dict(clock.calls), clock.batch_rows
    wall = run_all(threads)
    engine.stop()
    parts = {k: v - base[0].get(k, 0.0) for k, v in clock.parts.items()}
    calls = {k: v - base[1].get(k, 0) for k, v in clock.calls.items()}
    steps = calls.get("decode", 0)
    print(
        f"wall {wall:.1f} s; output {sum(tokens)} tokens, {sum(tokens) / wall:.1f} tok/s; "
        f"{steps} decode steps, mean batch {(clock.batch_rows - base[2]) / max(steps, 1):.1f}"
    )
    print("| part | seconds | share of wall | calls | ms per call |")
    print("|---|---|---|---|---|")
    named = ["prefill chunks", "first tokens", "decode", "commands (incl. idle)"]
    for part in named:
        s, n = parts.get(part, 0.0), calls.get(part, 0)
        print(f"| {part} | {s:.1f} | {s / wall:.0%} | {n} | {1000 * s / max(n, 1):.1f} |")
    rest = wall - sum(parts.get(k, 0.0) for k in named)
    print(f"| engine rest | {rest:.1f} | {rest / wall:.0%} | | |")


if __name__ == "__main__":
    main()
