"""Run a bounded Locust load against a fresh radixchat server and write a report folder.

Starts `radixchat serve` on a free loopback port with a fresh SQLite file (a user and an
API key made for the run), runs Locust headless as a subprocess (it monkey-patches with
gevent, so never in this process), bounded by request count and time, then reads the
server's /metrics and the store and writes into the report folder: Locust's CSVs,
summary.md (requests, failures, req/s, output tokens/s, time to first token p50/p95,
cache hit ratio, peak server memory) and PNG plots. Exits non-zero on any failure or any
request missing from the store. Traffic goes to 127.0.0.1 only.

    python -m loadtests.run --users 7 --requests 700 --time 20m --out report/
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from radixchat.core.store import Store
from tests.support.procs import free_port, peak_rss_mb, start_and_wait

HERE = Path(__file__).resolve().parent


def start_server(args, db: Path, port: int, log: Path) -> subprocess.Popen:
    cmd = [
        str(Path(sys.executable).with_name("radixchat")),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        str(db),
        "--max-batch",
        str(args.max_batch),
    ]
    if args.model:
        cmd += ["--model", args.model]
    if args.no_prefix_cache:
        cmd.append("--no-prefix-cache")
    return start_and_wait(cmd, f"http://127.0.0.1:{port}/health", log)


def parse_metrics(text: str) -> dict[str, float]:
    """Each sample name's value summed over its labels (model_name, reasons...)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def read_stats(path: Path) -> dict[tuple[str, str], dict]:
    """Locust's final stats (its --json-file; the CSVs are written periodically and can miss
    the last requests), as rows shaped like its CSV: counts, percentiles, content size."""
    rows = {}
    for e in json.loads(path.read_text()):
        hist = sorted((int(float(ms)), n) for ms, n in e["response_times"].items())
        count = e["num_requests"]

        def pct(q, hist=hist, count=count):
            seen = 0
            for ms, n in hist:
                seen += n
                if seen >= q * count:
                    return ms
            return float("nan")

        rows[(e["method"] or "", e["name"])] = {
            "Type": e["method"] or "",
            "Name": e["name"],
            "Request Count": count,
            "Failure Count": e["num_failures"],
            "50%": pct(0.5),
            "95%": pct(0.95),
            "Average Content Size": e["total_content_length"] / count if count else 0,
        }
    return rows


def count_exceptions(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path) as f:
        return sum(int(r["Count"]) for r in csv.DictReader(f))


def summarise(args, out: Path, stats, metrics, store_requests, wall_s, rss) -> tuple[str, bool]:
    user_errors = count_exceptions(out / "locust_exceptions.csv")
    # one STREAM event per chat turn, answered or failed, whichever user class sent it
    requests = sum(int(r["Request Count"]) for (t, _), r in stats.items() if t == "STREAM")
    failures = sum(int(r["Failure Count"]) for r in stats.values())
    ttft = [r for (t, n), r in stats.items() if t == "TTFT"]
    stream = [r for (t, n), r in stats.items() if t == "STREAM"]
    out_tokens = metrics.get("radixchat:generation_tokens_total", 0)  # both classes, server side
    by_class = {
        kind: sum(int(r["Request Count"]) for r in stream if r["Name"].startswith(kind)) for kind in ("chat", "page")
    }

    def pct(rows, col):
        if not rows:
            return float("nan")
        # weighted by count across names; exact per-name figures are in the CSV
        total = sum(int(r["Request Count"]) for r in rows)
        return sum(float(r[col] or 0) * int(r["Request Count"]) for r in rows) / max(total, 1)

    prompt = metrics.get("radixchat:prompt_tokens_total", 0)
    cached = metrics.get("radixchat:prefix_cache_hits_total", 0)
    missing = requests - store_requests
    ok = failures == 0 and user_errors == 0 and missing <= 0 and requests > 0
    lines = [
        f"# radixchat load test ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Scenario: seed (4 system prompts x 30 questions, 2-4 turns), users {args.users} "
        f"({', '.join(args.classes)}), think {args.think}s, max_tokens {args.max_tokens}, "
        f"bound {args.requests} requests / {args.time}, prefix cache "
        f"{'off' if args.no_prefix_cache else 'on'}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests | {requests} (API {by_class['chat']}, page {by_class['page']}) |",
        f"| failures | {failures} |",
        f"| Locust user errors (exceptions) | {user_errors} |",
        f"| requests in the store | {store_requests} (missing: {max(missing, 0)}) |",
        f"| wall time | {wall_s:.1f} s |",
        f"| requests/s | {requests / wall_s:.2f} |",
        f"| output tokens/s | {out_tokens / wall_s:.1f} |",
        f"| time to first token p50 / p95 | {pct(ttft, '50%'):.0f} / {pct(ttft, '95%'):.0f} ms |",
        f"| full stream p50 / p95 | {pct(stream, '50%'):.0f} / {pct(stream, '95%'):.0f} ms |",
        f"| prompt tokens / served from cache | {prompt:.0f} / {cached:.0f} |",
        f"| cache hit ratio (prompt tokens) | {cached / prompt if prompt else 0:.3f} |",
        f"| cache nodes / bytes / evictions | {metrics.get('radixchat:prefix_cache_nodes', 0):.0f} / "
        f"{metrics.get('radixchat:prefix_cache_bytes', 0) / 2**20:.1f} MiB / "
        f"{metrics.get('radixchat:prefix_cache_evictions_total', 0):.0f} |",
        f"| peak server memory (RSS) | {rss:.0f} MiB |",
        "",
        "Plots: throughput.png, latency.png, cache_hit_ratio.png. Raw: locust_final.json "
        "(final counts), locust_*.csv (history).",
    ]
    return "\n".join(lines) + "\n", ok


