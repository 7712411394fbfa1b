"""Several workers of one model behind a router: two `radixchat worker`s, SGLang's smg in front
of them with consistent hashing on the user (X-Radixchat-User), one front end `radixchat serve
--engine <smg URL>`, all on loopback. Greedy answers through the two hops equal a plain
server's; each of four users' second turn finds their first cached on the worker smg sends
them to; a client that leaves stops its request on the worker that ran it; a worker killed mid-stream fails only the streams it had, with a message naming it
and stored with the request, while the other worker's finish and the next requests succeed,
and the worker, started again, gets its users back; nobody without the service key can claim
an owner, at the worker or through the router; a router with no healthy worker is a one-line
start-up error, and a front end whose workers are all gone answers 503 with a message."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time

import httpx
import pytest

from radixchat.core.seam.requests import owner_of
from radixchat.core.store import Store
from tests.support.procs import RADIXCHAT, free_port, kill_group, scaled
from tests.support.randmodel import build_random_model
from tests.support.server import Server
from tests.support.workers import KEY, QUESTION, Router, Worker, chat, keyed_db, streamed_text

USERS = tuple(f"user{i}" for i in range(8))
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """A dict: the workers, the router, the front end and its users' keys and owners, a plain
    server on the same model and its key. The model is slow enough that a stream lasts."""
    folder = tmp_path_factory.mktemp("routed")
    model = build_random_model(folder / "slow-model", dim=128, layers=4, context=2048)
    workers = [Worker(model, folder), Worker(model, folder)]
    router = front = plain = None
    try:
        router = Router([w.url for w in workers])
        db, keys = keyed_db(folder, "front", USERS)
        with Store(db) as store:
            owners = [owner_of(store.get_user(u).cache_key) for u in USERS]
        front = Server(model, db, "--engine", router.url, env={"RADIXCHAT_SERVICE_KEY": KEY})
        plain_db, plain_key = keyed_db(folder, "plain")
        plain = Server(model, plain_db, "--cache-disk-bytes", "0")
        yield {
            "model": model,
            "folder": folder,
            "workers": workers,
            "router": router,
            "front": front,
            "db": db,
            "keys": keys,
            "owners": owners,
            "plain": plain,
            "plain_key": plain_key,
        }
    finally:
        for srv in (front, plain):
            if srv is not None:
                assert "Traceback" not in srv.stop()
        if router is not None:
            router.stop()
        for w in workers:
            w.stop()


def worker_of(router: Router, owner: str) -> str:
    """The worker smg sends `owner`'s requests to now: a body no worker serves, answered 400
    at once, and smg's header saying where it went."""
    r = httpx.post(router.url + "/generate", json={"stream": False}, headers={**AUTH, "x-radixchat-user": owner})
    return r.headers.get("x-smg-routed-worker-id", "").rstrip("/")


@pytest.mark.slow
def test_greedy_answers_through_the_router_equal_a_plain_servers(routed):
    front, key, plain = routed["front"], routed["keys"][0], routed["plain"]
    alone = chat(plain, routed["plain_key"], QUESTION)
    assert alone.status_code == 200, alone.text
    expected = alone.json()["choices"][0]["message"]["content"]
    for i in range(4):  # users on either worker
        whole = chat(front, routed["keys"][i], QUESTION)
        assert whole.status_code == 200, whole.text
        assert whole.json()["choices"][0]["message"]["content"] == expected
    streamed = chat(front, key, QUESTION, stream=True)
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert streamed_text(streamed) == expected
    models = httpx.get(front.url + "/v1/models", headers={"authorization": f"Bearer {key}"}).json()
    assert [m["id"] for m in models["data"]] == [
        httpx.get(routed["workers"][0].url + "/v1/models").json()["data"][0]["id"]
    ]


@pytest.mark.slow
def test_four_users_second_turns_find_their_first_cached(routed):
    front = routed["front"]
    system = {"role": "system", "content": "Answer briefly."}  # short: most of a prompt is the user's own
    for i in range(4):
        story = f"I am user number {i}. " + " ".join(
            f"My note {j} says the river {i * 7 + j} runs north." for j in range(8)
        )
        first = [system, {"role": "user", "content": story}]
        one = chat(front, routed["keys"][i], first, max_tokens=4)
        assert one.status_code == 200, one.text
        reply = one.json()["choices"][0]["message"]["content"]
        second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
        usage = chat(front, routed["keys"][i], second, max_tokens=4).json()["usage"]
        cached, prompt = usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]
        assert cached >= 0.8 * prompt, (i, usage)


