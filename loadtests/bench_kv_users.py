"""How many users' conversations stay cached in one K/V budget, at each --kv-bits (issue 54).

For each precision and each number of users U tried, a fresh in-process engine with a fixed
--cache-bytes: U users each hold a conversation of --turns turns (one of the seed scenario's
system prompts, shared by many, then the user's own questions and the model's replies of
--reply tokens), made round robin with --concurrent users waiting for a reply at once, as a
room of people reading and typing between turns; then each user, the one who spoke longest
ago first, sends the next message (max_tokens 1). A conversation stayed cached when that
request's cached tokens cover everything before its last message. U doubles from --start
until fewer than --keep of the conversations stay cached, then the gap is halved down to a
sixteenth. Printed per precision: each run's share and the tree's bytes per cached token;
then the most users with at least --keep of them cached.

The running batch shares the budget (up to 3/4 of it), so many users waiting for replies at
once leave less of it to the tree at every precision: --concurrent says how many. At 8 or 4
bits it holds its rows as --kv-batch says: values (their round trip at the model's dtype) or
codes (core.cache.batch.coded); `auto`, the server's default, is values on a CPU.

The baseline is 16 bits: --dtype bfloat16 by default (the model's weights and its K/V in
bfloat16, as on a GPU); on this CPU the server's own default is float32, whose K/V takes
twice the bytes (`--dtype float32` to see it).

    python -m loadtests.bench_kv_users [--model tiny] [--cache-bytes 32MiB] [--bits 16,8,4]
        [--start 8] [--concurrent 4] [--turns 2] [--reply 48] [--keep 0.9] [--kv-batch auto]

In this process, no server; no network.
"""

from __future__ import annotations

import argparse
import time

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.platform.blas import reexec_with_openblas


def conversation_cached(engine, users: int, turns: int, reply: int, concurrent: int) -> tuple[float, float]:
    """(share of users whose conversation stayed cached, tree bytes per cached token)."""
    from radixchat import assets
    from radixchat.core.seam.requests import ChatRequest, Finished, Sampling

    seed = assets.prompts()
    systems = [s["text"] for s in seed["system_prompts"]]
    questions = seed["questions"]
    chats = [[{"role": "system", "content": systems[u % len(systems)]}] for u in range(users)]
    history = [0] * users

    def note(u: int, handle) -> None:
        final = handle.result()
        assert isinstance(final, Finished), final
        chats[u].append({"role": "assistant", "content": final.text})
        history[u] = final.usage.prompt_tokens + final.usage.generated_tokens

    for turn in range(turns):
        asked = []
        for u, chat in enumerate(chats):
            if len(asked) >= concurrent:  # at most `concurrent` users waiting for a reply at once
                note(*asked.pop(0))
            chat.append({"role": "user", "content": f"{questions[(u * 7 + turn) % len(questions)]} (user {u})"})
            sampling = Sampling(max_tokens=reply, temperature=0.0)
            asked.append((u, engine.submit(ChatRequest(messages=list(chat), sampling=sampling, owner=f"user{u}"))))
        for u, handle in asked:
            note(u, handle)
    kept = 0
    for u, chat in enumerate(chats):  # the one who spoke longest ago first
        chat.append({"role": "user", "content": "Thanks. One more thing?"})
        final = engine.submit(
            ChatRequest(messages=list(chat), sampling=Sampling(max_tokens=1), owner=f"user{u}")
        ).result()
        assert isinstance(final, Finished), final
        # everything before the new message: the last turn's prompt and reply (the template
        # may close that reply a few tokens differently once another message follows)
        kept += final.usage.cached_tokens >= history[u] - 8
    tree = engine.stats().prefix_cache
    return kept / users, tree.bytes / max(1, tree.cached_tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.set_defaults(model="tiny")
    p.add_argument("--cache-bytes", default="32MiB")
    p.add_argument("--dtype", default="bfloat16", help="the model's dtype (its K/V's at 16 bits)")
    p.add_argument("--bits", default="16,8,4")
    p.add_argument("--start", type=int, default=8, help="the first number of users tried (then doubled)")
    p.add_argument("--concurrent", type=int, default=4, help="users waiting for a reply at once")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--reply", type=int, default=48, help="tokens in each reply")
    p.add_argument("--keep", type=float, default=0.9, help="the share that must stay cached")
    p.add_argument("--kv-batch", default="auto", choices=["auto", "codes", "values"])
    args = p.parse_args()
    reexec_with_openblas()
    from radixchat.core.config import Settings
    from radixchat.core.engine.engine import Engine

    path = resolve_model(args)
    started = time.perf_counter()
    print(
        f"model {path}; --cache-bytes {args.cache_bytes}; --dtype {args.dtype}; {args.turns} turns of "
        f"{args.reply} tokens, {args.concurrent} users waiting for a reply at once; --kv-batch {args.kv_batch}"
    )

    def share(bits: int, users: int) -> float:
        settings = Settings(
            model=path,
            dtype=args.dtype,
            kv_bits=bits,
            kv_batch=args.kv_batch,
            cache_bytes=args.cache_bytes,
            max_queue=1024,
            cache_sharing="system",
        )
        engine = Engine(settings).start(timeout=300)
        try:
            kept, per_token = conversation_cached(engine, users, args.turns, args.reply, args.concurrent)
        finally:
            engine.stop()
        print(
            f"  kv_bits {bits:>2}, {users:>4} users: {kept:.0%} stayed cached; the tree {per_token:,.0f} bytes a token",
            flush=True,
        )
        return kept

    most: dict[int, int] = {}
    for bits in [int(b) for b in args.bits.split(",")]:
        # doubling from --start until a run keeps less than --keep, then halving the gap
        good, bad = 0, args.start
        while share(bits, bad) >= args.keep:
            good, bad = bad, bad * 2
        while bad - good > max(1, good // 16):
            mid = (good + bad) // 2
            good, bad = (mid, bad) if share(bits, mid) >= args.keep else (good, mid)
        most[bits] = good
    print()
    print(f"| --kv-bits | most users with >= {args.keep:.0%} of conversations cached | against 16 bits |")
    print("|---|---|---|")
    for bits, n in most.items():
        ratio = f"{n / most[16]:.2f}x" if most.get(16) else "-"
        print(f"| {bits} | {n} | {ratio} |")
    print(f"\nwhole run {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