def plot(out: Path, store: Store, t_start: float, t_end: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(out / "locust_stats_history.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] == "Aggregated"]
    t = [int(r["Timestamp"]) - int(rows[0]["Timestamp"]) for r in rows] if rows else []

    def series(col):
        return [float(r[col]) if r[col] not in ("", "N/A") else float("nan") for r in rows]

    for name, cols, ylabel in (
        ("throughput", ["Requests/s", "Failures/s"], "per second"),
        ("latency", ["50%", "95%"], "ms (Locust clock)"),
    ):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for col in cols:
            ax.plot(t, series(col), label=col)
        ax.set_xlabel("seconds")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.set_title(name)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)
    window = max(t_end - t_start, 10.0)
    buckets = store.stats(window_s=window, bucket_s=max(window / 30, 1.0), now=t_end)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([b.start - t_start for b in buckets], [b.cache_hit_ratio for b in buckets], marker="o")
    ax.set_xlabel("seconds")
    ax.set_ylabel("cached / prompt tokens")
    ax.set_title("cache hit ratio")
    fig.tight_layout()
    fig.savefig(out / "cache_hit_ratio.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=7)
    p.add_argument("--spawn-rate", type=float, default=None, help="users started per second (default: all at once)")
    p.add_argument("--requests", type=int, default=100, help="stop after this many chat requests")
    p.add_argument("--time", default="5m", help="and after this long at most (Locust -t)")
    p.add_argument("--think", type=float, default=0.5, help="mean think time between turns, s")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--classes", nargs="+", default=["ApiUser"], help="Locust user classes")
    p.add_argument("--model", default=None)
    p.add_argument("--no-prefix-cache", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("loadtest-report"))
    args = p.parse_args(argv)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    db = out / "radixchat.db"
    for f in out.glob("radixchat.db*"):
        f.unlink()
    password = secrets.token_urlsafe(12)
    with Store(db) as store:
        user = store.create_user("loadtest", password)
        _, key = store.create_api_key(user, "loadtest")
    (out / "users.json").write_text(json.dumps([{"name": "loadtest", "password": password}]))
    port = free_port()
    server = start_server(args, db, port, out / "server.log")
    env = {
        **os.environ,
        "RADIXCHAT_API_KEY": key,
        "RADIXCHAT_MAX_REQUESTS": str(args.requests),
        "RADIXCHAT_THINK_S": str(args.think),
        "RADIXCHAT_MAX_TOKENS": str(args.max_tokens),
        "RADIXCHAT_SEED": str(args.seed),
        "RADIXCHAT_USERS_FILE": str(out / "users.json"),
    }
    cmd = [
        str(Path(sys.executable).with_name("locust")),
        "-f",
        str(HERE / "locustfile.py"),
        "--headless",
        "-u",
        str(args.users),
        "-r",
        str(args.spawn_rate or args.users),
        "-t",
        args.time,
        "--host",
        f"http://127.0.0.1:{port}",
        "--csv",
        str(out / "locust"),
        "--csv-full-history",
        "--json-file",
        str(out / "locust_final"),  # Locust adds .json
        "--stop-timeout",
        "120",
        "--only-summary",
        *args.classes,
    ]
    t0 = time.time()
    try:
        locust = subprocess.run(cmd, env=env, capture_output=True, text=True)
        t1 = time.time()
        (out / "locust.log").write_text(locust.stdout + locust.stderr)
        metrics = parse_metrics(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
        rss = peak_rss_mb(server.pid)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    with Store(db) as store:
        store_requests = store.totals()["requests"]
        stats = read_stats(out / "locust_final.json")
        text, ok = summarise(args, out, stats, metrics, store_requests, t1 - t0, rss)
        plot(out, store, t0, t1)
    (out / "summary.md").write_text(text)
    print(text)
    if locust.returncode not in (0, 1):
        print(f"locust exited {locust.returncode}; see {out / 'locust.log'}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
