"""Slow and idle clients cannot hold the server: a real server with short time limits.

Hundreds of loopback sockets that send half a request and stall are closed once the header
time limit passes, while a normal request made among them is answered; a stalled body and an
idle keep-alive connection are closed too; with more slow sockets than --max-connections the
oldest are closed to make room and /health is still answered at once, and when every open
connection is busy with a request a new one is refused at once rather than left waiting.
"""

from __future__ import annotations

import selectors
import socket
import time

import httpx
import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow

SLOW = 300  # sockets that stall; bounded, loopback only
MARGIN_S = 4.0  # scheduling slack on a busy machine
PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow"


@pytest.fixture(scope="module")
def timed(tiny_model_dir, tmp_path_factory):
    db = tmp_path_factory.mktemp("slow") / "slow.db"
    srv = Server(tiny_model_dir, db, "--header-timeout-s", "1", "--body-timeout-s", "1", "--keep-alive-s", "1")
    yield srv
    out = srv.stop()
    assert "Traceback" not in out, out


@pytest.fixture(scope="module")
def capped(tiny_model_dir, tmp_path_factory):
    db = tmp_path_factory.mktemp("capped") / "capped.db"
    srv = Server(tiny_model_dir, db, "--max-connections", "50", "--header-timeout-s", "60")
    yield srv
    out = srv.stop()
    assert "Traceback" not in out, out


def stall(port: int, data: bytes = PARTIAL) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(data)
    s.setblocking(False)
    return s


def closed_times(socks: list[socket.socket], within_s: float) -> dict[socket.socket, float]:
    """When each socket saw the server close it (EOF or reset), waiting at most `within_s`."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    closed, deadline = {}, time.monotonic() + within_s
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionError:
                data = b""
            if not data:
                closed[key.fileobj] = time.monotonic()
                sel.unregister(key.fileobj)
    sel.close()
    return closed


def close_all(socks) -> None:
    for s in socks:
        s.close()


def health_s(url: str) -> float:
    t0 = time.monotonic()
    r = httpx.get(url + "/health", timeout=10)
    assert r.status_code == 200
    return time.monotonic() - t0


def test_slow_headers_are_closed_and_others_still_served(timed):
    socks, opened = [], {}
    try:
        for _ in range(SLOW):
            s = stall(timed.port)
            socks.append(s)
            opened[s] = time.monotonic()
        assert health_s(timed.url) < 1 + MARGIN_S  # answered while they are all open
        closed = closed_times(socks, within_s=1 + MARGIN_S + 2)
        assert len(closed) == SLOW, f"{SLOW - len(closed)} slow sockets still open"
        waited = [closed[s] - opened[s] for s in socks]
        assert min(waited) > 0.5 and max(waited) < 1 + MARGIN_S, (min(waited), max(waited))
    finally:
        close_all(socks)
    assert health_s(timed.url) < MARGIN_S


def test_a_stalled_body_and_an_idle_keep_alive_are_closed(timed):
    body = stall(
        timed.port,
        b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/"
        b"x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\nusername=al",
    )
    idle = stall(timed.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    t0 = time.monotonic()
    try:
        closed = closed_times([body], within_s=1 + MARGIN_S)
        assert body in closed and 0.5 < closed[body] - t0 < 1 + MARGIN_S
        idle.setblocking(True)
        idle.settimeout(5)
        assert idle.recv(65536).startswith(b"HTTP/1.1 200")  # answered, then kept alive ...
        idle.setblocking(False)
        closed = closed_times([idle], within_s=1 + MARGIN_S)  # ... until idle for --keep-alive-s
        assert idle in closed
    finally:
        close_all([body, idle])


def test_more_slow_sockets_than_the_cap_leave_room_for_others(capped):
    socks = []
    try:
        for _ in range(SLOW):
            socks.append(stall(capped.port))
        assert health_s(capped.url) < MARGIN_S  # served at once: the oldest slow ones made room
        time.sleep(0.5)
        still_open = SLOW - len(closed_times(socks, within_s=0.5))
        assert still_open <= 50, still_open
        assert health_s(capped.url) < MARGIN_S
    finally:
        close_all(socks)


def test_with_every_connection_busy_a_new_one_is_refused_at_once(capped):
    # 50 sign-ins whose bodies never come: requests under way, so none is idle to close
    busy = [
        stall(
            capped.port,
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/"
            b"x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n",
        )
        for _ in range(50)
    ]
    try:
        time.sleep(0.5)
        late = stall(capped.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        t0 = time.monotonic()
        closed = closed_times([late], within_s=MARGIN_S)
        assert late in closed and closed[late] - t0 < 1, "a new connection waited behind busy ones"
        late.close()
    finally:
        close_all(busy)
    deadline = time.monotonic() + MARGIN_S
    while True:  # room again once the busy ones are gone
        try:
            assert health_s(capped.url) < MARGIN_S
            break
        except (httpx.HTTPError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
