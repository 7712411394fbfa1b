"""What the hops to engines on other processes cost, and what a second worker gives: a plain
server, a front end with its worker (`serve --engine WORKER`), a front end behind SGLang's
smg with that one worker, and one behind smg with two workers, all on loopback.

Measures, each path's requests interleaved with the others' so that a machine's drift hits
them alike (medians over --rounds):

- ms per request: a one-token reply, not streamed, on a cached prompt (what the hops add to
  every request: front end -> worker, front end -> smg -> worker, against the plain server);
- ms per streamed token: a --tokens reply, streamed, its wall time over its tokens;
- bytes per token on the wire between front end and worker: one streamed request sent as
  the front end sends it, to the worker (/engine/submit) and through smg (/generate), its
  answer's bytes over its tokens (NDJSON, a line a write of deltas);
- output tokens/s with two workers against one: --users users at once, each streaming
  --tokens tokens --turns times, through smg with one worker, then with two. Every process
  here shares this machine's cores: two workers on one machine split the same CPUs, so this
  shows what the routing costs and that users spread over workers, not what a second
  machine would add.

    python -m loadtests.bench_router [--random-dim 128 --random-layers 4] [--rounds 20]
        [--tokens 100] [--users 8] [--turns 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.benchmodel import add_model_args, resolve_model
from tests.support.server import Server
from tests.support.workers import KEY, Router, Worker, keyed_db

PROMPT = [{"role": "user", "content": "Tell me about the weather in Lisbon in spring."}]


def _body(max_tokens: int, stream: bool) -> dict:
    body = {"model": "default", "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    body["ignore_eos"] = True  # every reply exactly max_tokens long, on every path
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _one(client: httpx.AsyncClient, url: str, key: str, max_tokens: int, stream: bool) -> tuple[float, int]:
    """(seconds, completion tokens) of one chat completion."""
    tic = time.perf_counter()
    headers = {"authorization": f"Bearer {key}"}
    if not stream:
        r = await client.post(url + "/v1/chat/completions", json=_body(max_tokens, False), headers=headers)
        r.raise_for_status()
        return time.perf_counter() - tic, r.json()["usage"]["completion_tokens"]
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=_body(max_tokens, True), headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"usage":{' in line.replace(" ", ""):
                usage = json.loads(line[6:]).get("usage") or {}
                tokens = usage.get("completion_tokens", tokens)
    return time.perf_counter() - tic, tokens


async def per_request(paths: dict, rounds: int, tokens: int) -> dict[str, tuple[float, float]]:
    """Each path's median ms per one-token request and per streamed token."""
    whole: dict[str, list[float]] = {p: [] for p in paths}
    per_token: dict[str, list[float]] = {p: [] for p in paths}
    async with httpx.AsyncClient(timeout=120) as client:
        for url, key in paths.values():  # warm: the prompt cached, connections open
            await _one(client, url, key, 1, False)
        for _ in range(rounds):
            for name, (url, key) in paths.items():
                whole[name].append((await _one(client, url, key, 1, False))[0])
            for name, (url, key) in paths.items():
                s, n = await _one(client, url, key, tokens, True)
                per_token[name].append(s / max(n, 1))
    return {p: (statistics.median(whole[p]) * 1e3, statistics.median(per_token[p]) * 1e3) for p in paths}


def wire_bytes(worker_url: str, router_url: str, model: str, tokens: int) -> dict[str, float]:
    """Bytes per generated token of one streamed request, front end to worker and through smg."""
    sampling = {"max_tokens": tokens, "ignore_eos": True}
    request = {"kind": "chat", "request": {"messages": PROMPT, "sampling": sampling, "owner": "user:bench-wire"}}
    auth = {"authorization": f"Bearer {KEY}", "x-radixchat-user": "user:bench-wire"}
    out = {}
    for name, url, body in (
        ("front end -> worker", worker_url + "/engine/submit", request),
        (
            "front end -> smg -> worker",
            router_url + "/generate",
            {"model": model, "stream": True, "radixchat": request},
        ),
    ):
        r = httpx.post(url, json=body, headers=auth, timeout=120)
        r.raise_for_status()
        final = json.loads(r.text.strip().splitlines()[-1])
        out[name] = len(r.content) / max(final["usage"]["generated_tokens"], 1)
    return out


async def throughput(url: str, keys: list[str], tokens: int, turns: int) -> float:
    """Output tokens/s of len(keys) users at once, each streaming `turns` replies."""
    async with httpx.AsyncClient(timeout=300) as client:

        async def user(key: str) -> int:
            return sum([(await _one(client, url, key, tokens, True))[1] for _ in range(turns)])

        tic = time.perf_counter()
        done = await asyncio.gather(*(user(k) for k in keys))
        return sum(done) / (time.perf_counter() - tic)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.set_defaults(random_dim=128, random_layers=4)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--turns", type=int, default=2)
    args = p.parse_args()
    model = resolve_model(args)
    folder = Path(tempfile.mkdtemp(prefix="bench-router-"))
    names = tuple(f"user{i}" for i in range(args.users))
    started: list = []
    try:
        w1, w2 = Worker(model, folder), Worker(model, folder)
        r1, r2 = Router([w1.url]), Router([w1.url, w2.url])
        started += [w1, w2, r1, r2]
        env = {"RADIXCHAT_SERVICE_KEY": KEY}
        servers = {}
        for name, flags in (
            ("plain server", ["--cache-disk-bytes", "0"]),
            ("front end -> worker", ["--engine", w1.url]),
            ("front end -> smg -> worker", ["--engine", r1.url]),
            ("front end -> smg -> 2 workers", ["--engine", r2.url]),
        ):
            db, keys = keyed_db(folder, name.replace(" ", "").replace(">", ""), names)
            servers[name] = (Server(model, db, *flags, env=env), keys)
            started.append(servers[name][0])
        print(f"model {Path(model).name}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start")
        paths = {n: (s.url, keys[0]) for n, (s, keys) in list(servers.items())[:3]}
        timing = asyncio.run(per_request(paths, args.rounds, args.tokens))
        print(
            f"\n{'path':30} {'ms/request':>11} {'ms/token':>9}   (medians of {args.rounds}; {args.tokens}-token streams)"
        )
        for name, (ms, mst) in timing.items():
            print(f"{name:30} {ms:11.2f} {mst:9.3f}")
        model_id = httpx.get(w1.url + "/v1/models").json()["data"][0]["id"]
        print("\nbytes per token on the wire (one streamed request):")
        for name, b in wire_bytes(w1.url, r1.url, model_id, args.tokens).items():
            print(f"  {name:30} {b:7.1f}")
        print(f"\noutput tokens/s, {args.users} users at once, {args.turns} streams of {args.tokens} tokens each:")
        for name in ("front end -> smg -> worker", "front end -> smg -> 2 workers"):
            srv, keys = servers[name]
            print(f"  {name:30} {asyncio.run(throughput(srv.url, keys, args.tokens, args.turns)):8.1f}")
        print(f"load {os.getloadavg()[0]:.1f} at the end; every process shares these {os.cpu_count()} CPUs")
    finally:
        for proc in reversed(started):
            proc.stop()


if __name__ == "__main__":
    main()
