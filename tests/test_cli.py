"""The `radixchat` command as a user runs it: real subprocesses, a real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from radixchat.core.platform.blas import REEXEC_MARK, coretype_for_cpu, find_openblas
from radixchat.core.seam.protocol import ModelInfo
from radixchat.webui.cli.main import model_line
from tests.support.procs import RADIXCHAT, free_port


def run(*args, env=None, timeout=120):
    return subprocess.run(
        [RADIXCHAT, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize(
    "args, env, name",
    [
        (["serve", "--port", "abc"], {}, "--port"),
        (["serve", "--max-batch", "0"], {}, "--max-batch"),
        (["serve"], {"RADIXCHAT_CACHE_BYTES": "-1"}, "RADIXCHAT_CACHE_BYTES"),
        (["ask", "hi", "--dtype", "float8"], {}, "--dtype"),
    ],
)
@pytest.mark.slow
def test_invalid_setting_is_one_line_naming_it(args, env, name):
    out = run(*args, env=env)
    assert out.returncode == 2  # a usage error, as argparse's own
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow
def test_byte_flags_take_human_sizes():
    # a bad port stops start-up before anything loads; the size beside it is not named
    out = run("serve", "--port", "abc", "--cache-disk-bytes", "2e9", "--memory-bytes", "4GiB")
    assert out.returncode != 0 and "port" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "cache_disk_bytes" not in out.stderr and "memory_bytes" not in out.stderr, out.stderr
    out = run("serve", "--cache-disk-bytes", "2X")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "--cache-disk-bytes" in lines[0] and "'2X'" in lines[0] and "2GiB" in lines[0], lines[0]


@pytest.mark.slow
def test_serve_help_says_what_sizes_look_like():
    out = run("serve", "--help")
    assert out.returncode == 0 and "--cache-disk-bytes" in out.stdout
    assert "2GiB" in out.stdout and "2e9" in out.stdout, out.stdout


@pytest.mark.slow
def test_missing_model_is_a_clear_error(tmp_path):
    out = run("ask", "hi", "--model", str(tmp_path / "nothing"))
    assert out.returncode != 0 and "no mlx-lm model folder" in out.stderr
    assert "Traceback" not in out.stderr and "terminate called" not in out.stderr


@pytest.mark.slow
def test_ask_streams_reply_and_timings(tiny_model_dir):
    out = run("ask", "What is a list?", "--model", str(tiny_model_dir), "--max-new-tokens", "7")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "[length]" in out.stderr and "generated 7 tok" in out.stderr
    assert "first token" in out.stderr and "tok/s" in out.stderr


@pytest.mark.slow
def test_ask_goes_to_a_server_already_running_at_its_port(keyed):
    server, key, _, _ = keyed
    port = str(server.port)
    t0 = time.monotonic()
    out = run("ask", "What is a list?", "--port", port, "--api-key", key, "--max-new-tokens", "5")
    took = time.monotonic() - t0
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    assert f"asked the server at http://127.0.0.1:{port}" in out.stderr and "generated 5 tok" in out.stderr
    print(f"ask through the server: {took:.1f} s")
    # the key from the environment too; none at all says how to give one, or to load here
    assert run("ask", "hi", "--port", port, "--max-new-tokens", "2", env={"RADIXCHAT_API_KEY": key}).returncode == 0
    out = run("ask", "hi", "--port", port, env={"RADIXCHAT_API_KEY": ""})
    assert out.returncode != 0 and "--api-key" in out.stderr and "--local" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # --max-tokens is the reply's length there too (it was ignored: 192 tokens for --max-tokens 40)
    out = run("ask", "What is a list?", "--port", port, "--api-key", key, "--max-tokens", "3", "--step-tokens", "64")
    assert out.returncode == 2 and "--step-tokens only sets up a model loaded here" in out.stderr, out.stderr
    out = run("ask", "What is a list?", "--port", port, "--api-key", key, "--max-tokens", "3")
    assert out.returncode == 0 and "generated 3 tok" in out.stderr, out.stderr


@pytest.mark.slow
def test_doctor_reports_blas_and_model(tiny_model_dir):
    out = run("doctor", "--model", str(tiny_model_dir))
    assert out.returncode == 0, out.stderr
    assert "matmul gflops" in out.stdout and "parameters" in out.stdout
    assert "BatchKVCache.offset          ok" in out.stdout
    assert "256 tokens (--step-tokens)" in out.stdout
    # what the whole server process will take, part by part (tests/test_process_memory.py checks the sum)
    [memory] = [x for x in out.stdout.splitlines() if x.startswith("process memory")]
    parts = ("weights", "K/V budget", "activations beyond it", "MLX buffer cache limit", "the rest")
    assert all(part in memory for part in parts) and "at most" in memory, memory
    if sys.platform.startswith("linux"):
        assert "blas" in out.stdout
        if find_openblas() and coretype_for_cpu():
            assert f"kernels {coretype_for_cpu()}" in out.stdout
        # both BLAS figures are printed, one per line
        assert out.stdout.count("matmul gflops") == 2


def serve(model_dir, tmp_path) -> tuple[subprocess.Popen, int]:
    """`radixchat serve` on a free port, its output (stdout and stderr) readable as text."""
    port = free_port()
    cmd = [RADIXCHAT, "serve", "--model", str(model_dir), "--port", str(port), "--db", str(tmp_path / "t.db")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), port


@pytest.mark.slow
def test_serve_answers_health_and_stops_cleanly(tiny_model_dir, tmp_path):
    proc, port = serve(tiny_model_dir, tmp_path)
    try:
        deadline = time.time() + 120
        body = None
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    body = json.load(r)
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.3)
        assert body is not None
        assert body["engine_alive"] and body["model_loaded"] and body["queue_depth"] == 0
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "terminate called" not in out


@pytest.mark.slow
def test_the_banner_comes_once_the_socket_listens(tiny_model_dir, tmp_path):
    """A script that waits for "open http://..." connects at once and is answered."""
    proc, port = serve(tiny_model_dir, tmp_path)
    try:
        seen = []
        for line in proc.stdout:  # ends if the server exits
            seen.append(line)
            if f"open http://127.0.0.1:{port}" in line:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                    assert json.load(r)["engine_alive"]
                break
        else:
            raise AssertionError("".join(seen))
        assert any("context" in x for x in seen[:-1])  # the model's line comes first
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_the_start_up_line_names_the_k_v_precision_where_it_is_not_the_models_dtype():
    plain = ModelInfo("m", num_params=135_000_000, dtype="float32", context_length=8192, vocab_size=10)
    assert model_line(plain) == "m (135.0M params, float32, context 8192)"
    at8 = ModelInfo("m", 135_000_000, "float32", 8192, 10, kv_bits=8, kv_group=64)
    assert model_line(at8) == "m (135.0M params, float32, context 8192, K/V at 8 bits (a scale per 64 numbers))"
    at4 = ModelInfo("m", 135_000_000, "float32", 8192, 10, kv_bits=4)
    assert model_line(at4).endswith("context 8192, K/V at 4 bits)")


@pytest.mark.parametrize(
    "flags, core",
    [
        ("fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512dq avx512cd", "SkylakeX"),
        ("fpu sse2 avx avx2 fma avx512f", "Haswell"),  # partial AVX-512: not enough for SkylakeX
        ("fpu sse2 avx", "SandyBridge"),
        ("fpu sse2", None),
    ],
)
def test_openblas_kernel_family_from_cpu_flags(flags, core):
    assert coretype_for_cpu(f"processor\t: 0\nflags\t\t: {flags}\n") == core


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is Linux's CPU BLAS")
def test_openblas_workers_sleep_between_matmuls():
    """A server steps back to back: an OpenBLAS worker that spins waiting for the next
    matmul takes a core the event loop and the preparation threads need (core.platform.blas).
    After the re-exec, a process idle after a matmul costs next to no CPU."""
    assert find_openblas(), "the test setup installs libopenblas0-pthread"
    code = (
        "from radixchat.core.platform.blas import reexec_with_openblas\n"
        "reexec_with_openblas('openblas')\n"
        "import time, mlx.core as mx\n"
        "a = mx.random.normal((768, 768))\n"
        "for _ in range(5): mx.eval(a @ a)\n"
        "t = time.process_time(); time.sleep(0.4); print(time.process_time() - t)\n"
    )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_") and k not in ("LD_PRELOAD", REEXEC_MARK)
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    idle_cpu = float(out.stdout.split()[-1])
    assert idle_cpu < 0.03, f"{idle_cpu:.3f} s of CPU in 0.4 s of idling: OpenBLAS's workers spin"
