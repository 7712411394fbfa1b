"""What a flood of slow preparations costs another user: alice's wait while mallory's
requests are templated, tokenized or compiled.

In-process engine (no HTTP), one event loop, as the server has: mallory sends --flood
requests at once through `asubmit`, then alice sends --turns short ones, one at a time.
Prints, per kind of flood, how many of mallory's were accepted and refused (and how long
they took to be), alice's submit latency (until her request is queued: its preparation's
wait) and her time to first token, turn by turn (the first comes while the flood is
queued), beside alice alone (medians).
Kinds of flood (--kind, repeatable):
  bodies   --body-chars of text per request (1,000,000: far beyond any context)
  schemas  a json_schema of --schema-bytes (138 KB) per request
  near     what passes the bounds but is slow to prepare: a json_schema just under the
           size limit (--near-bytes), so every one is compiled
Runs the code it is started from: start it from an older checkout to compare.

    python -m loadtests.bench_prepare [--model default] [--flood 16] [--kind bodies --kind near]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest, RequestError, Sampling, TextDelta

QUESTIONS = assets.prompts()["questions"]


def schema_of(size: int) -> dict:
    """An object schema of about `size` bytes: many e-mail fields (each a regular expression
    to compile: of the shapes tried, the slowest per byte)."""
    props, n = {}, 0
    while len(json.dumps({"type": "object", "properties": props})) < size:
        props[f"contact_{n}"] = {"type": "string", "format": "email"}
        n += 1
    return {"type": "object", "properties": props, "required": list(props)[:8]}


def body_of(chars: int) -> str:
    text = " ".join(QUESTIONS) + " "
    return (text * (chars // len(text) + 1))[:chars]


def mallory(kind: str, i: int, args) -> ChatRequest:
    sampling = {"max_tokens": 1}
    content = f"[{i}] {QUESTIONS[i % len(QUESTIONS)]}"
    if kind == "bodies":
        content = args.body
    elif kind == "schemas":
        sampling["json_schema"] = args.schemas[0]
    elif kind == "near":
        sampling["json_schema"] = args.schemas[1]
    return ChatRequest(owner="mallory", messages=[{"role": "user", "content": content}], sampling=sampling)


async def alice_turn(eng, i: int) -> tuple[float, float]:
    """(submit latency, time to first token) of one short request of alice, in seconds."""
    req = ChatRequest(
        owner="alice",
        messages=[{"role": "user", "content": f"[alice {i}] {QUESTIONS[i % len(QUESTIONS)]}"}],
        sampling={"max_tokens": 8, "temperature": 0},
    )
    t = time.perf_counter()
    handle = await eng.asubmit(req)
    queued = time.perf_counter() - t
    first = None
    async for ev in handle:
        if first is None and isinstance(ev, TextDelta):
            first = time.perf_counter() - t
    return queued, first if first is not None else time.perf_counter() - t


async def one_kind(eng, kind: str, args) -> None:
    ends: list[tuple[str, float]] = []  # (accepted or refused, seconds after sending)

    async def send(i: int) -> None:
        t = time.perf_counter()
        try:
            handle = await eng.asubmit(mallory(kind, i, args))
        except RequestError as e:
            ends.append((f"refused {e.status}", time.perf_counter() - t))
            return
        ends.append(("accepted", time.perf_counter() - t))
        async for _ in handle:
            pass

    flood = [asyncio.ensure_future(send(i)) for i in range(args.flood)]
    await asyncio.sleep(0.2)  # the flood is in: alice comes behind it
    turns = [await alice_turn(eng, i) for i in range(args.turns)]
    t = time.perf_counter()
    await asyncio.gather(*flood)
    drained = time.perf_counter() - t
    kinds = sorted({k for k, _ in ends})
    summary = ", ".join(
        f"{sum(k == x for k, _ in ends)} {x} (median {statistics.median(s for k, s in ends if k == x):.2f} s)"
        for x in kinds
    )
    print(
        f"{kind:8} mallory {args.flood}: {summary}; the rest of the flood took {drained:.1f} s after "
        f"alice's turns | alice, turn by turn: submit {' / '.join(f'{q:.3f}' for q, _ in turns)} s, "
        f"first token {' / '.join(f'{f:.3f}' for _, f in turns)} s"
    )


async def run(eng, args) -> None:
    turns = [await alice_turn(eng, i) for i in range(args.turns)]
    print(
        f"{'alone':8} alice: submit {statistics.median(q for q, _ in turns):.3f} s, "
        f"first token {statistics.median(f for _, f in turns):.3f} s"
    )
    for kind in args.kind:
        await one_kind(eng, kind, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--flood", type=int, default=16, help="mallory's requests, sent at once")
    p.add_argument("--turns", type=int, default=3, help="alice's requests, one at a time")
    p.add_argument("--kind", action="append", choices=["bodies", "schemas", "near"])
    p.add_argument("--body-chars", type=int, default=1_000_000)
    p.add_argument("--schema-bytes", type=int, default=138_000)
    p.add_argument("--near-bytes", type=int, default=60_000)
    args = p.parse_args()
    args.kind = args.kind or ["bodies", "schemas", "near"]
    reexec_with_openblas("auto")

    from radixchat.core.engine.engine import Engine

    model = resolve_model(args)
    eng = Engine(Settings(model=model, max_batch=64)).start()
    args.schemas = [schema_of(args.schema_bytes), schema_of(args.near_bytes)]
    args.body = body_of(args.body_chars)
    compiled = []
    for schema in args.schemas:  # alone, without the size check: what the compiler takes
        t = time.perf_counter()
        try:
            eng.constraint(Sampling(json_schema=schema))
            compiled.append(f"{time.perf_counter() - t:.2f} s")
        except RequestError as e:
            compiled.append(f"refused after {time.perf_counter() - t:.2f} s ({e.message[:80]})")
    print(
        f"model {model}; blas {active_blas()}; context {eng.loaded.context_length}; one schema of "
        f"{args.schema_bytes:,} bytes compiles in {compiled[0]}, of {args.near_bytes:,} bytes in {compiled[1]}"
    )
    try:
        asyncio.run(run(eng, args))
    finally:
        eng.stop()


if __name__ == "__main__":
    main()
