"""What quantized K/V costs a model's answers, format by format (issue 54's quality figures).

Each format stores K/V as MLX's `mx.quantize` does (affine with a scale and a bias per group,
or a small float format: mxfp8, mxfp4, nvfp4) or as radixchat's --kv-bits does (8: int8,
4: nvfp4; core.cache.kv_format; int8-pow2 was 8 before int8), and attention reads them back
dequantized. The run stands in for a cache that holds them by writing each token's K and V
back as their quantize-then-dequantize round trip (the numbers a quantized cache attends
over) into mlx-lm's own `KVCache`, for every layer, in the prefill and every decode step.

Printed per format, against the model's own dtype (float32 on this CPU; the "bfloat16" row
is a 16-bit cache's own cost), or against a format's cache with --reference (bfloat16: a
16-bit cache, as on a GPU); --refs keeps the reference replies in a file between runs:
- K/V bytes a token, and the ratio to a 16-bit (bfloat16) cache's;
- greedy agreement, teacher-forced: the seed scenario's prompts (system prompt and question,
  the chat template) each get a greedy reply of --tokens tokens with the model's own K/V;
  then prompt and reply run once through each format's cache, and a position agrees where
  the format's top token is the reference's own top token there;
- free-running replies: for --free of the prompts, each format generates its own greedy
  reply; the share of replies identical to the reference's and their mean common prefix;
- held-out text: docs/DESIGN.md's opening (--held-out tokens, not a chat), the mean per-token
  log-probability of the text's own next token, the format's minus the reference's (0 is
  no loss; negative is worse), and the mean of its absolute value;
- idempotent: whether the round trip of a round trip gives the same numbers (a format whose
  round trip is idempotent can be cached from what a batch holds and read back exactly).

    python -m loadtests.bench_kv_quality [--model default | --model tiny | --random-dim 2048 --random-layers 16]
        [--replies 64] [--tokens 128] [--free 8] [--formats bfloat16,affine8,affine4,mxfp8,int8,int8-g64,int8-pow2,mxfp4,nvfp4]
        [--reference own | --reference bfloat16] [--refs FILE]

Runs in this process on the CPU (or MLX's default device), no server. No network.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.platform.blas import reexec_with_openblas

# name -> radixchat's format (core.cache.kv_format), or (MLX's mode, bits, group size) for
# one it does not offer; "bfloat16": a plain 16-bit cache
FORMATS = {
    "bfloat16": None,
    "affine8": ("affine", 8, 64),
    "affine4": ("affine", 4, 64),
    "mxfp8": "mxfp8",
    "int8": "int8",
    "int8-g64": "int8-g64",  # --kv-group-size 64 (128 needs heads of 128 numbers)
    "int8-g128": "int8-g128",
    "int8-pow2": "int8-pow2",
    "int8-pow2-g16": "int8-pow2-g16",
    "mxfp4": "mxfp4",
    "nvfp4": "nvfp4",
}


def _spec(fmt):
    from radixchat.core.cache.kv_format import FORMATS as OFFERED
    from radixchat.core.cache.kv_format import MXFP4, MXFP8, POW2_INT8, Pow2Int8, kv_format

    POW2_G16 = Pow2Int8(mode="int8-pow2-g16", group=16)
    groups = [kv_format(8, g) for g in (64, 128)]

    spec = FORMATS[fmt]
    if isinstance(spec, str):
        known = (*OFFERED.values(), *groups, MXFP8, MXFP4, POW2_INT8, POW2_G16)
        return next(f for f in known if spec in (f.name, f.mode))
    return spec


def _parts(mx, x, spec) -> list:
    if not isinstance(spec, tuple):
        return list(spec.encode(x))
    mode, bits, group = spec
    return [a for a in mx.quantize(x, group_size=group, bits=bits, mode=mode) if a is not None]


def round_trip(mx, x, fmt):
    """`x` as a cache in format `fmt` gives it back."""
    spec = _spec(fmt)
    if spec is None:
        return x.astype(mx.bfloat16).astype(x.dtype)
    if not isinstance(spec, tuple):
        return spec.round_trip(x)
    mode, bits, group = spec
    return mx.dequantize(*_parts(mx, x, spec), group_size=group, bits=bits, mode=mode).astype(x.dtype)


def stored_bytes(mx, x, fmt) -> int:
    """Bytes `x` takes in format `fmt`."""
    spec = _spec(fmt)
    return x.size * 2 if spec is None else sum(a.nbytes for a in _parts(mx, x, spec))


def caches(model, mx, fmt):
    """mlx-lm's caches for `model`, writing each new K and V as format `fmt` would give them
    back (None: the model's own)."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    if fmt is None:
        return make_prompt_cache(model)

    class RoundTrip(KVCache):
        def update_and_fetch(self, keys, values):
            return super().update_and_fetch(round_trip(mx, keys, fmt), round_trip(mx, values, fmt))

    made = make_prompt_cache(model)
    if not all(type(c) is KVCache for c in made):
        raise SystemExit("this benchmark covers models whose every layer is a plain KVCache")
    return [RoundTrip() for _ in made]


def greedy(model, mx, prompt: list[int], tokens: int, fmt) -> list[int]:
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=tokens, prompt_cache=caches(model, mx, fmt)):
        out.append(int(tok))
    return out


