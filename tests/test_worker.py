"""A front end whose engine is on another process: `radixchat worker` behind a service key,
`radixchat serve --engine URL` in front, on loopback. Greedy answers through the hop equal a
plain server's; a user's second turn finds their prefix cached on the worker; a caller
without the key is refused and can claim no owner; a worker killed mid-stream fails that
stream with a clear message, and the front end answers 503 with a message while it is down."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.support.procs import RADIXCHAT, free_port, kill_group, scaled
from tests.support.randmodel import build_random_model
from tests.support.server import Server
from tests.support.workers import KEY, QUESTION, Worker, chat, keyed_db, streamed_text


@pytest.fixture(scope="module")
def pair(tiny_model_dir, tmp_path_factory):
    """(worker, front end, its API key, a plain server on the same model, its key)."""
    folder = tmp_path_factory.mktemp("worker")
    worker = Worker(tiny_model_dir, folder)
    front_db, front_key = keyed_db(folder, "front")
    plain_db, plain_key = keyed_db(folder, "plain")
    front = plain = None
    try:
        front = Server(tiny_model_dir, front_db, "--engine", worker.url, env={"RADIXCHAT_SERVICE_KEY": KEY})
        plain = Server(tiny_model_dir, plain_db, "--cache-disk-bytes", "0")
        yield worker, front, front_key, plain, plain_key
    finally:
        for srv in (front, plain):
            if srv is not None:
                assert "Traceback" not in srv.stop()
        assert "Traceback" not in worker.stop()


@pytest.mark.slow
def test_greedy_answers_through_a_worker_equal_a_plain_servers(pair):
    worker, front, front_key, plain, plain_key = pair
    whole = chat(front, front_key, QUESTION)
    assert whole.status_code == 200, whole.text
    alone = chat(plain, plain_key, QUESTION)
    assert whole.json()["choices"][0]["message"]["content"] == alone.json()["choices"][0]["message"]["content"]
    streamed = chat(front, front_key, QUESTION, stream=True)
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert streamed_text(streamed) == alone.json()["choices"][0]["message"]["content"]
    models = httpx.get(front.url + "/v1/models", headers={"authorization": f"Bearer {front_key}"}).json()
    assert [m["id"] for m in models["data"]] == [httpx.get(worker.url + "/v1/models").json()["data"][0]["id"]]


@pytest.mark.slow
def test_a_users_second_turn_finds_their_prefix_cached_on_the_worker(pair):
    _, front, front_key, _, _ = pair
    first = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name three rivers."}]
    one = chat(front, front_key, first)
    assert one.status_code == 200, one.text
    reply = one.json()["choices"][0]["message"]["content"]
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And three lakes?"}]
    two = chat(front, front_key, second).json()
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, two["usage"]


@pytest.mark.slow
def test_a_caller_without_the_service_key_is_refused_and_claims_no_owner(pair):
    worker = pair[0]
    body = {"kind": "chat", "request": {"messages": QUESTION, "owner": "key:someone-elses-cache-key"}}
    for headers in ({}, {"authorization": "Bearer not-the-key-at-all-000"}, {"x-api-key": KEY[:-1]}):
        r = httpx.post(worker.url + "/engine/submit", json=body, headers={**headers, "x-radixchat-user": "x"})
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "authentication_error"
        assert httpx.post(worker.url + "/engine/forget", json={"owner": "key:x"}, headers=headers).status_code == 401
    assert httpx.get(worker.url + "/health").status_code == 200  # what a router probes stays open
    good = httpx.post(worker.url + "/engine/submit", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert good.status_code == 200 and good.text.splitlines()[-1].startswith('{"type":"finished"')


@pytest.mark.slow
def test_bad_engines_are_one_line_start_up_errors(pair, tmp_path):
    worker, front = pair[0], pair[1]
    cases = [
        ([worker.url], "wrong-key-but-long-enough", "refused the service key"),
        ([f"http://127.0.0.1:{free_port()}"], KEY, "does not answer"),
        ([front.url], KEY, "is not a radixchat worker"),
    ]
    for urls, key, says in cases:
        flags = [a for u in urls for a in ("--engine", u)]
        cmd = [RADIXCHAT, "serve", *flags, "--port", str(free_port()), "--db", str(tmp_path / "x.db")]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=scaled(60), env={**os.environ, "RADIXCHAT_SERVICE_KEY": key}
        )
        assert done.returncode == 2, done
        assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
def test_a_worker_refuses_to_start_without_a_key(tiny_model_dir, tmp_path):
    cmd = [
        RADIXCHAT,
        "worker",
        "--model",
        str(tiny_model_dir),
        "--port",
        str(free_port()),
        "--db",
        str(tmp_path / "w.db"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 2 and "--service-key" in done.stderr, done


@pytest.mark.slow
def test_a_killed_worker_fails_only_its_stream_and_the_front_end_answers_503(tmp_path_factory):
    folder = tmp_path_factory.mktemp("killed")
    model = build_random_model(folder / "slow-model", dim=128, layers=4, context=2048)  # a stream lasts a while
    worker = Worker(model, folder)
    db, key = keyed_db(folder, "front")
    front = Server(model, db, "--engine", worker.url, env={"RADIXCHAT_SERVICE_KEY": KEY})
    try:
        body = {"model": "default", "messages": QUESTION, "max_tokens": 1500, "stream": True, "temperature": 0}
        headers = {"authorization": f"Bearer {key}"}
        tic, got = time.monotonic(), ""
        with httpx.stream("POST", front.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            for line in r.iter_lines():
                got += line + "\n"
                if got.count("data: {") == 5:
                    os.killpg(worker.proc.pid, signal.SIGKILL)
        assert time.monotonic() - tic < scaled(40), "the stream hung"
        assert "the engine at " + worker.url + " stopped answering" in got, got[-2000:]
        after = chat(front, key, QUESTION)
        assert after.status_code == 503, after.text
        assert "not answering" in after.json()["error"]["message"]
        assert httpx.get(front.url + "/health").status_code in (200, 503)
    finally:
        kill_group(worker.proc)
        out = front.stop()
    assert "Traceback" not in out, out
