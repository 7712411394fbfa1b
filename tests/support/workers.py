"""Engines in other processes, for the tests of front ends and routers: `radixchat worker` on
a free loopback port (`Worker`), SGLang's smg in front of workers with consistent hashing on
the user (`Router`), a store with one user and their API key (`keyed_db`), and the chat calls
those tests make (`chat`, `streamed_text`). Each process leads a group of its own and is
killed on every path out of a start that failed (tests/support/procs.py)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from radixchat.core.store import Store
from tests.support.procs import RADIXCHAT, free_port, kill_group, scaled, spawn, wait_ready

KEY = "worker-test-key-0123456789"
QUESTION = [{"role": "user", "content": "Tell me about the weather in Lisbon in spring."}]
# the smg of this environment (a dev extra), beside the interpreter like `radixchat`
SMG = shutil.which("smg", path=str(Path(sys.executable).parent)) or "smg"


class _Process:
    """A spawned process whose output is read all along (a pipe it fills would block it)."""

    def _start(self, cmd: list[str]) -> None:
        self.proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._lines: list[str] = []
        threading.Thread(target=self._lines.extend, args=(self.proc.stdout,), daemon=True).start()

    def output(self) -> str:
        return "".join(self._lines)

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            pass
        finally:
            kill_group(self.proc)
        time.sleep(0.2)  # the reader's last lines
        return self.output()


class Worker(_Process):
    """`radixchat worker` on a free loopback port (or `port`), once /health answers."""

    def __init__(self, model_dir, folder, *extra, key: str | None = KEY, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        flags = ["--service-key", key] if key else []
        cmd = [RADIXCHAT, "worker", "--model", str(model_dir), "--port", str(self.port)]
        cmd += ["--db", str(folder / f"w{self.port}.db"), "--max-tokens", "16", "--cache-disk-bytes", "0"]
        self._start([*cmd, *flags, *extra])
        wait_ready(self.proc, self.url + "/health", 120, lambda why: RuntimeError(f"worker {why}: {self.output()}"))


class Router(_Process):
    """smg in front of `worker_urls`: consistent hashing on X-Radixchat-User, health checked
    every second, its metrics on a free loopback port (smg's default, 29000, would clash with
    another's); ready once it lists `expect` healthy workers (0: once it answers at all)."""

    def __init__(self, worker_urls: list[str], *extra: str, expect: int | None = None, key: str | None = KEY):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [SMG, "launch", "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *worker_urls]
        cmd += ["--policy", "consistent_hashing", "--routing-key-headers", "x-radixchat-user"]
        cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        cmd += ["--disable-tokenizer-autoload", "--health-check-interval-secs", "1", "--log-level", "warn"]
        cmd += ["--worker-startup-check-interval", "1", *(["--api-key", key] if key else []), *extra]
        self._start(cmd)
        self.key = key
        want = len(worker_urls) if expect is None else expect
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline and self.healthy() < want:
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        if self.healthy() < want:
            kill_group(self.proc)
            raise RuntimeError(f"smg did not list {want} healthy workers: {self.output()[-3000:]}")

    def healthy(self) -> int:
        headers = {"authorization": f"Bearer {self.key}"} if self.key else {}
        try:
            listed = httpx.get(self.url + "/workers", headers=headers, timeout=2).json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return -1
        return sum(1 for w in listed if w.get("is_healthy"))


def keyed_db(folder, name: str, users: tuple[str, ...] = ("alice",)) -> tuple:
    """A store with `users` and an API key each: (its path, the first's key, or all keys)."""
    db = folder / f"{name}.db"
    keys = []
    with Store(db) as store:
        for user in users:
            keys.append(store.create_api_key(store.create_user(user, "correct horse battery"), "tests")[1])
    return db, keys[0] if len(keys) == 1 else keys


def chat(server, key: str, messages, **fields) -> httpx.Response:
    body = {"model": "default", "messages": messages, "temperature": 0, "max_tokens": 12, **fields}
    return httpx.post(
        server.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60
    )


def streamed_text(response: httpx.Response | str) -> str:
    text = ""
    for line in (response if isinstance(response, str) else response.text).splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            text += "".join(c["delta"].get("content") or "" for c in chunk.get("choices", []))
    return text
