"""Server processes for tests, load tests and benchmarks: the `radixchat` command of this
environment, a free loopback port, starting a command and waiting until it answers, stopping
it, its peak memory, and clearing what an earlier server left at a database path.

What is started here is stopped on every path: each process leads a process group of its own
(`spawn`), a start that fails, times out or is interrupted ends that whole group and reaps it
before it raises, and any still running when the interpreter exits is killed then. Waits
scale with the machine's load (`scaled`): a loaded machine is slow, not broken."""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import weakref
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


LOAD_CAP = 4.0  # a wait stretches at most this much, so a hung start still ends


def load_factor() -> float:
    """How much slower than when idle this machine may run now: its load average over the
    last minute per CPU, between 1 and LOAD_CAP."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform
        return 1.0
    return min(LOAD_CAP, max(1.0, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """`seconds` on an idle machine, stretched by its load now."""
    return seconds * load_factor()


# every process started here and not yet reaped; the interpreter's exit kills what is left
_running: set[subprocess.Popen] = set()
_leaders: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()  # those that lead a group (`spawn`)


def spawn(cmd: list[str], **popen) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **popen)` leading a process group of its own, which `kill_group`
    and `stop_process` end as a whole (mlx.launch leaves its ranks running when it alone is
    stopped; a server's helpers would outlive it)."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    _running.add(proc)
    _leaders.add(proc)
    return proc


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    # the group outlives its leader while any member lives, so its id is not reused meanwhile
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _leads_group(proc: subprocess.Popen) -> bool:
    """Started by `spawn`, or by a caller's own Popen(start_new_session=True)."""
    if proc in _leaders:
        return True
    try:
        return proc.poll() is None and os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return False


def kill_group(proc: subprocess.Popen, group: bool | None = None) -> None:
    """SIGKILL `proc`'s whole group (`proc` alone if it leads none; `group` says which when the
    caller learnt it while `proc` still ran) and reap `proc`; never raises for one already gone."""
    if _leads_group(proc) if group is None else group:
        _signal_group(proc, signal.SIGKILL)
    elif proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    _running.discard(proc)


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_running):
        if proc.returncode is None:  # not reaped: its group's id is still its own
            kill_group(proc)


def wait_ready(proc: subprocess.Popen, ready_url: str, timeout: float, failed) -> None:
    """Until `ready_url` answers 200 (`timeout` seconds, `scaled`); `failed(why)` makes the
    exception raised when `proc` exits first or the time runs out. On any way out but
    success, `proc`'s group is killed and reaped first (an interrupt too)."""
    deadline = time.monotonic() + scaled(timeout)
    try:
        while time.monotonic() < deadline:
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise failed("failed to start")
            time.sleep(0.3)
        raise failed(f"did not answer {ready_url} within {scaled(timeout):.0f} s")
    except BaseException:
        kill_group(proc)
        raise


def start_and_wait(
    cmd: list[str], ready_url: str, log: Path, env=None, timeout: float = 300, cwd=None, group: bool = True
) -> subprocess.Popen:
    """Start `cmd` (output to `log`) leading a process group of its own (`spawn`); return once
    `ready_url` answers 200, else exit, its group killed. `timeout` is for an idle machine
    (`scaled`). `group`=False: it stays in this process's group instead (a terminal's Ctrl-C
    reaches it too), and only it is killed."""
    with log.open("w") as out:
        if group:
            proc = spawn(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        else:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
            _running.add(proc)

    def failed(why: str) -> SystemExit:
        return SystemExit(f"{cmd[0]} {why}:\n{log.read_text()[-3000:]}")

    wait_ready(proc, ready_url, timeout, failed)
    return proc


def peak_rss_mb(pid: int) -> float:
    """Peak resident memory of a live process (Linux /proc; NaN elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else float("nan")


def start_radixchat(
    model: str, db: Path, port: int, log: Path, *flags: str, timeout: float = 300, exe: str | None = None
) -> subprocess.Popen:
    """`radixchat serve` of this environment (or the executable `exe`) on 127.0.0.1:`port`,
    once /health answers."""
    cmd = [
        exe or str(Path(sys.executable).with_name("radixchat")),
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


def clear_state(db: Path) -> None:
    """Remove what a radixchat server of an earlier run left at `db` (the database and the
    disk tier beside it, `--cache-dir db.kv`), so the next one starts empty. A benchmark run
    again in the same folder read the earlier run's K/V back from its disk tier
    (loadtests.bench_vs_mlxlm: 195 tokens prefilled instead of ~15,000)."""
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        path.unlink(missing_ok=True)
    shutil.rmtree(db.with_suffix(".kv"), ignore_errors=True)


def stop_process(proc: subprocess.Popen, timeout: float = 60, sig: int = signal.SIGTERM) -> None:
    """Ask a server to stop (`sig`, to its whole group if it leads one), and kill it if it has
    not stopped within `timeout` (`scaled`); either way, an interrupt too, it is reaped and
    what its group left behind is killed."""
    group = _leads_group(proc)
    if proc.poll() is None:
        if group:
            _signal_group(proc, sig)
        else:
            proc.send_signal(sig)
    try:
        proc.wait(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        pass  # killed below
    finally:  # what the group left behind too, or a leader that did not stop
        kill_group(proc, group)
