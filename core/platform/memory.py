"""The process's memory: what it holds now, what it may take in all, and giving freed memory
back to the system.

`process_rss` reads the process's resident memory now and at its highest (Linux's /proc;
None elsewhere). `MlxMemory` holds MLX's allocator figures as the engine thread last read
them: it sets MLX's buffer-cache limit (--mlx-cache-bytes) when the engine starts and reads
the counters after every step; any thread reads its last `figures` (the seam's
MlxMemoryStats). `process_bound` states what the whole process will take: the weights, the
K/V budget, MLX's arrays beyond it (the decoding batch's spare room, a step's activations: a
measured share of the budget, core.config's ARRAYS_OVER_KV, capped by the batch's geometry), MLX's buffer cache at its
limit and a measured allowance for the rest (Python, Gradio, the tokenizer, glibc's
arenas). `give_back_memory` asks glibc to return what Python and the tokenizers freed
(`malloc_trim`): a process that let go of a model (core.engine.models unloads idle ones) would
keep its size otherwise; elsewhere (macOS, musl) it does nothing, those allocators return
large blocks themselves.

What the trim gives back, measured here (SmolLM2-135M float32 loaded and unloaded beside the
tiny model): 118 MB before, 736 MB loaded, 319 MB after the unload alone, 257 MB with MLX's buffer cache
cleared too, 143 MB with the trim as well. No MLX of its own: the engine thread, which alone
runs MLX, passes `mlx.core` in; everything else here runs in any thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import re
from pathlib import Path

from radixchat.core.cache.batch.layout import layout_tokens, over_cap, spare_bound
from radixchat.core.config import ARRAYS_OVER_KV, REST_BYTES, Settings, mlx_cache_limit


def process_rss() -> tuple[int, int] | None:
    """(resident bytes now, the most since start) of this process; None off Linux."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M))
    if "VmRSS" not in found:
        return None
    return int(found["VmRSS"]) * 1024, int(found.get("VmHWM", found["VmRSS"])) * 1024


def step_activations(vocab_size: int, step_tokens: int, max_batch: int) -> int:
    """A bound on one step's logits before any step ran: float32, one row per token the step
    computes (its share of --step-tokens or one per decoding stream), taken twice (the logits
    and the softmax or sort the sampler makes of them)."""
    return 2 * 4 * vocab_size * max(step_tokens, min(max_batch, 256), 1)


def arrays_beyond(kv_budget: int, step_bound: int, batch_bytes: int | None = None) -> int:
    """MLX's arrays beyond the weights and the K/V budget, as measured (ARRAYS_OVER_KV), and
    one step's logits. `batch_bytes` (`batch_geometry`) caps the first: the decoding batch's
    buffers cannot outgrow every row at the whole context with their spare room."""
    measured = int(ARRAYS_OVER_KV * kv_budget)
    return (measured if batch_bytes is None else min(measured, batch_bytes)) + step_bound


def batch_geometry(max_batch: int, context_length: int, kv_bytes_per_token: int) -> int:
    """The most the decoding batch's K/V buffers can take: as many rows as admission lets in
    (over the cap for owners below their share), every one at the whole context, with the
    spare room the buffers keep (core.cache.batch.layout.spare_bound)."""
    rows = over_cap(max_batch)
    return spare_bound(layout_tokens(rows, context_length), rows) * kv_bytes_per_token


def process_bound(weights: int, kv_budget: int, beyond: int, cache_limit: int) -> list[tuple[str, int]]:
    """What the whole process will take, part by part (bytes), its total last."""
    parts = [
        ("weights", weights),
        ("K/V budget", kv_budget),
        ("K/V and activations beyond it", beyond),
        ("MLX buffer cache limit", cache_limit),
        ("the rest (Python, Gradio, tokenizer, glibc)", REST_BYTES),
    ]
    return [*parts, ("total", sum(n for _, n in parts))]


def size_text(n: int) -> str:
    """Bytes as a person reads them: MiB below a GiB, GiB with two decimals above."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def bound_text(parts: list[tuple[str, int]]) -> str:
    """`process_bound`'s parts in one line, its total first."""
    *each, (_, total) = parts
    return f"{size_text(total)} at most: " + " + ".join(f"{name} {size_text(n)}" for name, n in each)


class MlxMemory:
    """MLX's memory as the engine thread reads it. Made by that thread as it starts, which
    sets the buffer-cache limit: by default MLX keeps freed buffers up to its memory limit on
    a Mac (most of the machine) and 32 MiB on a CPU, beyond any budget the server states."""

    def __init__(self, mx, settings: Settings, kv_bytes: int, vocab_size: int):
        self._mx = mx
        self.cache_limit = mlx_cache_limit(settings, kv_bytes)
        self.step_bound = step_activations(vocab_size, settings.step_tokens, settings.max_batch)
        mx.set_cache_limit(self.cache_limit)
        self._figures = dict.fromkeys(("active", "cache", "peak", "step_peak"), 0)
        self.sample()

    def sample(self) -> None:
        """Read MLX's counters (the engine thread, after a step). The peak is read and reset
        each time, so the rise within the last step shows apart from what stays alive; the
        most of either is kept. Several engines reset the one counter: each reads it first."""
        mx = self._mx
        active, cache, peak = mx.get_active_memory(), mx.get_cache_memory(), mx.get_peak_memory()
        mx.reset_peak_memory()
        last = self._figures
        self._figures = {
            "active": active,
            "cache": cache,
            "peak": max(last["peak"], peak, active),
            "step_peak": max(last["step_peak"], peak - active),
            "step_bound": self.step_bound,
            "cache_limit": self.cache_limit,
        }

    def figures(self) -> dict[str, int]:
        """The last sample (any thread: a dict replaced whole, never changed in place)."""
        return self._figures


@functools.cache
def _trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


def give_back_memory(clear_cache=None) -> None:
    """Collect what cycles still hold, have `clear_cache` (MLX's `mx.clear_cache`, called by
    the engine thread, which alone runs MLX) drop the buffers kept for reuse, and trim."""
    gc.collect()
    if clear_cache is not None:
        clear_cache()
    trim = _trim()
    if trim is not None:
        trim(0)
