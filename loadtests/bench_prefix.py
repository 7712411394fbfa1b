"""Benchmark the prefix cache: prefill saved, restore cost, bytes per cached token.

Prints, side by side in one run on one model:
  A. the seed scenario (4 system prompts x 30 questions from assets/prompts.json, 7
     concurrent users, 2-4 turns each, greedy) through the engine with the cache off and
     on, once per --cache-sharing scope (each simulated user its own owner, as each API
     key is): prompt tokens, prefill tokens computed, the ideal (every prefix of every
     earlier request reused, whoever sent it), time to first token p50/p95, and what the
     default scoped sharing (`system`) costs against sharing everything (`all`);
  B. the restore time of a P-token prefix (one node, and a path of P/64 nodes) against a
     fresh prefill of the same P tokens (goal <= 5%);
  C. cache bytes per distinct cached token, radix tree vs mlx-lm's LRUPromptCache fed the
     same finished conversations (goal <= 0.5x).

    python -m loadtests.bench_prefix [--model PATH | --random-dim 512 --random-layers 8]
                                     [--cache-sharing system,all]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from loadtests.benchmodel import add_model_args, resolve_model
from loadtests.figures import pct
from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest


def load_scenario():
    data = assets.prompts()
    return [s["text"] for s in data["system_prompts"]], data["questions"]


def lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run_scenario(engine, systems, questions, users: int, seed: int, max_tokens: int):
    """7 users in threads, each its own owner; returns one record per request."""
    tok = engine.loaded.tokenizer
    records, lock = [], threading.Lock()
    rng = random.Random(seed)
    plans = [(rng.randrange(len(systems)), rng.sample(questions, rng.randint(2, 4))) for _ in range(users)]

    def user(owner, system, qs):
        msgs = [{"role": "system", "content": systems[system]}]
        for q in qs:
            msgs.append({"role": "user", "content": q})
            prompt = tok.apply_chat_template(msgs, add_generation_prompt=True)
            t0 = time.perf_counter()
            final = engine.submit(ChatRequest(messages=msgs, sampling={"max_tokens": max_tokens}, owner=owner)).result()
            msgs.append({"role": "assistant", "content": final.text})
            seen = tok.apply_chat_template(msgs)
            with lock:
                records.append(
                    {
                        "prompt": prompt,
                        "seen": seen,
                        "t_submit": t0,
                        "t_done": time.perf_counter(),
                        "usage": final.usage,
                    }
                )

    threads = [threading.Thread(target=user, args=(f"user:{i}", *p)) for i, p in enumerate(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def ideal_cached(records) -> int:
    """Prompt tokens an ideal cache would serve: every prefix of every earlier request
    (its prompt once submitted, its whole conversation once finished) reused."""
    total = 0
    for r in records:
        earlier = [
            o["seen"] if o["t_done"] < r["t_submit"] else o["prompt"]
            for o in records
            if o is not r and o["t_submit"] < r["t_submit"]
        ]
        total += max((lcp(r["prompt"][:-1], s) for s in earlier), default=0)
    return total


def part_a(args, model_path, systems, questions):
    from radixchat.core.engine.engine import Engine

    print(
        f"\nA. seed scenario: {args.users} users (one owner each), 4 system prompts x 30 questions, 2-4 turns, greedy"
    )
    print(
        f"{'cache':>13} {'requests':>9} {'prompt tok':>11} {'prefilled':>10} {'ideal prefill':>14} "
        f"{'prefilled/prompt':>17} {'ttft p50 ms':>12} {'ttft p95 ms':>12} {'wall s':>7}"
    )
    runs = {}
    for sharing in [None, *args.cache_sharing]:
        settings = Settings(
            model=model_path,
            prefix_cache=sharing is not None,
            max_batch=16,
            **({"cache_sharing": sharing} if sharing else {}),
        )
        eng = Engine(settings).start()
        t0 = time.perf_counter()
        recs = run_scenario(eng, systems, questions, args.users, args.seed, args.max_tokens)
        wall = time.perf_counter() - t0
        eng.stop()
        prompt = sum(r["usage"].prompt_tokens for r in recs)
        cached = sum(r["usage"].cached_tokens for r in recs)
        ideal = prompt - ideal_cached(recs)
        ttft = [r["usage"].ttft_ms for r in recs if r["usage"].ttft_ms is not None]
        runs[sharing] = {"recs": recs, "prefilled": prompt - cached, "p50": pct(ttft, 0.5), "p95": pct(ttft, 0.95)}
        name = f"on, {sharing}" if sharing else "off"
        print(
            f"{name:>13} {len(recs):>9} {prompt:>11} {prompt - cached:>10} {ideal:>14} "
            f"{(prompt - cached) / prompt:>17.3f} {runs[sharing]['p50']:>12.1f} {runs[sharing]['p95']:>12.1f} "
            f"{wall:>7.1f}"
        )
    print("ideal prefill: as if every earlier prefix were reusable, whoever sent it (what `all` could reach)")
    scoped = [s for s in args.cache_sharing if s != "all"]
    if "all" in runs:
        base = runs["all"]
        for s in scoped:
            r = runs[s]
            print(
                f"{s} / all: prefilled {r['prefilled'] / base['prefilled']:.2f}x, "
                f"ttft p50 {r['p50'] / base['p50']:.2f}x, p95 {r['p95'] / base['p95']:.2f}x"
            )
    return runs[args.cache_sharing[0]]["recs"]


def part_b(model, sizes):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from radixchat.core.cache.kv import KVSegment, PrefixStore

    print("\nB. restore of a P-token prefix vs prefill of the same P tokens (medians of 5)")
    print(
        f"{'P':>6} {'prefill ms':>11} {'restore 1 node ms':>18} {'ratio':>7} {'restore P/64 nodes ms':>22} {'ratio':>7}"
    )
    rng = random.Random(0)
    for p in sizes:
        tokens = [rng.randrange(10, 1000) for _ in range(p)]

        def prefill():
            cache = make_prompt_cache(model)
            t0 = time.perf_counter()
            mx.eval(model(mx.array([tokens]), cache=cache), [c.state for c in cache])  # noqa: B023
            return time.perf_counter() - t0, cache

        times = []
        for _ in range(5):
            dt, cache = prefill()
            times.append(dt)
        pre = statistics.median(times)
        row = [p, pre * 1e3]
        for step in (p, 64):
            store = PrefixStore(model, 1 << 40)
            for end in range(step, p + 1, step):  # one node per step tokens
                store.tree.insert(tokens[:end], lambda s, e: KVSegment.from_caches(cache, store.trimmable, s, e))  # noqa: B023
            rs = []
            for _ in range(5):
                t0 = time.perf_counter()
                m, restored = store.lookup(tokens + [1])
                mx.eval([c.state for c in restored])
                rs.append(time.perf_counter() - t0)
                assert m.length == p and restored[0].keys.shape[2] == p
                store.release(m)
            row += [statistics.median(rs) * 1e3, statistics.median(rs) / pre]
        print(f"{row[0]:>6} {row[1]:>11.1f} {row[2]:>18.2f} {row[3]:>6.1%} {row[4]:>22.2f} {row[5]:>6.1%}")


def part_c(model, records):
    import mlx.core as mx
    from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache

    from radixchat.core.cache.kv import PrefixStore

    print("\nC. cache bytes per distinct cached token, same finished conversations fed to both")
    radix = PrefixStore(model, 1 << 40)
    lru = LRUPromptCache(max_size=10**6)
    trie: set[tuple] = set()
    for r in sorted(records, key=lambda r: r["t_done"]):
        seq = list(r["seen"])
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([seq]), cache=cache), [c.state for c in cache])
        radix.store(seq, cache)
        lru.insert_cache("m", seq, cache)  # what mlx_lm.server does after each request
        trie.update(tuple(seq[:i]) for i in range(1, len(seq) + 1))
    distinct = len(trie)
    rb, lb = radix.tree.bytes, lru.nbytes
    print(f"{'cache':>22} {'bytes':>12} {'bytes/token':>12}")
    print(f"{'radix (radixchat)':>22} {rb:>12} {rb / distinct:>12.0f}")
    print(f"{'LRUPromptCache':>22} {lb:>12} {lb / distinct:>12.0f}")
    print(f"radix / LRU: {rb / lb:.3f}x  ({distinct} distinct prefix tokens, {len(records)} conversations)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--users", type=int, default=7)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", default="256,1024")
    p.add_argument(
        "--cache-sharing",
        default="system,all",
        help="prefix-cache sharing scopes to run part A with, comma-separated (system, all, "
        "user); ratios are against `all` when it is listed",
    )
    args = p.parse_args()
    args.cache_sharing = [s.strip() for s in args.cache_sharing.split(",") if s.strip()]
    bad = [s for s in args.cache_sharing if s not in ("system", "all", "user")]
    if bad or not args.cache_sharing:
        p.error(f"--cache-sharing takes system, all or user (comma-separated), got {bad or 'nothing'}")
    reexec_with_openblas("auto")
    from radixchat.core.models.model import load_model

    model_path = resolve_model(args)
    systems, questions = load_scenario()
    loaded = load_model(model_path)
    print(
        f"model {model_path}: {loaded.num_params / 1e6:.1f}M params, {loaded.dtype}, "
        f"context {loaded.context_length}; blas {active_blas()}"
    )
    records = part_a(args, model_path, systems, questions)
    sizes = [s for s in map(int, args.sizes.split(",")) if s < loaded.context_length]
    part_b(loaded.model, sizes)
    part_c(loaded.model, records)


if __name__ == "__main__":
    main()
