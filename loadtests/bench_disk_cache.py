"""Benchmark the prefix cache's disk tier: restarts, restore against prefill, bytes per token.

Prints, in one run on one model:
  A. after a restart, time to first token of a request whose ~1,500-token prefix was cached
     (and written to disk) before the restart, against the same request cold (an empty
     cache): engines in this process, a fresh cache folder per round, medians of --rounds
     (goal <= 0.2x). The files are still in the OS page cache (nothing here drops it);
  B. restoring a P-token prefix from disk (reader thread: read, sha256, parse; engine
     thread: arrays; then the restore itself) against a fresh prefill of the same P tokens,
     P = 256, 1024, 4096 (medians of 5);
  C. bytes on disk per cached token against the memory tier's.

    python -m loadtests.bench_disk_cache [--model tiny | --model PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest


def long_system_prompt(tokenizer, target: int) -> str:
    """A system prompt of about `target` tokens, from the bundled questions."""
    qs = assets.prompts()["questions"]
    text, i = "You are a patient Python tutor. Reference notes follow. ", 0
    while len(tokenizer.apply_chat_template([{"role": "system", "content": text}])) < target:
        text += f"Note {i}: {qs[i % len(qs)]} "
        i += 1
    return text


def engine(model: str, folder: Path):
    from radixchat.core.engine.engine import Engine

    return Engine(
        Settings(model=model, db=folder / "radixchat.db", cache_disk_bytes=8 << 30, warm_presets=False, max_tokens=8)
    ).start(timeout=600)


def settle(eng, timeout: float = 120) -> dict:
    """Until the disk tier is open and everything stored is on disk; its summary."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = eng.stats().disk_cache
        if d is not None and d.waiting == d.backlog_bytes == d.reading == 0:
            return d
        time.sleep(0.05)
    raise SystemExit("the disk tier did not settle")


def part_a(model: str, rounds: int, prefix_tokens: int) -> None:
    print(
        f"\nA. time to first token after a restart, ~{prefix_tokens}-token prefix cached before it, "
        f"vs the same request cold (medians of {rounds})"
    )
    cold, warm, memory, cached, opening = [], [], [], [], []
    for r in range(rounds):
        folder = Path(tempfile.mkdtemp(prefix="bench-disk-"))
        first = engine(model, folder)
        try:
            system = long_system_prompt(first.loaded.tokenizer, prefix_tokens)
            msgs = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Round {r}: what does a list comprehension do?"},
            ]
            settle(first)
            f = first.submit(ChatRequest(messages=msgs, owner="alice")).result()
            cold.append(f.usage.ttft_ms)
            settle(first)
            h = first.submit(ChatRequest(messages=msgs, owner="alice")).result()
            memory.append(h.usage.ttft_ms)  # the same, from the memory tier
        finally:
            first.stop()
        second = engine(model, folder)  # the restart: same folder, nothing in memory
        try:
            d = settle(second)  # the tier opens in the engine's first turn (model hash, keys)
            opening.append((d.fingerprint_s + d.open_s) * 1e3)
            g = second.submit(ChatRequest(messages=msgs, owner="alice")).result()
            warm.append(g.usage.ttft_ms)
            cached.append(g.usage.cached_tokens)
            assert g.text == f.text, "a restored prefix must give the same greedy reply"
        finally:
            second.stop()
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"prompt {f.usage.prompt_tokens} tokens, {statistics.median(cached):.0f} served from disk after the restart")
    print(
        f"ttft cold {c:.0f} ms   after restart {w:.0f} ms   ratio {w / c:.3f}x (goal <= 0.2x)   "
        f"from memory (no restart) {statistics.median(memory):.0f} ms"
    )
    print(
        f"opening the disk tier at start-up (model hash + keys from the files): "
        f"{statistics.median(opening):.0f} ms, before the first request"
    )


def part_b(model, sizes: list[int]) -> list[tuple[int, int, int]]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from radixchat.core.cache.disk.tier import DiskTier
    from radixchat.core.cache.kv import PrefixStore

    print("\nB. restore of a P-token prefix from disk vs its prefill (medians of 5)")
    print(f"{'P':>6} {'prefill ms':>11} {'disk ms':>9} {'(reader':>8} {'engine':>7} {'restore)':>9} {'ratio':>7}")
    rng = random.Random(0)
    sizes_out = []
    for p in sizes:
        tokens = [rng.randrange(10, 1000) for _ in range(p)]
        pre = []
        for _ in range(5):
            cache = make_prompt_cache(model)
            t0 = time.perf_counter()
            mx.eval(model(mx.array([tokens]), cache=cache), [c.state for c in cache])
            pre.append(time.perf_counter() - t0)
        store = PrefixStore(model, 1 << 40)
        tier = DiskTier(
            Path(tempfile.mkdtemp(prefix="bench-disk-")) / "m", 1 << 40, "bench", "all", store, wake=lambda: None
        )
        tier.open(store.tree, tag_of=lambda owner: 0)
        store.disk = tier
        store.store(tokens, cache)
        while tier.todo or tier.backlog:
            tier.tick()
            time.sleep(0.001)
        mem_bytes = store.tree.bytes
        total, reader, eng, restore = [], [], [], []
        for _ in range(5):
            store.tree.budget = 0
            store.tree.fit()  # spill it: the K/V is on disk only now
            assert store.tree.disk_tokens == p
            store.tree.budget = 1 << 40
            r0, l0 = tier.stats.read_s, tier.stats.load_s
            t0 = time.perf_counter()
            tier.want(store.tree.walk(tokens).path)
            while store.tree.disk_tokens:
                tier.wait_io(0.01)
                tier.tick()
            t1 = time.perf_counter()
            m, restored = store.lookup(tokens + [1])
            mx.eval([c.state for c in restored])
            t2 = time.perf_counter()
            assert m.length == p and restored[0].keys.shape[2] == p
            store.release(m)
            total.append(t2 - t0)
            reader.append(tier.stats.read_s - r0)
            eng.append(tier.stats.load_s - l0)
            restore.append(t2 - t1)
        med = statistics.median
        print(
            f"{p:>6} {med(pre) * 1e3:>11.1f} {med(total) * 1e3:>9.1f} {med(reader) * 1e3:>8.1f} "
            f"{med(eng) * 1e3:>7.1f} {med(restore) * 1e3:>9.1f} {med(total) / med(pre):>6.1%}"
        )
        sizes_out.append((p, mem_bytes, tier.bytes))
        tier.close()
    return sizes_out


def part_c(rows: list[tuple[int, int, int]]) -> None:
    print("\nC. bytes per cached token, disk tier vs memory tier (same entries)")
    print(f"{'P':>6} {'memory B/token':>15} {'disk B/token':>13} {'disk/memory':>12}")
    for p, mem, disk in rows:
        print(f"{p:>6} {mem / p:>15.0f} {disk / p:>13.0f} {disk / mem:>11.3f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefix-tokens", type=int, default=1500)
    p.add_argument("--sizes", default="256,1024,4096")
    args = p.parse_args()
    reexec_with_openblas("auto")
    from radixchat.core.models.model import load_model

    model_path = resolve_model(args)
    loaded = load_model(model_path)
    print(
        f"model {model_path}: {loaded.num_params / 1e6:.1f}M params, {loaded.dtype}, "
        f"context {loaded.context_length}; blas {active_blas()}"
    )
    part_a(model_path, args.rounds, min(args.prefix_tokens, loaded.context_length - 64))
    sizes = [s for s in map(int, args.sizes.split(",")) if s < loaded.context_length]
    part_c(part_b(loaded.model, sizes))


if __name__ == "__main__":
    main()
