"""`radixchat doctor`: what this machine gives MLX, and what the configured model is.

Reports platform, versions, MLX's device, which BLAS is mapped, float32 matmul GFLOP/s
with the active BLAS and (on Linux) with the other one, measured in a child process since
a preload only takes effect at exec. Then, unless told not to, loads the model, states what
the whole server process will take in memory (core.platform.memory.process_bound) and times a
short prefill and decode; a GGUF model is named with its file, its tensor types and the
dtype it runs in, and one that cannot be loaded is a line, not a traceback. Runs in the
CLI's thread; printing is the CLI's job.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from radixchat.core.config import DISK_AUTO, KVBatch, Settings
from radixchat.core.models.model_size import DTYPE_BYTES
from radixchat.core.platform.blas import (
    REEXEC_MARK,
    active_blas,
    find_openblas,
    matmul_gflops,
    openblas_core,
    openblas_env,
)

if TYPE_CHECKING:  # (the doctor imports MLX only where it measures)
    from radixchat.core.cache.kv_format import KVFormat

_CHILD = "from radixchat.core.platform.blas import matmul_gflops; print(matmul_gflops())"


def _other_blas_gflops(current: str) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env[REEXEC_MARK] = "1"
    if current == "openblas":
        other = "bundled"
        env.pop("OPENBLAS_CORETYPE", None)
    else:
        lib = find_openblas()
        if lib is None:
            return "openblas", "not installed (apt-get install libopenblas0-pthread)"
        other, env["LD_PRELOAD"] = "openblas", lib
        env = openblas_env(env)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return other, f"failed: {out.stderr.strip().splitlines()[-1:]}"
    return other, f"{float(out.stdout):.1f}"


BACKENDS = ("mlx-cuda-13", "mlx-cuda-12", "mlx-metal", "mlx-cpu")  # the wheels that hold libmlx


def mlx_backend() -> str:
    """The backend wheels installed beside mlx; two at once overwrite each other's library
    (`.ci/setup --cuda` swaps mlx-cpu for mlx-cuda-13 rather than adding it)."""
    found = []
    for name in BACKENDS:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    if len(found) > 1:
        return " + ".join(found) + ": more than one backend, reinstall one (sh .ci/setup [--cuda])"
    return found[0] if found else "no backend wheel"


def device_line(device: str, info: dict) -> str:
    """MLX's device with the name its backend gives it (an NVIDIA GPU under mlx-cuda-13, a
    Mac's Apple GPU, the CPU's model) and its memory where the backend says."""
    name = info.get("device_name") or info.get("architecture")
    memory = info.get("total_memory") or info.get("memory_size")
    detail = ", ".join(
        part for part in (str(name) if name else "", f"{memory / 2**30:.0f} GiB" if memory else "") if part
    )
    return f"{device} ({detail})" if detail else device


def report(settings: Settings, load: bool = True) -> Iterator[tuple[str, str]]:
    import mlx.core as mx

    yield "platform", f"{platform.system()} {platform.machine()} ({os.cpu_count()} cpus)"
    yield "python", platform.python_version()
    yield "mlx / mlx-lm", f"{version('mlx')} ({mlx_backend()}) / {version('mlx-lm')}"
    yield "mlx device", device_line(str(mx.default_device()), mx.device_info())
    blas = active_blas()
    detail = f" ({os.environ.get('LD_PRELOAD')}, kernels {openblas_core()})" if blas == "openblas" else ""
    yield "blas", blas + detail
    yield f"matmul gflops ({blas})", f"{matmul_gflops():.1f}"
    if sys.platform.startswith("linux"):
        other, figure = _other_blas_gflops(blas)
        yield f"matmul gflops ({other})", figure
    from radixchat.core.cache.batch.offset_guard import ensure_offset_semantics

    for cls, verdict in ensure_offset_semantics().items():
        yield f"{cls}.offset", f"{verdict} (captured offsets keep their value)"
    link = yield from _group()
    if not load:
        if link is not None:
            yield "sharding", "decided when the model loads (tensor parallel where mlx-lm has it)"
        return
    from radixchat.core.models.gguf import GGUFError
    from radixchat.core.models.model import load_model

    t0 = time.perf_counter()
    yield "model", settings.model
    try:
        m = load_model(settings.model, settings.dtype, settings.context_length, link=link)
    except (GGUFError, FileNotFoundError) as e:
        yield "model load", f"failed: {e}"
        return
    except ValueError as e:  # a model mlx-lm cannot shard
        if link is None:
            raise
        yield "sharding", f"refused: {e}"
        return
    yield "model load", f"{time.perf_counter() - t0:.1f} s"
    if link is not None:
        yield (
            "sharding",
            (
                f"{link.sharding} parallel: each of {link.size} ranks holds 1/{link.size} of every "
                "layer's attention heads, MLP and K/V; rank 0 serves and sends each step's changes"
            ),
        )
    yield from _gguf(m)
    yield "parameters", f"{m.num_params / 1e6:.2f}M, {m.dtype}, {m.num_layers} layers"
    yield "context length", str(m.context_length)
    yield "eos tokens", str(sorted(m.tokenizer.eos_token_ids))
    yield from _batch_limit(m, settings)
    from radixchat.core.cache.kv import kv_bytes_per_token

    per_token = kv_bytes_per_token(m.model)
    yield "process memory", process_memory(m.weights_bytes, m.vocab_size, m.context_length, per_token, settings)
    yield from _speed(m)


def process_memory(weights: int, vocab_size: int, context_length: int, kv_per_token: int, settings: Settings) -> str:
    """What the whole process `serve` starts with these settings will take (this one model)."""
    from radixchat.core.config import kv_budget, mlx_cache_limit
    from radixchat.core.platform.memory import (
        arrays_beyond,
        batch_geometry,
        bound_text,
        process_bound,
        step_activations,
    )

    kv = kv_budget(settings)
    step = step_activations(vocab_size, settings.step_tokens, settings.max_batch)
    beyond = arrays_beyond(kv, step, batch_geometry(settings.max_batch, context_length, kv_per_token))
    parts = process_bound(weights, kv, beyond, mlx_cache_limit(settings, kv))
    return bound_text(parts) + " (what goes beyond the budget and the rest: measured, loadtests/bench_memory.py)"


def batch_bytes_per_token(
    fmt: KVFormat | None, bpt: int, dtype: str, kv_batch: KVBatch = "auto", slots: bool = True
) -> int | None:
    """A decoding batch's bytes a token where it would hold `fmt`'s codes here (`bpt`: at
    the model's `dtype`); None where it would hold values. (The model's attention is taken to
    be routable, as every mlx-lm model's built on its `scaled_dot_product_attention` is.)"""
    import mlx.core as mx

    from radixchat.core.engine.step.coded_attention import holds_codes

    mxdtype = getattr(mx, dtype, mx.float32)
    if fmt is None or not holds_codes(kv_batch, fmt, mxdtype, slots, routed=True):
        return None
    vector = sum(p.nbytes for p in fmt.planes(mx.zeros((1, 1, 1, 128), mxdtype)))  # 128: every group divides it
    return bpt * vector // (128 * DTYPE_BYTES.get(dtype, 4))


def kv_precision(
    fmt: KVFormat | None, bpt: int, dtype: str, model: Any = None, kv_batch: KVBatch = "auto", slots: bool = True
) -> str:
    """What --kv-bits (and --kv-group-size: `fmt`) makes of K/V: the batch's bytes a token
    (codes or values: --kv-batch) and the prefix cache's; or, where `model`'s heads do not
    split into the format's groups, that the server refuses it."""
    from radixchat.core.cache.rounded import refusal

    if fmt is None:
        return f"{dtype} everywhere (--kv-bits 16)"
    if model is not None and (why := refusal(model, fmt)) is not None:
        return f"refused (the server will not start): {why}"
    numbers = bpt // DTYPE_BYTES.get(dtype, 4)  # K's and V's, every layer
    cached = round(fmt.bytes_per(numbers))
    held = f"{dtype} ({bpt:,} bytes a token)"
    if (coded := batch_bytes_per_token(fmt, bpt, dtype, kv_batch, slots)) is not None:
        held = f"codes ({coded:,} bytes a token, {coded / bpt:.2f}x; --kv-batch {kv_batch})"
    return (
        f"{fmt.name} (--kv-bits {fmt.bits}, {fmt.group} numbers a scale): every step attends over it; the "
        f"decoding batch holds it as {held}, the prefix cache and its disk tier as {fmt.name} "
        f"({cached:,} bytes a token, {cached / bpt:.2f}x)"
    )


def _group():
    """Under mlx.launch: the group, its backend and each rank (every rank runs the doctor in
    step, since loading and timing the model run collectives; the CLI prints rank 0's)."""
    from radixchat.core.engine.shard.lockstep import join, launched

    if launched() is None:
        return None
    link = join("tensor")
    link.hello()
    yield "mlx.launch group", f"{link.size} ranks, backend {link.backend}"
    for r in link.ranks:
        yield f"rank {r.rank}", f"{r.host}, pid {r.pid}"
    return link


def _batch_limit(m, settings: Settings) -> Iterator[tuple[str, str]]:
    """What the K/V budget lets the engine run at once (its working batch limit)."""
    from radixchat.core.cache.batch.layout import batch_room
    from radixchat.core.cache.kv import kv_bytes_per_token
    from radixchat.core.cache.kv_format import kv_format
    from radixchat.core.config import kv_budget

    budget, bpt = kv_budget(settings), kv_bytes_per_token(m.model)
    slots = settings.kv_slots and bool(settings.step_tokens)
    fmt = kv_format(settings.kv_bits, settings.kv_group_size)
    batch_bpt = batch_bytes_per_token(fmt, bpt, m.dtype, settings.kv_batch, slots) or bpt
    tokens = batch_room(budget) // batch_bpt
    per_seq = 512 + settings.max_tokens
    yield "kv budget", f"{budget / 2**30:.2f} GiB (--cache-bytes), {batch_bpt:,} bytes per token of the batch"
    yield "kv precision", kv_precision(fmt, bpt, m.dtype, m.model, settings.kv_batch, slots)
    yield (
        "batch limit",
        (
            f"{tokens:,} tokens of running sequences: {min(settings.max_batch, tokens // per_seq)} "
            f"of {per_seq} tokens (512 prompt + --max-tokens), at most --max-batch "
            f"{settings.max_batch}"
        ),
    )
    yield (
        "engine step",
        (
            f"{settings.step_tokens} tokens (--step-tokens): each decoding stream one, new "
            f"prompts prefill in chunks in the rest"
            if settings.step_tokens
            else "mlx-lm's order (--step-tokens 0): decode, then a whole prefill step"
        ),
    )
    yield from _disk_tier(settings)
    yield (
        "decoding k/v",
        (
            "slots with spare room (--kv-slots): a join or a leave copies one row"
            if settings.kv_slots and settings.step_tokens
            else "mlx-lm's BatchKVCache: a join or a leave copies the whole batch"
        ),
    )
    import mlx.core as mx

    yield (
        "model ops",
        (
            "attention, SwiGLU and RoPE in CPU-fast forms (--cpu-ops, core/engine/step/cpu_ops.py)"
            if settings.cpu_ops and mx.default_device() == mx.cpu
            else "mlx-lm's own" + (" (--no-cpu-ops)" if not settings.cpu_ops else " (GPU)")
        ),
    )


def _disk_tier(settings: Settings) -> Iterator[tuple[str, str]]:
    """The prefix cache's disk tier: where, its limit now, and what lies there (all models)."""
    from radixchat.core.cache.disk.budget import limit_now
    from radixchat.core.cache.disk.tier import cache_folder, disk_usage

    auto = settings.cache_disk_bytes == DISK_AUTO
    if not settings.cache_disk_bytes:
        yield "disk cache", "off (--cache-disk-bytes 0)"
        return
    used, files = disk_usage(settings)
    limit = limit_now(cache_folder(settings), settings.cache_disk_bytes, used)
    how = "auto: a quarter of its own and the free bytes" if auto else f"{settings.cache_disk_bytes / 2**20:.0f} MiB"
    yield (
        "disk cache",
        (
            f"{cache_folder(settings)}: {used / 2**20:.1f} MiB in {files} entries of "
            + (f"{limit / 2**20:.0f} MiB now" if limit is not None else "? MiB (free space unknown)")
            + f" (--cache-disk-bytes {how}; a tenth of the disk, at least 1 GiB, stays free)"
        ),
    )


def _gguf(m) -> Iterator[tuple[str, str]]:
    if m.gguf is None:
        return
    yield "gguf file", m.gguf.file
    yield "gguf converted into", m.gguf.folder
    yield "gguf tensor types", m.gguf.types_line()
    packed = any(t in m.gguf.tensor_types for t in ("Q4_0", "Q4_1", "Q8_0"))
    unpacked = packed and "packed" not in m.runs_as
    yield "runs in", m.runs_as + (" (dequantized at load)" if unpacked else "")


def _speed(m) -> Iterator[tuple[str, str]]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    n = min(256, m.context_length // 2)
    tokens = mx.array([[i % 100 + 10 for i in range(n)]])
    cache = make_prompt_cache(m.model)
    t0 = time.perf_counter()
    logits = m.model(tokens, cache=cache)
    mx.eval(logits)
    yield "prefill", f"{n / (time.perf_counter() - t0):.0f} tok/s ({n} tokens)"
    y = mx.argmax(logits[:, -1:], axis=-1)
    t0 = time.perf_counter()
    steps = 32
    for _ in range(steps):
        y = mx.argmax(m.model(y, cache=cache)[:, -1:], axis=-1)
        mx.eval(y)
    yield "decode (1 stream)", f"{steps / (time.perf_counter() - t0):.0f} tok/s"
