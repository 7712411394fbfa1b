"""Server processes for tests, load tests and benchmarks: the `radixchat` command of this
environment, a free loopback port, starting a command and waiting until it answers, and its
peak memory."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# the console script installed beside this interpreter (the PATH's first one otherwise)
RADIXCHAT = shutil.which("radixchat", path=os.path.dirname(sys.executable)) or "radixchat"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(n: int) -> int:
    """The first of `n` consecutive loopback ports that are all free now, for `mlx.launch
    --backend ring --starting-port`, whose ranks bind base, base+1, ... without SO_REUSEADDR.
    The block lies below the kernel's ephemeral range: there, the ports next to a free one are
    often held by the suite's own closed client connections (TIME_WAIT), and a rank could not
    bind (EADDRINUSE)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # macOS's ephemeral range starts at 49152; this stays below it too
    for _ in range(200):
        base = random.randrange(10000, low - n)
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free loopback ports below {low}")


def start_and_wait(
    cmd: list[str], ready_url: str, log: Path, env=None, timeout: float = 300, cwd=None, group: bool = False
) -> subprocess.Popen:
    """Start `cmd` (output to `log`); return once `ready_url` answers 200, else exit. With
    `group` it leads a process group of its own, which `stop_process` ends as a whole (mlx.launch
    leaves its ranks running when it alone is stopped)."""
    proc = subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=group
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} failed to start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not answer {ready_url} within {timeout:.0f} s")


def peak_rss_mb(pid: int) -> float:
    """Peak resident memory of a live process (Linux /proc; NaN elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else float("nan")


def start_radixchat(model: str, db: Path, port: int, log: Path, *flags: str, timeout: float = 300) -> subprocess.Popen:
    """`radixchat serve` of this environment on 127.0.0.1:`port`, once /health answers."""
    cmd = [
        str(Path(sys.executable).with_name("radixchat")),
        "serve",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        str(db),
        *flags,
    ]
    return start_and_wait(cmd, f"http://127.0.0.1:{port}/health", log, timeout=timeout)


def stop_process(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Ask a server to stop (SIGTERM; its whole group if it leads one), and kill it if it has
    not within `timeout`."""
    group = os.getpgid(proc.pid) == proc.pid if proc.poll() is None else False
    signal_it = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    signal_it(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_it(signal.SIGKILL)
        proc.wait()
