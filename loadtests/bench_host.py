"""Where a short step's time goes: the engine thread's wall time per decode step, split into
waiting on MLX and the engine's own (host) work by part, at several numbers of users.

One in-process engine (no HTTP) on a fast model (default: the bundled tiny model; a random
one with --random-dim), and for each --users value that many users each holding one
seed-scenario conversation (bench_profile's users: a system prompt, --turns questions,
--max-tokens per reply, greedy unless --temperature, no think time). The users are tasks of
one event loop reading streamed events, as the HTTP server holds its clients (one wake-up of
that loop a step); `--threads` gives each a blocking thread instead, whose wake-up at every
token contends for the GIL with the engine thread. Every function below is wrapped in the
engine thread with an exclusive clock (a part's time excludes the wrapped parts it calls),
so the parts add up to the thread's wall time:

- MLX wait: `mx.eval` (the thread blocked until the device has computed what it asked for);
  mlx-lm's step launches step N+1 before it waits for step N, so this is what the device
  takes beyond the host work it overlaps;
- launch: `mx.async_eval` (handing a step's graph to the device). On this CPU it is device
  time too: MLX's CPU backend lets only a few dozen ops be in flight, so launching a step's
  graph of hundreds of ops runs most of them right there (a graph of 100 sorts: 0.4 s in
  `async_eval`, then 0.06 s in `eval`); a Mac's GPU takes the graph and returns;
- forward graph: the model's Python `__call__` (building the lazy graph of a forward);
- step graph: the rest of the decoding batch's `_step` (logits, sampling, launching:
  core.engine.step.decode_batch, or mlx-lm's `GenerationBatch._step`);
- step rows: the rest of its `next` (per-row counts, stop matchers, responses);
- prefill: the stepper's prefill chunks and joins, less their forward and waits;
- tokens out: `Emit._on_tokens` less what is below (counting, fair share, timing);
- text: `TextStream.add` (detokenizing, stop strings) of the requests whose text the engine
  must see (stop strings, log-probabilities); the others' runs in the output thread;
- finish: `Engine._finish` (leaving the batch, caching the K/V, the final event);
- schedule: `Engine._schedule` (admission, prefix-cache lookups);
- events: handing a step's text and events to the output thread (core.engine.output's
  `send`), and the outbox's flush (waking the callers' loops) where the engine thread runs
  it (once it has stopped; the output thread's own is beside);
- commands: taking callers' commands, including the wait for one when nothing runs;
- engine rest: everything else in the loop.

The host share of a step is the wall less MLX wait, launch and the idle wait for commands,
over the wall: the engine's own work. The output thread's work (each step's text and events,
made while the engine thread waits on MLX for the next) is not in the wall: its own row,
"output thread, beside", says how much it is. Prints one table per model with a column
per --users value (ms per decode step, and the share of the wall). On Linux it first
re-executes itself with OpenBLAS (core.platform.blas). Run it on a quiet machine.

    python -m loadtests.bench_host [--model tiny] [--random-dim 256 --random-layers 8]
        [--users 1,8,32,64] [--turns 2] [--max-tokens 64] [--temperature 0.7 --top-p 0.9]
        [--repetition-penalty 1.1] [--ignore-eos] [--threads] [--rounds 2] [--shapes]

The table's last rows say how many rows the decode steps held on average: at N chat users
they are fewer than N (users between turns or prefilling, greedy replies that end at eos
before --max-tokens); `--ignore-eos` runs every reply to --max-tokens, so 32 users keep a
batch of ~32 rows. `--rounds 2` runs the same conversations again: the second round's
prompts are in the prefix cache, so its steps are shorter and the engine's share of them
larger. `--shapes` counts the decode steps whose batch shape (rows, buffer columns, buffer
rows) had not been seen before.
The process runs as `radixchat serve` does: its GIL switch interval is the server's
(core.engine.output.SWITCH_INTERVAL_S, 0.5 ms), so the engine thread gets the GIL back from the
users' event loop and the output thread as the server's does; `--switch-interval 0.005` is
Python's own (what every figure of this script before 2026-12-04 evening ran with).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from collections import defaultdict

from loadtests.bench_profile import PROMPTS, run_all, user
from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.config import Settings
from radixchat.core.engine.output import SWITCH_INTERVAL_S
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest, Finished

PARTS = [
    "MLX wait",
    "launch",
    "forward graph",
    "step graph",
    "step rows",
    "prefill",
    "tokens out",
    "text",
    "finish",
    "schedule",
    "events",
    "commands (incl. idle)",
]


class ExclusiveClock:
    """Wall seconds per part in one thread, each part's own (nested parts subtracted)."""

    def __init__(self):
        self.parts: dict[str, float] = defaultdict(float)
        self.thread: int | None = None  # the engine thread's ident, once it is seen
        self._stack: list[list[float]] = []  # [start, time in nested parts]
        self.shapes = None  # Shapes, with --shapes
        self.beside = 0.0  # seconds the output thread spent on the steps' text and events
        self.rows = 0  # decoding rows summed over the decode steps (their mean: the batch's size)
        self.decodes = 0

    def wrap(self, owner, name: str, part: str) -> None:
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            if threading.get_ident() != self.thread:
                return real(*args, **kwargs)
            frame = [time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return real(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = time.perf_counter() - frame[0]
                self.parts[part] += spent - frame[1]
                if self._stack:
                    self._stack[-1][1] += spent

        setattr(owner, name, timed)


def instrument(clock: ExclusiveClock, engine) -> None:
    """Wrap the parts (after the engine has loaded its model, whose class is then known)."""
    import mlx.core as mx
    from mlx_lm.generate import GenerationBatch

    from radixchat.core.engine import engine as engine_module
    from radixchat.core.engine.output import OutputThread
    from radixchat.core.engine.step.decode_batch import DecodingBatch
    from radixchat.core.engine.step.stepper import BudgetedBatchGenerator
    from radixchat.core.engine.textstream import TextStream
    from radixchat.core.seam.handle import Outbox

    clock.wrap(mx, "eval", "MLX wait")
    clock.wrap(mx, "async_eval", "launch")
    clock.wrap(type(engine.loaded.model), "__call__", "forward graph")
    clock.wrap(GenerationBatch, "_step", "step graph")
    clock.wrap(GenerationBatch, "next", "step rows")
    clock.wrap(DecodingBatch, "_step", "step graph")  # the engine's decoding batch: its own step
    clock.wrap(DecodingBatch, "next", "step rows")
    count_rows(clock, DecodingBatch)
    clock.wrap(BudgetedBatchGenerator, "_prefill_chunk", "prefill")
    clock.wrap(BudgetedBatchGenerator, "_start_decoding", "prefill")
    clock.wrap(engine_module.Engine, "_on_tokens", "tokens out")
    clock.wrap(TextStream, "add", "text")
    clock.wrap(engine_module.Engine, "_finish", "finish")
    clock.wrap(engine_module.Engine, "_schedule", "schedule")
    clock.wrap(Outbox, "flush", "events")
    clock.wrap(OutputThread, "send", "events")
    clock.wrap(engine_module.Engine, "_drain_commands", "commands (incl. idle)")
    time_output_thread(clock)


def count_rows(clock: ExclusiveClock, batch) -> None:
    """The decoding rows of each decode step: at N users they are fewer than N whenever some
    users are between turns or prefilling, and replies that end early (eos) thin them too."""
    real = batch.next

    def counted(self, *args, **kwargs):
        clock.rows += len(self.uids)
        clock.decodes += bool(self.uids)
        return real(self, *args, **kwargs)

    batch.next = counted


def time_output_thread(clock: ExclusiveClock) -> None:
    from radixchat.core.engine.output import OutputThread

    real = OutputThread._run_calls

    def timed(self, calls):
        t0 = time.perf_counter()
        try:
            return real(self, calls)
        finally:
            clock.beside += time.perf_counter() - t0

    OutputThread._run_calls = timed


async def streaming_user(engine, rng: random.Random, turns: int, sampling: dict, out: list) -> None:
    """bench_profile's user as the HTTP server holds one: a task in the one event loop,
    `asubmit`, and the events read as a streaming reply reads them (`batched`)."""
    messages = [{"role": "system", "content": rng.choice(PROMPTS["system_prompts"])["text"]}]
    for _ in range(turns):
        messages.append({"role": "user", "content": rng.choice(PROMPTS["questions"])})
        handle = await engine.asubmit(ChatRequest(messages=list(messages), sampling=sampling))
        final = None
        async for final in handle.batched():  # noqa: B007 (the last event is the end)
            pass
        if not isinstance(final, Finished):
            raise SystemExit(f"a request failed: {final}")
        out.append(final.usage.generated_tokens)
        messages.append({"role": "assistant", "content": final.text})


def callers(engine, users: int, turns: int, sampling: dict, seed: int, threads: bool, tokens: list) -> float:
    """Run `users` conversations to their end; the wall seconds. By default as the server
    runs them (one event loop); with `threads`, one blocking thread each (bench_profile's
    way), whose per-token wake-ups contend for the GIL with the engine thread."""
    rng = random.Random(seed)
    rngs = [random.Random(rng.random()) for _ in range(users)]
    if threads:
        return run_all([threading.Thread(target=user, args=(engine, r, turns, sampling, tokens)) for r in rngs])

    async def everyone():
        await asyncio.gather(*(streaming_user(engine, r, turns, sampling, tokens) for r in rngs))

    return run_all([threading.Thread(target=asyncio.run, args=(everyone(),))])


class Shapes:
    """The decoding batch's shape at each decode step: (rows, buffer columns, buffer rows) of
    its slot cache (core.cache.batch.slots), what a compiled step would be traced for. `fresh`
    counts the steps (of the run under way: `measure` sets both counts to 0) whose shape had
    not been seen before: each would be a new trace (loadtests/bench_compile --retrace says what one costs)."""

    def __init__(self):
        from mlx_lm.generate import GenerationBatch

        from radixchat.core.cache.batch.slots import SlotKVCache

        self.seen, self.steps, self.fresh = set(), 0, 0
        real = GenerationBatch._step

        def step(gen, *args, **kwargs):
            c = gen.prompt_cache[0] if gen.prompt_cache else None
            if isinstance(c, SlotKVCache) and c._k is not None:
                shape = (len(gen.uids), c._k.shape[2], c._k.shape[0])
                self.steps += 1
                self.fresh += shape not in self.seen
                self.seen.add(shape)
            return real(gen, *args, **kwargs)

        GenerationBatch._step = step


def measure(engine, clock: ExclusiveClock, users: int, turns: int, sampling: dict, seed: int, threads: bool) -> dict:
    before, steps0, beside0 = dict(clock.parts), engine.steps, clock.beside
    rows0, decodes0 = clock.rows, clock.decodes
    if clock.shapes:  # counted per run; the shapes seen stay seen
        clock.shapes.steps = clock.shapes.fresh = 0
    tokens: list[int] = []
    wall = callers(engine, users, turns, sampling, seed, threads, tokens)
    parts = {k: clock.parts.get(k, 0.0) - before.get(k, 0.0) for k in PARTS}
    parts["engine rest"] = wall - sum(parts.values())
    run = {"wall": wall, "steps": engine.steps - steps0, "tokens": sum(tokens), "parts": parts}
    run["beside"] = clock.beside - beside0
    run["rows"] = (clock.rows - rows0) / max(clock.decodes - decodes0, 1)
    if clock.shapes:
        steps, fresh = clock.shapes.steps, clock.shapes.fresh
        run["new shapes"] = f"{fresh} of {steps} ({fresh / max(steps, 1):.0%})"
    return run


def table(runs: dict[int, dict]) -> None:
    cols = list(runs)
    print("| part | " + " | ".join(f"{u}: ms a step (share)" for u in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for part in [*PARTS, "engine rest"]:
        cells = []
        for u in cols:
            r = runs[u]
            s = r["parts"][part]
            cells.append(f"{1000 * s / max(r['steps'], 1):.2f} ({s / r['wall']:.0%})")
        print(f"| {part} | " + " | ".join(cells) + " |")
    cells = [f"{1000 * r['wall'] / max(r['steps'], 1):.2f}" for r in runs.values()]
    print("| **step wall** | " + " | ".join(cells) + " |")
    cells = [f"{1000 * r['beside'] / max(r['steps'], 1):.2f}" for r in runs.values()]
    print("| output thread, beside (not in the wall) | " + " | ".join(cells) + " |")
    host = [f"{_host(r):.1%}" for r in runs.values()]
    print("| **host share (wall less MLX wait, launch and idle)** | " + " | ".join(host) + " |")
    print("| decoding rows a step (mean) | " + " | ".join(f"{r['rows']:.1f}" for r in runs.values()) + " |")
    out = [f"{r['tokens'] / r['wall']:.0f}" for r in runs.values()]
    print("| output tok/s | " + " | ".join(out) + " |")
    if any("new shapes" in r for r in runs.values()):
        print(
            "| decode steps of a shape not seen before | "
            + " | ".join(r.get("new shapes", "") for r in runs.values())
            + " |"
        )


def _host(r: dict) -> float:
    # the commands part is mostly the wait for a command while nothing runs
    device = r["parts"]["MLX wait"] + r["parts"]["launch"] + r["parts"]["commands (incl. idle)"]
    return 1 - device / r["wall"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.set_defaults(model="tiny")
    p.add_argument("--users", default="1,8,32,64", help="comma-separated numbers of users")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="the users' sampling (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="(the default model's card: 1.1)")
    p.add_argument("--ignore-eos", action="store_true", help="every reply runs to --max-tokens (the batch stays full)")
    p.add_argument("--threads", action="store_true", help="one blocking thread a user, not the server's one event loop")
    p.add_argument(
        "--switch-interval",
        type=float,
        default=SWITCH_INTERVAL_S,
        help="Python's GIL switch interval, s (default: what `radixchat serve` sets; Python's own is 0.005)",
    )
    p.add_argument("--rounds", type=int, default=1, help="runs of the same conversations per --users value")
    p.add_argument(
        "--shapes", action="store_true", help="count decode steps whose batch shape is new (a compiled step's traces)"
    )
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="an engine setting (repeatable)")
    args = p.parse_args()
    reexec_with_openblas()
    sys.setswitchinterval(args.switch_interval)
    from radixchat.core.engine.engine import Engine

    overrides = dict(kv.split("=", 1) for kv in args.set)
    settings = Settings(model=resolve_model(args), **overrides)
    engine = Engine(settings).start()
    clock = ExclusiveClock()
    clock.thread = engine._thread.ident
    clock.shapes = Shapes() if args.shapes else None
    instrument(clock, engine)
    sampling = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty,
        "ignore_eos": args.ignore_eos,
    }
    callers_are = "a thread each" if args.threads else "tasks of one event loop"
    print(
        f"model {settings.model}; BLAS {active_blas()}; {args.turns} turns of {args.max_tokens} tokens a user, "
        f"temperature {args.temperature:g}, top_p {args.top_p:g}, repetition penalty {args.repetition_penalty:g}; "
        f"users are {callers_are}"
    )
    # a first round unmeasured: compiles, caches the system prompts
    measure(engine, clock, 4, 1, {**sampling, "max_tokens": 8}, args.seed + 1, args.threads)
    runs = {}
    for u in map(int, args.users.split(",")):
        for r in range(args.rounds):  # the same conversations: from the second on, their prompts are cached
            label = f"{u} users" + (f", round {r + 1}" if args.rounds > 1 else "")
            runs[label] = measure(engine, clock, u, args.turns, sampling, args.seed, args.threads)
    engine.stop()
    table(runs)


if __name__ == "__main__":
    main()
