"""The test harness itself (tests/support/procs.py, server.py, the hooks of tests/conftest.py):
what it starts, it stops and reaps, whole process group and all, when a start times out, fails
or is interrupted; its waits, and each test's timeout, stretch with the machine's load, within
a cap."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support import procs, server
from tests.support.procs import LOAD_CAP, free_port, start_and_wait

# a "server" that never answers: it writes its pid and its child's, then waits on the child
NEVER_READY = """#!/bin/sh
sleep 600 &
echo $$ $! > "$PIDS"
wait
"""


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (dead, its parent yet to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# the same, its child deaf to SIGTERM (a helper that does not stop when asked)
STUBBORN = NEVER_READY.replace("sleep 600 &", "(trap '' TERM; exec sleep 600) &")


def never_ready(tmp_path: Path, text: str = NEVER_READY) -> tuple[Path, Path]:
    script = tmp_path / "never-ready"
    script.write_text(text)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, tmp_path / "pids"


def pids_of(path: Path) -> list[int]:
    deadline = time.monotonic() + 30
    while not (path.exists() and len(path.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the script did not start"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def assert_all_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 10  # an orphan is reaped by init, a moment later
    while not all(gone(p) for p in pids):
        assert time.monotonic() < deadline, [p for p in pids if not gone(p)]
        time.sleep(0.05)
    leader = pids[0]
    with pytest.raises(ProcessLookupError):  # ours: reaped, not a zombie
        os.kill(leader, 0)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_start_that_times_out_kills_and_reaps_its_group(tmp_path, monkeypatch):
    script, pids = never_ready(tmp_path)
    monkeypatch.setenv("PIDS", str(pids))
    t0 = time.monotonic()
    with pytest.raises(SystemExit, match="did not answer"):
        start_and_wait([str(script)], f"http://127.0.0.1:{free_port()}/health", tmp_path / "log", timeout=1)
    assert time.monotonic() - t0 < 1 * LOAD_CAP + 10
    assert_all_gone(pids_of(pids))
    assert not procs._running


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_that_never_answers_is_killed_and_reaped(tmp_path, monkeypatch):
    script, pids = never_ready(tmp_path)
    monkeypatch.setattr(server, "RADIXCHAT", str(script))
    with pytest.raises(TimeoutError, match="did not answer"):
        server.Server(tmp_path, tmp_path / "t.db", env={"PIDS": str(pids)}, timeout=1)
    assert_all_gone(pids_of(pids))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_interrupted_start_is_killed_and_reaped(tmp_path, monkeypatch):
    script, pids = never_ready(tmp_path)
    monkeypatch.setattr(server, "RADIXCHAT", str(script))
    real_get = httpx.get

    def interrupted(*a, **kw):
        pids_of(pids)  # once the script runs
        raise KeyboardInterrupt  # Ctrl-C while the harness waits

    monkeypatch.setattr(httpx, "get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.Server(tmp_path, tmp_path / "t.db", env={"PIDS": str(pids)}, timeout=60)
    monkeypatch.setattr(httpx, "get", real_get)
    assert_all_gone(pids_of(pids))


def test_waits_stretch_with_load_within_a_cap(monkeypatch):
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert procs.scaled(10) == 10
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cpus, 0.0, 0.0))
    assert procs.scaled(10) == pytest.approx(30)
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0 * cpus, 0.0, 0.0))
    assert procs.scaled(10) == 10 * LOAD_CAP


@pytest.mark.parametrize(("load", "timeout"), [(0.1, 10.0), (3.0, 30.0), (100.0, 10 * LOAD_CAP)])
def test_a_tests_timeout_stretches_with_load(pytester, monkeypatch, load, timeout):
    # the suite's own hooks, in a pytest run of its own (in this process: the faked load holds)
    pytester.makeconftest(Path(__file__).with_name("conftest.py").read_text())
    pytester.makepyfile(
        """
        import threading

        def test_timer(request):  # pytest-timeout's thread method names its timer after the test
            (timer,) = [t for t in threading.enumerate() if t.name.endswith(" " + request.node.nodeid)]
            print("TIMER", timer.interval)
        """
    )
    monkeypatch.setattr(os, "getloadavg", lambda: (load * (os.cpu_count() or 1), 0.0, 0.0))
    result = pytester.runpytest_inprocess("-s", "-o", "timeout=10", "-o", "timeout_method=thread")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"* TIMER {timeout}"])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_stopping_ends_the_whole_group(tmp_path, monkeypatch):
    script, pids = never_ready(tmp_path, STUBBORN)
    monkeypatch.setenv("PIDS", str(pids))
    proc = procs.spawn([str(script)])
    leader, child = pids_of(pids)
    assert proc.pid == leader and not gone(child)
    procs.stop_process(proc, timeout=5)  # the shell ends on SIGTERM, its child does not
    assert_all_gone([leader, child])
    assert proc not in procs._running


@pytest.mark.slow  # its pytest run's tests start a process
def test_a_test_not_marked_slow_may_not_start_a_process(pytester):
    """The tiers cannot drift: `pytest -m "not slow"` (the fast tier) starts no process,
    because a test not marked slow that starts one, itself or through a fixture, fails."""
    pytester.makeconftest(Path(__file__).with_name("conftest.py").read_text())
    pytester.makepyfile(
        """
        import subprocess, sys
        import pytest

        @pytest.fixture
        def helper():
            return subprocess.run([sys.executable, "-c", "pass"]).returncode

        def test_runs_one():
            subprocess.run([sys.executable, "-c", "pass"])

        def test_through_a_fixture(helper):
            pass

        @pytest.mark.slow
        def test_marked(helper):
            assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0

        def test_starts_none():
            pass
        """
    )
    before = subprocess.Popen.__init__
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_runs_one starts a process*is not marked slow*"])
    assert subprocess.Popen.__init__ is before  # that run's guard is gone with it
