"""One server sharded over two processes by mlx.launch (ring backend over loopback).

Real processes as a user starts them: `mlx.launch -n 2 --backend ring -- radixchat serve ...`,
against `radixchat serve` alone on the same random model. Greedy answers to concurrent
multi-turn users must be the same (with the prefix cache on, so turns hit it), the ranks'
trees and batches must agree after every burst (/health's `shards.in_step`, a comparison of
every rank's tree shape), a cancelled stream must leave no row behind on either rank, and a
rank that dies or hangs must end the server with a clear error that the store keeps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port, free_port_block, start_radixchat, stop_process
from tests.support.randmodel import build_random_model

BIN = Path(sys.executable).parent
SYSTEM = "You are a terse assistant for a shared team chat. Answer in one short line, please."
QUESTIONS = [
    ["Hello there", "And then what?"],
    ["What is a radix tree", "Say more"],
    ["Name three colors", "Why those?"],
    ["Write a haiku", "Another one"],
]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request, tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp(request.param), seed=3, dim=64, layers=2, arch=request.param)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """For the bookkeeping and fault tests: the engine code they check is the same for every model."""
    return build_random_model(tmp_path_factory.mktemp("llama"), seed=3, dim=64, layers=2)


class Sharded:
    """`mlx.launch -n 2` of `radixchat serve`; the ranks' pids come from rank 0's banner."""

    def __init__(self, model: Path, tmp: Path, *flags: str):
        self.port, self.db, self.log = free_port(), tmp / "sharded.sqlite", tmp / "sharded.log"
        cmd = [
            str(BIN / "mlx.launch"),
            "-n",
            "2",
            "--backend",
            "ring",
            "--starting-port",
            str(free_port_block(2)),
            "--",
            str(BIN / "radixchat"),
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db",
            str(self.db),
            "--no-auth",
            *flags,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"mlx.launch exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            self.stop()
            raise AssertionError(f"sharded server did not start:\n{self.log.read_text()[-3000:]}")
        # rank 0's start-up lines reach the log through mlx.launch, which relays them: one CI
        # run read the log empty just after /health answered
        deadline = time.time() + 30
        while True:
            found = re.findall(r"rank (\d) on \S+ pid (\d+)", self.log.read_text())
            self.pids = {int(r): int(p) for r, p in found}
            if set(self.pids) == {0, 1} or time.time() > deadline:
                break
            time.sleep(0.2)
        if set(self.pids) != {0, 1}:
            self.stop()  # the caller never gets a Sharded to stop: it must not outlive the test
            raise AssertionError(f"no rank lines in the log:\n{self.log.read_text()[-3000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in self.pids.values():  # a stopped rank outlives its launcher
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def in_step(self, timeout: float = 30) -> dict:
        """/health's shards once the engine is idle and the ranks have compared their state."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            h = httpx.get(self.url + "/health", timeout=5).json()
            if h["active_requests"] == 0 and h["shards"]["in_step"] is not None:
                time.sleep(2.5)  # the idle engine compares at its next heartbeat (1 s)
                h = httpx.get(self.url + "/health", timeout=5).json()
                if h["active_requests"] == 0:
                    return h["shards"]
            time.sleep(0.3)
        raise AssertionError(f"no comparison of the ranks' state: {h}")


def chat(url: str, messages: list, max_tokens: int = 20, stream: bool = False) -> tuple[str, int]:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    body["model"] = model
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        j = r.json()
        return j["choices"][0]["message"]["content"], j["usage"]["prompt_tokens_details"]["cached_tokens"]
    body["stream_options"] = {"include_usage": True}
    text, cached = "", -1
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            assert "error" not in j, j
            if j["choices"]:
                text += j["choices"][0]["delta"].get("content") or ""
            if j.get("usage"):
                cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
    return text, cached


