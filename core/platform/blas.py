"""Which BLAS MLX uses on a Linux CPU, and how to switch to Debian's OpenBLAS.

The mlx[cpu] wheel bundles a reference BLAS (about 8 GFLOP/s float32 on this kind of
machine); preloading Debian's libopenblas makes the same matmul many times faster. The
loader only honours LD_PRELOAD at exec time, so `reexec_with_openblas` restarts the
current process with it set. On virtual CPUs that report a generic model, OpenBLAS's own
detection falls back to its oldest x86-64 kernels ("Prescott", ~30 GFLOP/s here); the
re-exec then names the kernel family the CPU's flags support (OPENBLAS_CORETYPE:
SkylakeX for AVX-512, ~160 GFLOP/s here), unless the environment already names one.
The re-exec also sets OPENBLAS_THREAD_TIMEOUT (unless set): OpenBLAS's worker threads
otherwise spin (sched_yield) for about 2^28 cycles after each matmul waiting for the next,
and a server steps back to back, so they never sleep: under a flood of grammar-constrained
requests on 2 cores its one worker took 56-71% of a core, most of it spinning, beside the
event loop, the preparation threads and llguidance's that needed it. At the floor (2^4
cycles) it sleeps at once: ~10% of a core there, the same decode and prefill speed on a
quiet machine (BENCHMARKS.md, "OpenBLAS's spinning workers").
Measuring is `matmul_gflops`. Nothing here applies on macOS, where MLX runs on the GPU.
"""

from __future__ import annotations

import glob
import os
import sys
import time
import warnings

REEXEC_MARK = "RADIXCHAT_BLAS_REEXEC"
THREAD_TIMEOUT = "4"  # log2 of the cycles an idle OpenBLAS worker spins before it sleeps (OpenBLAS's floor)
_CANDIDATES = (
    "/usr/lib/*-linux-gnu/libopenblas.so.0",
    "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)


def find_openblas() -> str | None:
    for pattern in _CANDIDATES:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def coretype_for_cpu(cpuinfo: str | None = None) -> str | None:
    """The OpenBLAS kernel family this CPU's flags support, or None if unknown."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    if "avx" in flags:
        return "SandyBridge"
    return None


def openblas_core() -> str | None:
    """The kernel family the loaded OpenBLAS uses (None when it is not loaded)."""
    if active_blas() != "openblas":
        return None
    import ctypes

    try:
        lib = ctypes.CDLL(find_openblas() or "libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return None


def openblas_env(env: dict) -> dict:
    """`env` plus OPENBLAS_CORETYPE for this CPU and OPENBLAS_THREAD_TIMEOUT, unless it
    already names them."""
    core = coretype_for_cpu()
    if core and "OPENBLAS_CORETYPE" not in env:
        env = {**env, "OPENBLAS_CORETYPE": core}
    return {"OPENBLAS_THREAD_TIMEOUT": THREAD_TIMEOUT, **env}


def active_blas() -> str:
    """Name the BLAS this process has mapped: 'openblas', 'bundled' or 'metal'."""
    if sys.platform == "darwin":
        return "metal"
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    return "openblas" if "libopenblas" in maps else "bundled"


def reexec_with_openblas(mode: str = "auto") -> None:
    """Restart this process with OpenBLAS preloaded, when on Linux and asked for.

    Returns (does nothing) when not on Linux, when mode is 'bundled', when it is already
    preloaded, or when the library is missing (with a warning; mode 'openblas' then exits).
    """
    if not sys.platform.startswith("linux") or mode == "bundled":
        return
    preload = os.environ.get("LD_PRELOAD", "")
    if "libopenblas" in preload or os.environ.get(REEXEC_MARK):
        return
    lib = find_openblas()
    if lib is None:
        msg = (
            "OpenBLAS not found (apt-get install libopenblas0-pthread); "
            "MLX falls back to its bundled BLAS, about 25x slower on the CPU"
        )
        if mode == "openblas":
            sys.exit(f"radixchat: {msg}")
        warnings.warn(msg, stacklevel=2)
        return
    env = openblas_env(dict(os.environ, LD_PRELOAD=f"{lib}:{preload}" if preload else lib, **{REEXEC_MARK: "1"}))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def matmul_gflops(n: int = 512, repeats: int = 5) -> float:
    """Median float32 matmul throughput in GFLOP/s on MLX's default device."""
    import mlx.core as mx

    mx.random.seed(0)
    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a @ b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(a @ b)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e9
