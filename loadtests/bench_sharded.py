"""One radixchat against the same server sharded over ranks by mlx.launch, on this machine.

Starts, one after the other on loopback, `radixchat serve` alone and
`mlx.launch -n N --backend ring -- radixchat serve` (each rank on the same machine here; on
Macs each would be on its own), drives both with the same closed-loop chat workload as
bench_vs_mlxlm (the seed scenario: system prompts, multi-turn, greedy, streamed), and prints
output tokens/s, TTFT and TPOT for each, then what the ranks exchange:

- messages: what rank 0 sent the others (admissions, finishes, one per engine step), measured
  from /health;
- collectives: the tensors tensor parallelism sums, computed: two all_sums of one hidden state
  per layer per token (float32), plus the token rank 0 shares each step; a ring all_sum over N
  ranks sends 2 (N - 1) / N times the tensor from each rank.

With `--one-thread-per-rank` the N ranks each get one BLAS thread (as if each had a machine of
its own core count divided by N), not the machine's all.

    python -m loadtests.bench_sharded --random-dim 1024 --random-layers 12 --users 1,8 [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

from loadtests.bench_vs_mlxlm import blas_env, drive_closed, plan, summarize
from loadtests.benchmodel import add_model_args, resolve_model
from tests.support.procs import free_port, free_port_block, start_and_wait, stop_process

BIN = Path(sys.executable).parent


def serve(model: str, ranks: int, log: Path, port: int, one_thread: bool):
    cmd = [
        str(BIN / "radixchat"),
        "serve",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        str(log.with_suffix(".sqlite")),
        "--no-auth",
    ]
    if ranks > 1:
        env = ["--env", "OPENBLAS_NUM_THREADS=1"] if one_thread else []
        cmd = [
            str(BIN / "mlx.launch"),
            "-n",
            str(ranks),
            "--backend",
            "ring",
            "--starting-port",
            str(free_port_block(ranks)),
            *env,
            "--",
            *cmd,
        ]
    return start_and_wait(cmd, f"http://127.0.0.1:{port}/health", log, env=blas_env(), group=True)


def measure(model: str, ranks: int, users: int, args, one_thread: bool = False) -> dict:
    port = free_port()
    log = args.out / f"ranks{ranks}{'-1thread' if one_thread else ''}-users{users}.log"
    proc = serve(model, ranks, log, port, one_thread)
    try:
        url = f"http://127.0.0.1:{port}"
        served = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        res, wall = drive_closed(url, served, plan(users, args.convs, args.seed), args.max_tokens)
        shards = httpx.get(url + "/health").json().get("shards") or {}
    finally:
        stop_process(proc)
    row = summarize(res, wall, 2.0, 0.25)
    out = sum(r["out"] for r in res if "error" not in r)
    row["message_bytes_per_token"] = shards.get("message_bytes", 0) / max(1, out)
    row["in_step"] = shards.get("in_step")
    return row


def collective_bytes(model: str, ranks: int) -> float:
    """Bytes each rank sends per generated token for tensor parallelism's all_sums (computed)."""
    config = json.loads((Path(model) / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    summed = 2 * layers * hidden * 4 + 4  # two float32 hidden states a layer, one uint32 token
    return summed * 2 * (ranks - 1) / ranks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--users", default="1,8")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--convs", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one-thread-per-rank", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench-sharded"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    print(
        f"model {model}; max_tokens {args.max_tokens}; {args.convs} conversation(s) per user; "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    kinds = [(1, False), (args.ranks, False)] + ([(args.ranks, True)] if args.one_thread_per_rank else [])
    print(
        f"{'users':>5} {'server':>28} {'tok/s':>8} {'ttft p50':>9} {'ttft p95':>9} {'tpot p50':>9} "
        f"{'errors':>6} {'msg B/tok':>9} {'in step':>7}"
    )
    for users in map(int, args.users.split(",")):
        base = None
        for ranks, one in kinds:
            r = measure(model, ranks, users, args, one)
            name = "1 process" if ranks == 1 else f"{ranks} ranks (ring, loopback)" + (", 1 thread" if one else "")
            base = base or r["tps"]
            print(
                f"{users:>5} {name:>28} {r['tps']:>8.1f} {r['ttft50']:>9.2f} {r['ttft95']:>9.2f} "
                f"{r['tpot50']:>9.4f} {r['errors']:>6} {r['message_bytes_per_token']:>9.0f} "
                f"{r['in_step']!s:>7}   ({r['tps'] / base:.2f}x)",
                flush=True,
            )
    print(
        f"collectives: {collective_bytes(model, args.ranks):,.0f} bytes sent by each rank per generated "
        f"token over {args.ranks} ranks (computed from the model's shape)"
    )


if __name__ == "__main__":
    main()
