"""How often a model loops, with and without a mild penalty: the share of replies that repeat
an 8-token run.

An engine in this process serves the model; each setting answers the same questions (the
bundled seed questions), all at once, with the model card's sampling (temperature, top_p)
and a fixed seed per question, --max-tokens each. A reply "loops" when some run of 8
tokens occurs twice in it. Prints, per setting: the share of replies that loop, the mean
share of repeated 8-grams, and the output tokens/s of the batch (what the penalty costs).

    python -m loadtests.bench_penalties [--model default] [--questions 24] [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import time

from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest

SETTINGS = {
    "off": {},
    "repetition 1.05": {"repetition_penalty": 1.05},
    "repetition 1.1": {"repetition_penalty": 1.1},
    "presence 0.5": {"presence_penalty": 0.5},
    "frequency 0.3": {"frequency_penalty": 0.3},
}


def loops(ids: list[int], n: int = 8) -> tuple[bool, float]:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    if not grams:
        return False, 0.0
    repeated = len(grams) - len(set(grams))
    return repeated > 0, repeated / len(grams)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--questions", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=160)
    args = p.parse_args()
    reexec_with_openblas("auto")
    from radixchat.core.engine.engine import Engine

    engine = Engine(Settings(model=args.model, warm_presets=False, cache_disk_bytes=0, max_batch=32)).start()
    try:
        card = dict(engine.info.sampling_defaults)
        questions = assets.prompts()["questions"][: args.questions]
        print(
            f"model {engine.info.model_id}, {len(questions)} questions, card sampling {card}, "
            f"max_tokens {args.max_tokens}"
        )
        for name, extra in SETTINGS.items():
            t0 = time.perf_counter()
            handles = [
                engine.submit(
                    ChatRequest(
                        messages=[{"role": "user", "content": q}],
                        sampling={**card, **extra, "seed": i, "max_tokens": args.max_tokens},
                    )
                )
                for i, q in enumerate(questions)
            ]
            finals = [h.result() for h in handles]
            wall = time.perf_counter() - t0
            stats = [loops(engine.tokenize(f.text)) for f in finals]
            tokens = sum(f.usage.generated_tokens for f in finals)
            share = sum(s[0] for s in stats) / len(stats)
            mean = sum(s[1] for s in stats) / len(stats)
            print(f"{name:>16}: {share:.0%} of replies loop, {mean:.1%} of 8-grams repeated, {tokens / wall:.1f} tok/s")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