def conversations(url: str) -> dict:
    """Four users at once, two turns each, half of them streamed: answers and cached counts."""
    out, errors = {}, []

    def user(i: int) -> None:
        try:
            messages = [{"role": "system", "content": SYSTEM}]
            for turn, q in enumerate(QUESTIONS[i]):
                messages.append({"role": "user", "content": q})
                text, cached = chat(url, messages, stream=bool(i % 2))
                out[(i, turn)] = (text, cached)
                messages.append({"role": "assistant", "content": text})
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def test_the_ring_ports_bind_while_closed_connections_hold_ephemeral_ports():
    """CI once failed here: rank 1 could not bind its ring port (EADDRINUSE), the port after an
    ephemeral one that the suite's closed connections held in TIME_WAIT."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)
    addr = srv.getsockname()

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    for _ in range(3000):
        socket.create_connection(addr).close()
    try:
        for _ in range(100):
            base = free_port_block(3)
            for port in range(base, base + 3):  # as a rank binds: no SO_REUSEADDR
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
    finally:
        srv.close()


@pytest.mark.slow
def test_greedy_answers_equal_one_process_for_concurrent_users(model, tmp_path):
    same_as_one_process(model, tmp_path)


@pytest.mark.slow
def test_greedy_answers_at_a_kv_precision_equal_one_process(tmp_path):
    """--kv-bits 8 over two ranks: each rank's caches write its own heads at int8, and its
    tree keeps their codes, as one process does with all of them. (Heads of 32 numbers, as
    the format needs; seed 4's replies run to max_tokens, so the answers have something to
    differ in.)"""
    wide = build_random_model(tmp_path / "wide", seed=4, dim=128, layers=2)
    texts = same_as_one_process(wide, tmp_path, "--kv-bits", "8")
    assert all(len(t) > 10 for t in texts), texts


def same_as_one_process(model: Path, tmp_path: Path, *flags: str) -> list[str]:
    """Four users' two turns each, sharded and in one process: the same greedy answers, the
    second turns from the prefix cache, the ranks in step. The answers, for a caller to check."""
    port = free_port()
    alone = start_radixchat(str(model), tmp_path / "one.sqlite", port, tmp_path / "one.log", "--no-auth", *flags)
    try:
        expected = conversations(f"http://127.0.0.1:{port}")
    finally:
        stop_process(alone)
    server = Sharded(model, tmp_path, *flags)
    try:
        got = conversations(server.url)
        shards = server.in_step()
    finally:
        server.stop()
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in expected.items()}
    assert all(got[(i, 1)][1] > 0 for i in range(len(QUESTIONS))), got  # second turns hit the cache
    assert {k: shards[k] for k in ("size", "backend", "sharding", "in_step")} == {
        "size": 2,
        "backend": "ring",
        "sharding": "tensor",
        "in_step": True,
    }
    assert shards["messages"] > 0 and shards["message_bytes"] > 0
    return [v[0] for v in got.values()]


@pytest.mark.slow
def test_a_cancelled_stream_leaves_no_row_on_either_rank(llama, tmp_path):
    server = Sharded(llama, tmp_path)
    try:
        messages = [{"role": "user", "content": "Tell me a long story"}]
        body = {
            "model": "llama",
            "messages": messages,
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        body["model"] = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            chunks = 0
            for line in r.iter_lines():
                chunks += line.startswith("data: ")
                if chunks >= 3:
                    break  # closing the connection cancels the request
        shards = server.in_step()
        assert shards["in_step"] is True
        text, _ = chat(server.url, [{"role": "user", "content": "Hello there"}])
        assert text and server.in_step()["in_step"] is True
        assert server.proc.poll() is None
    finally:
        server.stop()


def _stream_until_error(url: str, started: threading.Event, out: dict) -> None:
    body = {
        "messages": [{"role": "user", "content": "Count forever"}],
        "max_tokens": 450,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    body["model"] = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    started.set()
                    if '"error"' in line:
                        out["error"] = json.loads(line[6:])["error"]["message"]
                        out["at"] = time.time()
    except httpx.HTTPError as e:
        out["broken"] = repr(e)
    started.set()


def _alive(pid: int) -> bool:
    if not Path("/proc").is_dir():  # macOS: no zombie check, only whether the pid is there
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its parent has not reaped it yet


def test_a_lost_ranks_stop_signals_only_once_the_streams_have_sent_their_end(monkeypatch):
    """The failed streams' last event, the reason, went out racing the SIGTERM of the stop,
    which could cut a stream still sending: once in a while a client saw its stream end
    with no error. The stop now waits (bounded) for the API streams to end first."""
    from types import SimpleNamespace

    from radixchat.webui.api.generation import OPEN_STREAMS
    from radixchat.webui.cli import main as cli

    signals = []
    fake_os = SimpleNamespace(kill=lambda pid, sig: signals.append(sig), getpid=os.getpid, _exit=os._exit)
    monkeypatch.setattr(cli, "os", fake_os)
    monkeypatch.setattr(cli.threading, "Timer", lambda *a, **k: SimpleNamespace(daemon=True, start=lambda: None))
    OPEN_STREAMS.opened()  # a stream still sending its last event
    try:
        stop = threading.Thread(target=cli._stop_serving, args=("a rank stopped answering",))
        stop.start()
        time.sleep(0.5)
        assert signals == []
    finally:
        OPEN_STREAMS.closed()
    stop.join(5)
    assert signals == [signal.SIGTERM]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_lost_rank_ends_the_server_with_a_clear_error(llama, tmp_path, fault):
    server = Sharded(llama, tmp_path, "--shard-timeout-s", "3")
    try:
        started, out = threading.Event(), {}
        client = threading.Thread(target=_stream_until_error, args=(server.url, started, out))
        client.start()
        assert started.wait(60)
        t0 = time.time()
        os.kill(server.pids[1], signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        client.join(timeout=60)
        assert not client.is_alive()
        if "stopped answering" not in out.get("error", ""):
            print(server.log.read_text()[-6000:])  # whole, in the report's captured output
        assert "stopped answering" in out.get("error", ""), out
        assert out["at"] - t0 < (10 if fault == "killed" else 20), (out["at"] - t0, server.log.read_text()[-3000:])
        # rank 0 ends (mlx.launch itself waits for a stopped rank 1 until the test kills it)
        deadline = time.time() + 60
        while _alive(server.pids[0]) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(server.pids[0])
        with sqlite3.connect(server.db) as db:  # and the store kept the failed request
            rows = db.execute("select error from requests").fetchall()
        assert any("stopped answering" in (e or "") for (e,) in rows), rows
    finally:
        server.stop()


@pytest.mark.slow
def test_a_model_whose_heads_do_not_split_is_refused_in_one_line(llama, tmp_path):
    """4 attention heads over 3 ranks: mlx-lm would floor them and compute garbage."""
    log = tmp_path / "three.log"
    cmd = [
        str(BIN / "mlx.launch"),
        "-n",
        "3",
        "--backend",
        "ring",
        "--starting-port",
        str(free_port_block(3)),
        "--",
        str(BIN / "radixchat"),
        "serve",
        "--model",
        str(llama),
        "--port",
        str(free_port()),
        "--db",
        str(tmp_path / "three.sqlite"),
        "--no-auth",
    ]
    subprocess.run(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, timeout=120, start_new_session=True)
    text = log.read_text()
    assert "4 attention heads, 2 key value heads, 128 intermediate size do not split evenly over 3 ranks" in text, text[
        -2000:
    ]
    assert "Traceback" not in text


@pytest.mark.slow
def test_speculation_under_mlx_launch_is_refused_in_one_line(llama, tmp_path):
    """Drafts would be one more thing the ranks must agree on: not built, so not silently off."""
    log = tmp_path / "spec.log"
    cmd = [
        str(BIN / "mlx.launch"),
        "-n",
        "2",
        "--backend",
        "ring",
        "--starting-port",
        str(free_port_block(2)),
        "--",
        str(BIN / "radixchat"),
        "serve",
        "--model",
        str(llama),
        "--port",
        str(free_port()),
        "--db",
        str(tmp_path / "spec.sqlite"),
        "--no-auth",
        "--speculate",
        "2",
    ]
    subprocess.run(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, timeout=120, start_new_session=True)
    text = log.read_text()
    assert "--warm-prompts and --speculate do not run sharded (under mlx.launch) yet" in text, text[-2000:]
    assert "Traceback" not in text


def test_the_shape_digest_tells_trees_apart():
    """What /health's in_step compares: the same inserts and locks give the same digest on
    every rank, a different insert or a lock left behind does not."""
    from radixchat.core.cache.radix import RadixCache
    from radixchat.core.engine.shard.lockstep import counters, shape_digest

    def tree(*seqs):
        t = RadixCache(1 << 20)
        for s in seqs:
            t.insert(s, lambda a, b: None)
        return t

    a, b = tree([1, 2, 3, 4], [1, 2, 5]), tree([1, 2, 3, 4], [1, 2, 5])
    assert shape_digest(a, 0) == shape_digest(b, 0) and counters(a, 0) == counters(b, 0)
    assert shape_digest(a, 0) != shape_digest(tree([1, 2, 3, 4], [1, 2, 6]), 0)
    assert shape_digest(a, 0) != shape_digest(b, 1)  # a row left in one rank's batch
    b.lock(b.match([1, 2, 5]).node)
    assert shape_digest(a, 0) != shape_digest(b, 0)


@pytest.mark.slow
def test_doctor_under_mlx_launch_prints_each_rank_and_the_sharding(llama, tmp_path):
    cmd = [
        str(BIN / "mlx.launch"),
        "-n",
        "2",
        "--backend",
        "ring",
        "--starting-port",
        str(free_port_block(2)),
        "--",
        str(BIN / "radixchat"),
        "doctor",
        "--model",
        str(llama),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, start_new_session=True).stdout
    assert re.search(r"mlx\.launch group\s+2 ranks, backend ring", out), out
    assert re.search(r"rank 0\s+\S+, pid \d+", out) and re.search(r"rank 1\s+\S+, pid \d+", out), out
    assert re.search(r"sharding\s+tensor parallel: each of 2 ranks holds 1/2", out), out
    assert out.count("mlx.launch group") == 1  # rank 0 prints; rank 1 runs along quietly
    assert "decode (1 stream)" in out


def test_the_model_digest_follows_the_bytes_not_the_file_times(llama, tmp_path):
    """What `same_model` compares across ranks: a copy elsewhere (other mtimes) is the same
    model, one changed weight byte or config key is not."""
    import shutil

    from radixchat.core.engine.shard.lockstep import model_digest

    copy = shutil.copytree(llama, tmp_path / "copy")
    os.utime(copy / "model.safetensors", (1, 1))
    assert model_digest(str(copy)) == model_digest(str(llama))
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-5] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert model_digest(str(copy)) != model_digest(str(llama))
    other = shutil.copytree(llama, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rope_theta": 5000.0}))
    assert model_digest(str(other)) != model_digest(str(llama))