def forward_logprobs(model, mx, tokens: list[int], fmt):
    """Log-probabilities at every position of one forward over `tokens` through `fmt`'s cache."""
    logits = model(mx.array(tokens)[None], cache=caches(model, mx, fmt))[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _digest(tokens: list[int]) -> str:
    """Which held-out text a run read (the file changes with the code): compare runs by it."""
    import hashlib

    return hashlib.sha256(str(tokens).encode()).hexdigest()[:12]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--replies", type=int, default=64, help="prompts (and reference replies)")
    p.add_argument("--tokens", type=int, default=128, help="tokens in each reference reply")
    p.add_argument("--free", type=int, default=8, help="prompts each format also answers on its own")
    p.add_argument("--held-out", type=int, default=1024, help="tokens of held-out text")
    p.add_argument(
        "--reference", default="own", help="the cache the references use: own (the model's dtype) or a format's name"
    )
    p.add_argument("--refs", default="", help="a file keeping the reference replies between runs (made if missing)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of: " + ", ".join(FORMATS))
    args = p.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise SystemExit(f"unknown formats {unknown}: the known are {', '.join(FORMATS)}")
    reexec_with_openblas()
    import mlx.core as mx
    from mlx_lm import load

    from radixchat import assets

    path = resolve_model(args)
    model, tok = load(path)
    started = time.perf_counter()
    seed = assets.prompts()
    systems = [s["text"] for s in seed["system_prompts"]]
    questions = seed["questions"]
    prompts = []
    for i in range(args.replies):
        messages = [
            {"role": "system", "content": systems[i % len(systems)]},
            {"role": "user", "content": questions[i % len(questions)]},
        ]
        prompts.append(list(tok.apply_chat_template(messages, add_generation_prompt=True)))
    base = None if args.reference == "own" else args.reference  # the cache the references are made with
    cached = Path(args.refs) if args.refs else None
    key = json.dumps([path, args.reference, args.tokens, prompts])
    if cached is not None and cached.is_file() and json.loads(cached.read_text()).get("key") == key:
        refs = json.loads(cached.read_text())["refs"]
    else:
        refs = [greedy(model, mx, pr, args.tokens, base) for pr in prompts]
        if cached is not None:
            cached.write_text(json.dumps({"key": key, "refs": refs}))
    print(f"model {path}; device {mx.default_device()}; {args.replies} replies of up to {args.tokens} tokens")
    print(f"reference replies: {sum(map(len, refs)):,} tokens in {time.perf_counter() - started:.0f} s")

    # the references' own top tokens, teacher-forced, and the held-out text's log-probabilities
    ref_top = []
    for pr, reply in zip(prompts, refs):
        lp = forward_logprobs(model, mx, pr + reply, base)
        ref_top.append(mx.argmax(lp[len(pr) - 1 : -1], axis=-1))
    text = (Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md").read_text()
    held = list(tok.encode(text))[: args.held_out + 1]
    print(f"held-out text: the first {len(held) - 1:,} tokens of docs/DESIGN.md, sha256 {_digest(held)}")
    held_ref = forward_logprobs(model, mx, held, base)
    held_next = mx.array(held[1:])
    ref_lp = mx.take_along_axis(held_ref[:-1], held_next[:, None], axis=-1)[:, 0]

    # bytes a token (every layer's K and V) and idempotence, on K/V-shaped random numbers
    cfg = model.args
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    layers = len(model.layers)
    kv = mx.random.normal((1, heads, 256, head_dim)).astype(mx.bfloat16)
    per_token_16 = 2 * layers * heads * head_dim * 2
    print(f"K/V of a token at 16 bits: {per_token_16:,} bytes ({layers} layers, {heads} K/V heads of {head_dim})")
    print()
    print(
        "| format | K/V bytes a token | of 16-bit | greedy agreement, teacher-forced | "
        "free replies identical | mean common prefix | held-out log-prob, mean diff | mean abs diff | idempotent |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt in formats:
        spec = _spec(fmt)
        if spec is not None and not isinstance(spec, tuple) and not spec.fits(head_dim):
            print(f"| {fmt} | (its groups of {spec.group} do not divide heads of {head_dim}: not measured) |")
            continue
        per_token = round(2 * layers * stored_bytes(mx, kv, fmt) / kv.shape[2])
        once = round_trip(mx, kv, fmt)
        idem = bool(mx.array_equal(once, round_trip(mx, once, fmt)).item())
        agree = total = 0
        for pr, reply, top in zip(prompts, refs, ref_top):
            lp = forward_logprobs(model, mx, pr + reply, fmt)
            mine = mx.argmax(lp[len(pr) - 1 : -1], axis=-1)
            agree += int((mine == top).sum().item())
            total += top.size
        same = prefix = 0
        for pr, reply in list(zip(prompts, refs))[: args.free]:
            own_reply = greedy(model, mx, pr, args.tokens, fmt)
            same += own_reply == reply
            prefix += next(
                (i for i, (a, b) in enumerate(zip(own_reply, reply)) if a != b), min(len(own_reply), len(reply))
            )
        lp = forward_logprobs(model, mx, held, fmt)
        diff = mx.take_along_axis(lp[:-1], held_next[:, None], axis=-1)[:, 0] - ref_lp
        free = max(1, min(args.free, len(prompts)))
        print(
            f"| {fmt} | {per_token:,} | {per_token / per_token_16:.3f}x | {agree / total:.2%} ({agree:,} of {total:,}) | "
            f"{same} of {free} | {prefix / free:.1f} tokens | {diff.mean().item():+.4f} | {mx.abs(diff).mean().item():.4f} | "
            f"{'yes' if idem else 'no'} |",
            flush=True,
        )
    print(f"\nwhole run {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
