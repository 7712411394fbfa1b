"""Benchmark radixchat against mlx-lm's own server, side by side in one run.

For each user count (1, 7, 32 by default) each server is started fresh on a loopback
port, on the same model with the same BLAS set-up (OpenBLAS preloaded on Linux), and
driven by the same fixed requests: the seed scenario from assets/prompts.json (4 system
prompts x 30 questions), multi-turn, temperature 0, fixed max_tokens, fixed random seed,
streamed. Prints per user count: requests/s, output tokens/s, time to first token and
latency p50/p95, errors, peak RSS, prompt tokens actually prefilled, and the ratios
radixchat / mlx_lm.server; then the engine's ceiling on this machine (a raw batched
greedy decode loop on the same model at the same batch size) and radixchat's output
tokens/s as a fraction of it.

    python -m loadtests.bench_vs_mlxlm [--model PATH | --random-dim 1024 --random-layers 12]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from core.platform.blas import REEXEC_MARK, find_openblas, openblas_env
import assets
from loadtests.benchmodel import add_model_args, resolve_model
from loadtests.figures import pct
from tests.support.procs import free_port, peak_rss_mb, start_and_wait

PROMPTS = assets.prompts()


def blas_env() -> dict:
    """The same BLAS set-up for every process measured: what radixchat would re-exec into."""
    env = dict(os.environ)
    lib = find_openblas()
    if sys.platform.startswith("linux") and lib:
        env = openblas_env({**env, "LD_PRELOAD": lib, REEXEC_MARK: "1"})
    return env


def plan(users: int, convs_per_user: int, seed: int) -> list[list[tuple[int, list[str]]]]:
    rng = random.Random(seed)
    return [[(rng.randrange(len(PROMPTS["system_prompts"])),
              rng.sample(PROMPTS["questions"], rng.randint(2, 4))) for _ in range(convs_per_user)]
            for _ in range(users)]


def start(kind: str, model: str, port: int, batch: int, log: Path) -> subprocess.Popen:
    env = blas_env()
    if kind.startswith("radixchat"):  # "radixchat --flag value ...": a variant with its flags
        cmd = [str(Path(sys.executable).with_name("radixchat")), "serve", "--model", model,
               "--port", str(port), "--no-auth", "--db", str(log.with_suffix(".db")),
               "--max-batch", str(batch), "--max-prefill-batch", str(min(batch, 8)), *kind.split()[1:]]
    else:
        cmd = [sys.executable, "-m", "mlx_lm.server", "--model", model, "--port", str(port),
               "--decode-concurrency", str(batch), "--prompt-concurrency", str(min(batch, 8))]
    return start_and_wait(cmd, f"http://127.0.0.1:{port}/v1/models", log, env=env)


def one_turn(http: httpx.Client, model: str, messages, max_tokens: int) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, parts, usage = None, [], None
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}"}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for ch in chunk.get("choices") or []:
                text = (ch.get("delta") or {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    parts.append(text)
    end = time.perf_counter()
    if usage is None:
        return {"error": "no usage"}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return {"ttft": (first or end) - t0, "latency": end - t0, "text": "".join(parts),
            "out": usage["completion_tokens"], "prompt": usage["prompt_tokens"], "cached": cached}


def drive(url: str, model: str, work, max_tokens: int) -> tuple[list[dict], float]:
    results, lock = [], threading.Lock()

    def user(convs):
        with httpx.Client(base_url=url, timeout=600) as http:
            for system, questions in convs:
                msgs = [{"role": "system", "content": PROMPTS["system_prompts"][system]["text"]}]
                for q in questions:
                    msgs.append({"role": "user", "content": q})
                    try:
                        r = one_turn(http, model, msgs, max_tokens)
                    except httpx.HTTPError as e:
                        r = {"error": str(e)}
                    with lock:
                        results.append(r)
                    if "error" in r:
                        return
                    msgs.append({"role": "assistant", "content": r["text"]})

    threads = [threading.Thread(target=user, args=(w,)) for w in work]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0



def measure(kind, model, users, args, workdir: Path) -> dict:
    port = free_port()
    name = kind.replace(" ", "").replace("-", "")
    proc = start(kind, model, port, max(users, 8), workdir / f"{name}-{users}.log")
    try:
        served = "default" if kind.startswith("radixchat") else model
        res, wall = drive(f"http://127.0.0.1:{port}", served, plan(users, args.convs, args.seed),
                          args.max_tokens)
        rss = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    ok = [r for r in res if "error" not in r]
    return {"requests": len(res), "errors": len(res) - len(ok), "wall": wall,
            "rps": len(ok) / wall, "tps": sum(r["out"] for r in ok) / wall,
            "ttft50": pct([r["ttft"] for r in ok], 0.5), "ttft95": pct([r["ttft"] for r in ok], 0.95),
            "lat50": pct([r["latency"] for r in ok], 0.5), "lat95": pct([r["latency"] for r in ok], 0.95),
            "prefilled": sum(r["prompt"] - r["cached"] for r in ok), "prompt": sum(r["prompt"] for r in ok),
            "rss": rss}


def decode_ceiling(model_path: str, batch: int, context: int, steps: int = 48) -> float:
    """Tokens/s of a bare batched greedy decode loop: no scheduler, no HTTP."""
    code = f"""