@pytest.mark.slow
def test_the_owner_counts_only_with_the_service_key(routed):
    worker, router = routed["workers"][0], routed["router"]
    model = httpx.get(worker.url + "/v1/models").json()["data"][0]["id"]
    body = {
        "model": model,
        "stream": True,
        "radixchat": {"kind": "chat", "request": {"messages": QUESTION, "owner": routed["owners"][0]}},
    }
    for url in (worker.url, router.url):
        for headers in ({}, {"authorization": "Bearer not-the-key-at-all-000"}, {"x-api-key": KEY[:-1]}):
            r = httpx.post(url + "/generate", json=body, headers={**headers, "x-radixchat-user": routed["owners"][0]})
            assert r.status_code == 401, (url, r.text)
    # a router that does not check the key itself passes the caller's on: the worker refuses it
    bare = Router([worker.url], key=None)
    try:
        r = httpx.post(bare.url + "/generate", json=body, headers={"x-radixchat-user": routed["owners"][0]})
        assert r.status_code == 401 and "service key" in r.text, r.text
    finally:
        bare.stop()
    good = httpx.post(worker.url + "/generate", json=body, headers=AUTH, timeout=60)
    assert good.status_code == 200 and good.text.splitlines()[-1].startswith('{"type":"finished"'), good.text


