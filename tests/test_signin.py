"""Sign-in throttling: lockouts per name and per address that refuse before hashing, a bounded
hashing pool, and the page's real /login route on a real server."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import httpx
import pytest

from radixchat.core.store import AuthFailed, Store
from radixchat.webui.auth.signin import SignInGuard, TooManyFailures


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make_guard(clock, **kw):
    calls = []

    def verify(name, password):
        calls.append((name, password))
        if password != "right":
            raise AuthFailed("wrong")
        return name

    return SignInGuard(verify, clock=clock, **kw), calls


def test_lockout_doubles_refuses_before_hashing_and_clears_on_success():
    clock = Clock()
    guard, calls = make_guard(clock, free_failures=3)

    async def main():
        for _ in range(3):
            assert await guard.sign_in("alice", "wrong", addr="10.0.0.9") is False
        hashed = len(calls)
        # locked for 1 s: even the right password is refused, and nothing is hashed
        for pw in ("wrong", "right"):
            with pytest.raises(TooManyFailures) as info:
                await guard.sign_in("alice", pw, addr="10.0.0.9")
            assert 0 < info.value.retry_after_s <= 1
        assert len(calls) == hashed
        clock.now += 1.01
        assert await guard.sign_in("alice", "wrong", addr="10.0.0.9") is False  # 4th: 2 s now
        with pytest.raises(TooManyFailures) as info:
            await guard.sign_in("alice", "right", addr="10.0.0.9")
        assert 1 < info.value.retry_after_s <= 2
        clock.now += 2.01
        assert await guard.sign_in("alice", "right", addr="10.0.0.9") is True
        assert await guard.sign_in("alice", "wrong", addr="10.0.0.9") is False  # counting restarts
        assert await guard.sign_in("alice", "right", addr="10.0.0.9") is True

    asyncio.run(main())


def test_failing_a_name_now_and_then_does_not_keep_it_locked():
    """Wrong passwords one every 300 s after a burst kept alice's name locked (429, 300 s) for
    every browser she had not used: the count never fell. Now each lockout is half the last."""
    clock = Clock()
    guard, _calls = make_guard(clock)  # the server's settings: 5 free, up to 300 s, one forgiven each 2 minutes

    async def fail_from_a_new_address(i):
        while True:  # a guesser waits out each lockout
            try:
                return await guard.sign_in("alice", "wrong", addr=f"10.9.0.{i}")
            except TooManyFailures as e:
                clock.now += e.retry_after_s + 0.01

    async def main():
        for i in range(12):
            await fail_from_a_new_address(i)
        for i in range(12, 20):
            clock.now += 300
            await fail_from_a_new_address(i)
        clock.now += 2  # alice, from a browser she has not used, seconds after the last failure
        assert await guard.sign_in("alice", "right", addr="10.1.1.1") is True

    asyncio.run(main())


def test_guessing_at_full_speed_is_held_near_one_try_in_two_minutes():
    clock = Clock()
    guard, calls = make_guard(clock)
    start = clock.now

    async def main():
        for i in range(30):
            while True:
                try:
                    await guard.sign_in("alice", "wrong", addr=f"10.8.{i}.1")
                    break
                except TooManyFailures as e:
                    clock.now += e.retry_after_s + 0.01

    asyncio.run(main())
    assert clock.now - start > 25 * 80  # 30 guesses: the free 5, then about one each 2 minutes
    assert len(calls) == 30  # and nothing hashed while locked


def test_a_guessing_address_is_locked_out_for_every_name_and_a_guessed_name_from_every_address():
    clock = Clock()
    guard, _calls = make_guard(clock, free_failures=2)

    async def main():
        for name in ("alice", "bob"):
            await guard.sign_in(name, "wrong", addr="10.0.0.66")
        with pytest.raises(TooManyFailures):  # the address, whatever the name
            await guard.sign_in("carol", "right", addr="10.0.0.66")
        for addr in ("10.0.1.1", "10.0.1.2"):
            await guard.sign_in("dave", "wrong", addr=addr)
        with pytest.raises(TooManyFailures):  # the name, whatever the address
            await guard.sign_in("dave", "right", addr="10.0.1.3")
        assert await guard.sign_in("erin", "right", addr="10.0.2.1") is True  # others are unaffected

    asyncio.run(main())


def test_hashing_runs_one_at_a_time_however_many_sign_in_at_once():
    active, peak, lock = [0], [0], threading.Lock()

    def slow_verify(name, password):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        raise AuthFailed("wrong")

    guard = SignInGuard(slow_verify, free_failures=1000)

    async def main():
        await asyncio.gather(*(guard.sign_in(f"user{i}", "x", addr=f"10.0.0.{i}") for i in range(20)))

    asyncio.run(main())
    assert peak[0] == 1


@pytest.mark.slow
def test_the_page_login_route_locks_out_a_guesser(tiny_model_dir, tmp_path):
    from tests.support.server import Server

    db = tmp_path / "signin.db"
    with Store(db) as store:
        store.create_user("alice", "correct horse battery")
    server = Server(tiny_model_dir, db)
    try:

        def login(pw):
            return httpx.post(server.url + "/login", data={"username": "alice", "password": pw}, timeout=30)

        assert [login("wrong guess").status_code for _ in range(5)] == [400] * 5
        locked = login("correct horse battery")
        assert locked.status_code == 429, locked.text
        assert "too many failed sign-ins" in locked.text and locked.headers["retry-after"] == "1"
        time.sleep(1.1)
        ok = login("correct horse battery")
        assert ok.status_code == 200 and ok.json() == {"success": True}
        with Store(db) as store:  # disabled: the right password says so, a wrong one is only wrong
            store.set_disabled("alice", True)
        off = login("correct horse battery")
        assert off.status_code == 403 and "This account is disabled" in off.text, off.text
        assert login("wrong guess").status_code == 400
    finally:
        out = server.stop()
    assert "failed sign-in for 'alice' from 127.0.0.1" in out
    assert "Traceback" not in out


def test_a_burst_sent_at_once_is_hashed_only_until_the_lockout():
    """Forty wrong sign-ins arriving together queue for the one hashing thread; the lockout
    must stop them there, not after all forty were hashed."""
    hashed = []

    def verify(name, password):
        hashed.append(name)
        time.sleep(0.005)
        raise AuthFailed("wrong")

    guard = SignInGuard(verify, free_failures=5)

    async def one():
        try:
            return await guard.sign_in("alice", "wrong", addr="10.0.0.9")
        except TooManyFailures:
            return "429"

    async def main():
        return await asyncio.gather(*(one() for _ in range(40)))

    answers = asyncio.run(main())
    assert len(hashed) == 5 and answers.count("429") == 35, (len(hashed), answers)


@pytest.mark.slow
def test_a_locked_out_address_is_answered_before_the_page_runs(tiny_model_dir, tmp_path):
    """The 429 for an address in a lockout comes from the address middleware: it holds for
    any form, even one the page would reject as malformed."""
    from tests.support.server import Server

    db = tmp_path / "lock.db"
    with Store(db) as store:
        store.create_user("alice", "correct horse battery")
    server = Server(tiny_model_dir, db)
    try:
        for _ in range(5):
            httpx.post(server.url + "/login", data={"username": "alice", "password": "nope"}, timeout=30)
        bare = httpx.post(server.url + "/login", content=b"not a form at all", timeout=30)
        assert bare.status_code == 429 and bare.headers["retry-after"] == "1", bare.text
        assert "too many failed sign-ins" in bare.json()["detail"]
    finally:
        server.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority is Linux's")
def test_passwords_are_hashed_at_the_lowest_cpu_priority():
    """A flood of wrong sign-ins keeps a hashing thread busy: at nice 19 it takes the cores
    only when the engine and the event loop leave them idle (an API request under a login
    flood: p95 1.86x idle before, 1.28x after, loadtests/bench_signin --many-addresses)."""
    import os

    from radixchat.webui.auth.signin_queue import HashingLine

    line = HashingLine()
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def ask():
        return await line.run("lane", lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    assert asyncio.run(ask()) == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # this thread is untouched


@pytest.mark.slow
def test_the_sign_in_page_says_why_a_sign_in_was_refused(tiny_model_dir, tmp_path, browser):
    """Gradio's form shows only "Incorrect Credentials" (400); a disabled account (403) and a
    lockout (429) are shown under the form by the page's own script, in Chromium."""
    from tests.support.browser import WIDE
    from tests.support.page import sign_in
    from tests.support.server import CHEAP, page_server, stop_clean

    srv = page_server(tiny_model_dir, tmp_path)
    context = browser.new_context(viewport=WIDE)
    try:
        with Store(srv.db, scrypt=CHEAP) as store:
            store.set_disabled("bob", True)
        page = context.new_page()
        sign_in(page, srv.url, "bob")  # his right password
        notice = page.locator("#rc-login-notice")
        notice.wait_for(timeout=15_000)
        assert "This account is disabled" in notice.inner_text() and notice.get_attribute("role") == "alert"
        said = ""
        for _ in range(12):  # wrong passwords until the name is locked out (its lockouts are short)
            page.locator("input[type=text]").fill("bob")  # the form empties both after a 400
            page.locator("input[type=password]").fill("not bobs password")
            page.get_by_role("button", name="Login").click()
            page.wait_for_timeout(400)
            said = page.evaluate("document.querySelector('#rc-login-notice')?.innerText || ''")
            if "too many failed sign-ins" in said:
                break
        assert "too many failed sign-ins" in said, said
    finally:
        context.close()
        stop_clean(srv)