import time, mlx.core as mx
from core.engine.model import load_model
from mlx_lm.models.cache import make_prompt_cache
m = load_model({model_path!r}).model
cache = make_prompt_cache(m)
x = mx.array([[(i * 7 + b) % 500 + 10 for i in range({context})] for b in range({batch})])
mx.eval(m(x, cache=cache))
y = mx.zeros(({batch}, 1), dtype=mx.uint32)
mx.eval(m(y, cache=cache))
t0 = time.perf_counter()
for _ in range({steps}):
    y = mx.argmax(m(y, cache=cache)[:, -1:, :], axis=-1)
    mx.eval(y)
print({batch} * {steps} / (time.perf_counter() - t0))
"""
    env = blas_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(Path(__file__).resolve().parent.parent))
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--users", default="1,7,32")
    p.add_argument("--convs", type=int, default=2, help="conversations per user")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench-vs-mlxlm"))
    p.add_argument("--variant", action="append", default=[],
                   help="also run radixchat with these extra flags, e.g. --variant='--step-tokens 0' (repeatable)")
    p.add_argument("--no-mlxlm", action="store_true", help="radixchat (and its variants) only")
    args = p.parse_args()
    model = resolve_model(args)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"model {model}; max_tokens {args.max_tokens}; {args.convs} conversations per user; "
          f"blas {'openblas' if find_openblas() else 'bundled'}; {time.strftime('%Y-%m-%d %H:%M')}")
    cols = ["requests", "errors", "rps", "tps", "ttft50", "ttft95", "lat50", "lat95", "prefilled", "rss"]
    fmt = {"rps": "{:.2f}", "tps": "{:.1f}", "ttft50": "{:.3f}", "ttft95": "{:.3f}",
           "lat50": "{:.2f}", "lat95": "{:.2f}", "rss": "{:.0f}"}
    summary = {}
    for users in map(int, args.users.split(",")):
        kinds = ["radixchat"] + [f"radixchat {v}" for v in args.variant] + ([] if args.no_mlxlm else ["mlx_lm.server"])
        rows = {kind: measure(kind, model, users, args, args.out) for kind in kinds}
        ceiling = decode_ceiling(model, users, context=300)
        summary[users] = {**rows, "ceiling": ceiling}
        print(f"\n{users} user(s)")
        width = max(16, *(len(k) for k in kinds))
        print(f"{'':>{width}}" + "".join(f"{c:>11}" for c in cols))
        for kind, r in rows.items():
            print(f"{kind:>{width}}" + "".join(f"{fmt.get(c, '{}').format(r[c]):>11}" for c in cols))
        a, b = rows["radixchat"], rows.get("mlx_lm.server")
        if b is not None:
            ratio = {c: (a[c] / b[c] if b[c] else float("nan")) for c in cols if c not in ("requests", "errors")}
            print(f"{'ratio':>{width}}{'':>22}" + "".join(f"{ratio[c]:>10.2f}x" for c in cols[2:]))
        print(f"raw batched decode ceiling (batch {users}): {ceiling:.1f} tok/s; "
              f"radixchat output is {a['tps'] / ceiling:.0%} of it (includes prefill and think-free turns)")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.no_mlxlm:
        return
    plot(summary, args.out / "comparison.png", title=f"{Path(model).name}, max_tokens {args.max_tokens}")


def plot(summary: dict, path: Path, title: str) -> None:
    """Output tokens/s and time to first token p95 per user count, both servers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    users = sorted(summary, key=int)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "tps", "output tokens/s"), (axes[1], "ttft95", "time to first token p95, s")):
        for i, kind in enumerate(("radixchat", "mlx_lm.server")):
            xs = [j + (i - 0.5) * 0.38 for j in range(len(users))]
            ax.bar(xs, [summary[u][kind][key] for u in users], width=0.38, label=kind)
        ax.set_xticks(range(len(users)), [f"{u} users" for u in users])
        ax.set_title(label)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