@pytest.mark.slow
def test_a_client_that_leaves_stops_its_request_on_its_worker(routed):
    """The stream goes through smg; the cancel goes to the worker smg chose, by its URL."""
    front, key = routed["front"], routed["keys"][2]
    body = {"model": "default", "messages": QUESTION, "max_tokens": 1900, "stream": True, "temperature": 0}
    body["ignore_eos"] = True
    seen, before = 0, _last_request(routed["db"])
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream("POST", front.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen == 5:
                break  # leaves: the front end cancels the request
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        with sqlite3.connect(f"file:{routed['db']}?mode=ro", uri=True) as con:
            rows = con.execute(
                "SELECT finish_reason, generated_tokens FROM requests WHERE id > ? ORDER BY id", (before,)
            ).fetchall()
        if rows:
            break
        time.sleep(0.2)
    assert rows and rows[0][0] == "cancelled" and rows[0][1] < 1900, rows
    for w in routed["workers"]:  # and nothing of it runs on either worker
        assert httpx.get(w.url + "/engine/stats", headers=AUTH).json()["running"] == 0


def _last_request(db) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return con.execute("SELECT coalesce(max(id), 0) FROM requests").fetchone()[0]


def _stream(front, key: str, out: dict, name: str, started: threading.Event | None = None) -> None:
    body = {"model": "default", "messages": QUESTION, "max_tokens": 800, "stream": True, "temperature": 0}
    got = ""
    try:
        with httpx.stream(
            "POST",
            front.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        ) as r:
            for line in r.iter_lines():
                got += line + "\n"
                if started is not None and got.count("data: {") >= 5:
                    started.set()
    except httpx.HTTPError as e:
        got += f"\nCLIENT ERROR {e!r}"
    out[name] = got


def _two_streams(routed, victim, other):
    """Two users' streams, not started: one on `victim` ("doomed"), one on `other` ("spared");
    their indexes, the dict their output goes to, the event set once the first is under way."""
    where = {i: worker_of(routed["router"], o) for i, o in enumerate(routed["owners"])}
    doomed = [i for i in where if where[i] == victim.url]
    spared = [i for i in where if where[i] == other.url]
    assert doomed and spared, f"smg sent all {len(USERS)} users to one worker: {where}"
    a, b = doomed[0], spared[0]
    out: dict[str, str] = {}
    started = threading.Event()
    front = routed["front"]
    threads = [
        threading.Thread(target=_stream, args=(front, routed["keys"][a], out, "doomed", started)),
        threading.Thread(target=_stream, args=(front, routed["keys"][b], out, "spared")),
    ]
    return a, b, out, started, threads


@pytest.mark.slow
def test_a_killed_worker_fails_only_its_streams_and_comes_back(routed):
    front, router, workers = routed["front"], routed["router"], routed["workers"]
    victim = workers[0]
    a, b, out, started, threads = _two_streams(routed, victim, workers[1])
    tic = time.monotonic()
    for t in threads:
        t.start()
    assert started.wait(scaled(60)), out
    os.killpg(victim.proc.pid, signal.SIGKILL)
    for t in threads:
        t.join(scaled(120))
    assert time.monotonic() - tic < scaled(120), "a stream hung"
    assert f"the engine at {victim.url} stopped answering" in out["doomed"], out["doomed"][-2000:]
    assert "[DONE]" in out["spared"] and '"error":' not in out["spared"], out["spared"][-2000:]
    assert '"finish_reason":"length"' in out["spared"].replace(" ", "")
    kill_group(victim.proc)
    _stored_failure(routed["db"], victim.url)

    for i in (a, b):  # the next requests of both users succeed: the router sends a's elsewhere
        r = chat(front, routed["keys"][i], QUESTION)
        assert r.status_code == 200, r.text

    back = Worker(routed["model"], routed["folder"], port=victim.port)  # started again: it rejoins
    workers[0] = back
    deadline = time.monotonic() + scaled(60)
    while worker_of(router, routed["owners"][a]) != victim.url and time.monotonic() < deadline:
        time.sleep(0.5)
    assert worker_of(router, routed["owners"][a]) == victim.url
    r = chat(front, routed["keys"][a], QUESTION)
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_a_hung_worker_fails_only_its_streams_and_carries_on_when_it_wakes(routed):
    front, workers = routed["front"], routed["workers"]
    victim = workers[1]
    a, b, out, started, threads = _two_streams(routed, victim, workers[0])
    for t in threads:
        t.start()
    assert started.wait(scaled(60)), out
    os.killpg(victim.proc.pid, signal.SIGSTOP)  # alive, silent: a hung machine, not a dead one
    tic = time.monotonic()
    try:
        for t in threads:
            t.join(scaled(120))
        assert not any(t.is_alive() for t in threads), "a stream hung with its worker"
        assert time.monotonic() - tic < scaled(60)
        assert f"the engine at {victim.url} stopped answering" in out["doomed"], out["doomed"][-2000:]
        assert "[DONE]" in out["spared"] and '"error":' not in out["spared"], out["spared"][-2000:]
        _stored_failure(routed["db"], victim.url)
        r = chat(front, routed["keys"][b], QUESTION)  # the other worker's users carry on meanwhile
        assert r.status_code == 200, r.text
    finally:
        os.killpg(victim.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:  # awake again, it serves its users as before
        r = chat(front, routed["keys"][a], QUESTION)
        if r.status_code == 200:
            break
        time.sleep(1)
    assert r.status_code == 200, r.text


def _stored_failure(db, url: str) -> None:
    deadline = time.monotonic() + scaled(20)
    while True:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            rows = con.execute("SELECT error FROM requests WHERE error IS NOT NULL").fetchall()
        if any(f"the engine at {url} stopped answering" in (e or "") for (e,) in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert any(f"the engine at {url} stopped answering" in (e or "") for (e,) in rows), rows


def _serve(engine_url: str, key: str, tmp_path) -> subprocess.CompletedProcess:
    cmd = [RADIXCHAT, "serve", "--engine", engine_url, "--port", str(free_port()), "--db", str(tmp_path / "x.db")]
    env = {**os.environ, "RADIXCHAT_SERVICE_KEY": key}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(60), env=env)


@pytest.mark.slow
def test_a_router_with_no_healthy_worker_is_refused_or_answered_503(routed, tmp_path):
    """Runs last: it stops the module's workers."""
    empty = Router([f"http://127.0.0.1:{free_port()}"], expect=0)
    try:
        done = _serve(empty.url, KEY, tmp_path)
        assert done.returncode == 2 and "has no healthy worker" in done.stderr, done
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    finally:
        empty.stop()
    done = _serve(routed["router"].url, "wrong-key-but-long-enough", tmp_path)
    assert done.returncode == 2 and "refused the service key" in done.stderr, done

    for w in routed["workers"]:
        kill_group(w.proc)
    front, key = routed["front"], routed["keys"][0]
    tic = time.monotonic()
    r = chat(front, key, QUESTION)
    assert r.status_code == 503, r.text
    assert "retry shortly" in r.json()["error"]["message"], r.text
    assert time.monotonic() - tic < scaled(30), "the front end hung"
