"""Sign-in that cannot be aimed at someone.

Device cookies: a browser that signed in before is counted and locked out per its own cookie,
so failures from other addresses (or other browsers at its address) do not keep it out; the
cookie is bound to the name and ends with a password change or a removal, and cannot be made
up. The hashing queue is fair by address: a crowd of sign-ins from one or a few addresses
costs a sign-in from elsewhere about a hash, and a trusted browser's goes first. /login and
/logout refuse requests another site made a browser send. Unit tests of the queue, the
cookies, the guard and the cross-site rule, then the same on a real server over real HTTP.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from radixchat.core.store import AuthFailed, Store
from radixchat.webui.auth.device_cookie import PREFIX, DeviceCookies
from radixchat.webui.auth.signin import Attempt, QueueFull, SignInGuard, TooManyFailures, begin
from radixchat.webui.auth.signin_door import cross_site, same_origin
from radixchat.webui.auth.signin_queue import FairQueue, address_lane
from tests.support.cheap import cheap_scrypt
from tests.support.signin import fail_until_locked, from_address, login

# ---- the queue -----------------------------------------------------------------------------


def drain(q: FairQueue) -> list:
    out = []
    while (item := q.pop()) is not None:
        out.append(item)
    return out


def test_a_crowd_in_one_lane_costs_a_newcomer_one_turn():
    q = FairQueue(per_lane=1000)
    for i in range(300):
        q.push("10.6.6.6", f"crowd{i}")
    q.push("10.0.0.7", "alice")
    order = drain(q)
    assert order.index("alice") == 1, order[:5]  # after the crowd's first, not its 300th
    assert len(order) == 301


def test_lanes_take_turns_and_a_trusted_attempt_goes_first_at_equal_turns():
    q = FairQueue(per_lane=1000)
    for i in range(100):
        for addr in ("10.6.6.1", "10.6.6.2", "10.6.6.3"):
            q.push(addr, f"{addr}#{i}")
    q.push(("user", "alice"), "alice-trusted", trusted=True)
    q.push("10.0.0.8", "alice-untrusted")
    order = drain(q)
    assert order[0] == "alice-trusted", order[:5]
    assert order.index("alice-untrusted") == 4, order[:6]  # after one turn of each crowded lane
    assert order[5:11] == [f"{a}#{i}" for i in (1, 2) for a in ("10.6.6.1", "10.6.6.2", "10.6.6.3")]


def test_a_lane_that_refills_itself_gets_no_more_than_its_turn():
    q = FairQueue()
    for i in range(10):
        q.push("b", f"b{i}")
    served = []
    q.push("a", "a0")
    for i in range(1, 10):  # "a" sends its next as soon as its last is taken
        served.append(q.pop())
        q.push("a", f"a{i}")
    served += drain(q)
    assert served[:6] == ["b0", "a0", "b1", "a1", "b2", "a2"], served


def test_the_queue_is_bounded_per_address_and_in_all():
    q = FairQueue(per_lane=3, total=7)
    for i in range(3):
        q.push("10.6.6.6", f"m{i}")
    with pytest.raises(QueueFull, match="too many sign-ins waiting from this address"):
        q.push("10.6.6.6", "m3")
    for i in range(3):
        q.push("10.6.6.7", f"n{i}")
    assert q.push("10.0.0.7", "alice") == []
    assert len(q) == 7
    # full: a newcomer takes the place of the longest lane's newest
    assert q.push("10.0.0.8", "bob") == ["m2"]
    assert q.push("10.0.0.9", "carol") == ["n2"]
    with pytest.raises(QueueFull, match="too many sign-ins waiting on this server"):
        q.push("10.0.0.7", "alice2")  # hers would be as long as the longest: her turn is her share
    assert len(q) == 7
    assert sorted(drain(q)) == ["alice", "bob", "carol", "m0", "m1", "n0", "n1"]


def test_an_ipv6_host_takes_one_lane_for_its_64():
    assert address_lane("2001:db8:1:2:aaaa::1") == address_lane("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_lane("2001:db8:1:3::1") != address_lane("2001:db8:1:2::1")
    assert address_lane("::ffff:10.0.0.7") == "10.0.0.7"
    assert address_lane("10.0.0.7") == "10.0.0.7" and address_lane("?") == "?"


# ---- the guard with real hashing threads --------------------------------------------------


def recording_verify(right: dict[str, str], delay: float = 0.002):
    hashed: list[str] = []

    def verify(name, password):
        hashed.append(name)
        time.sleep(delay)
        if right.get(name) != password:
            raise AuthFailed("wrong")
        return name

    return verify, hashed


@pytest.mark.parametrize("addresses", [1, 3])
def test_a_crowd_of_failed_sign_ins_costs_alice_about_a_hash_per_crowded_address(addresses):
    """300 wrong sign-ins with random names from one or three addresses, then alice from her
    own: first come first served hashed her 301st; now she waits a turn of each address."""
    verify, hashed = recording_verify({"alice": "right"})
    guard = SignInGuard(verify, free_failures=10_000)

    async def main():
        crowd = [
            asyncio.create_task(guard.sign_in(f"rnd{i}", "wrong", addr=f"10.6.6.{i % addresses}")) for i in range(300)
        ]
        await asyncio.sleep(0)  # the crowd is queued
        ok = await guard.sign_in("alice", "right", addr="10.0.0.7")
        answers = await asyncio.gather(*crowd, return_exceptions=True)
        return ok, answers

    ok, answers = asyncio.run(main())
    assert ok is True
    assert hashed.index("alice") <= addresses, hashed[: addresses + 2]
    # each crowded address holds at most 64 waiting: the rest were refused unhashed
    refused = [a for a in answers if isinstance(a, QueueFull)]
    assert len(refused) >= 300 - addresses * 65 and guard.queue_refused == len(refused)
    assert "too many sign-ins waiting from this address" in str(refused[0])
    assert len(hashed) == 300 - len(refused) + 1


def test_a_trusted_browser_goes_ahead_of_a_crowd_from_many_addresses():
    keys = {"alice": "alice-session-key"}
    verify, hashed = recording_verify({"alice": "right"})
    guard = SignInGuard(verify, free_failures=10_000, devices=DeviceCookies(keys.get))
    cookie = cookie_of(guard.devices.issue("alice", secure=False))

    async def main():
        crowd = [asyncio.create_task(guard.sign_in(f"rnd{i}", "w", addr=f"10.6.{i}.1")) for i in range(50)]
        await asyncio.sleep(0)
        ok = await guard.sign_in("alice", "right", addr="10.0.0.7", cookies=cookie)
        await asyncio.gather(*crowd)
        return ok

    assert asyncio.run(main()) is True
    assert hashed.index("alice") == 1, hashed[:3]  # after the hash that was running


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def cookie_of(set_cookie: str | None) -> dict[str, str]:
    assert set_cookie, "no device cookie was made"
    name, _, rest = set_cookie.partition("=")
    return {name: rest.split(";")[0]}


def test_a_browser_that_signed_in_before_is_not_locked_out_by_anyone_elses_failures():
    keys = {"alice": "k-alice", "bob": "k-bob"}
    verify, _ = recording_verify({"alice": "right", "bob": "bobs"}, delay=0)
    guard = SignInGuard(verify, free_failures=3, devices=DeviceCookies(keys.get), clock=Clock())

    async def attempt(name, password, addr, cookies=None):
        begin(a := Attempt(addr, dict(cookies or {})))
        try:
            return await guard.sign_in(name, password), a.set_cookie
        except TooManyFailures:
            return "429", a.set_cookie

    async def main():
        ok, set_cookie = await attempt("alice", "right", "10.0.0.7")
        assert ok is True and set_cookie.startswith(PREFIX)
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Secure" not in set_cookie
        mine = cookie_of(set_cookie)
        for i in range(3):  # mallory, from three addresses: alice's name is locked out
            assert (await attempt("alice", "guess", f"10.6.6.{i}"))[0] is False
        for i in range(3):  # and from alice's own address, under other names: so is it
            assert (await attempt(f"x{i}", "guess", "10.0.0.7"))[0] is False
        assert (await attempt("alice", "right", "10.0.0.9"))[0] == "429"  # a browser without the cookie
        assert (await attempt("alice", "right", "10.0.0.7"))[0] == "429"
        ok, renewed = await attempt("alice", "right", "10.0.0.7", mine)
        assert ok is True and renewed and cookie_of(renewed) != mine  # a new nonce each time
        # made up, or another user's, or for another name: not trusted
        forged = {next(iter(mine)): "A" * 22 + "." + "B" * 22}
        assert (await attempt("alice", "right", "10.0.0.7", forged))[0] == "429"
        _, bobs = await attempt("bob", "bobs", "10.0.0.50")
        bob_value = next(iter(cookie_of(bobs).values()))
        assert (await attempt("alice", "right", "10.0.0.7", {next(iter(mine)): bob_value}))[0] == "429"
        # the trusted browser's own failures lock out that browser only
        for _ in range(3):
            assert (await attempt("alice", "typo", "10.0.0.7", mine))[0] is False
        assert (await attempt("alice", "right", "10.0.0.7", mine))[0] == "429"
        assert (await attempt("alice", "right", "10.0.0.7", cookie_of(renewed)))[0] is True  # her other one
        # a password change (a new session key) ends every cookie of hers
        keys["alice"] = "k-alice-2"
        assert (await attempt("alice", "right", "10.0.0.7", cookie_of(renewed)))[0] == "429"
        return True

    assert asyncio.run(main())


def test_device_cookies_follow_the_stores_session_key(tmp_path):
    """With the real store: a cookie made for alice is good for her name (any case) until her
    password changes; a removed user's is not good for a new user of the same name."""
    with Store(tmp_path / "d.db", scrypt=cheap_scrypt()) as store:
        store.create_user("alice", "alice-password")
        store.create_user("bob", "bob-password")
        devices = DeviceCookies(store.session_key)
        alice = cookie_of(devices.issue("alice", secure=True))
        assert devices.issue("alice", secure=True).endswith("; Secure")
        assert devices.trusted("alice", alice) and devices.trusted("ALICE", alice)
        assert devices.trusted("bob", alice) is None and devices.trusted("nobody", alice) is None
        assert devices.issue("nobody", secure=False) is None
        store.set_password("alice", "alice-password-2")
        assert devices.trusted("alice", alice) is None
        bob = cookie_of(devices.issue("bob", secure=False))
        store.remove_user("bob")
        assert devices.trusted("bob", bob) is None
        store.create_user("bob", "another-bob-password")
        assert devices.trusted("bob", bob) is None


# ---- the cross-site rule -----------------------------------------------------------------


def scope_with(**headers: str) -> dict:
    raw = [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "headers": [(b"host", b"chat.example:8000"), *raw]}


def test_which_requests_count_as_made_by_another_site():
    here = "http://chat.example:8000"
    for login_or_logout in (True, False):
        assert cross_site(scope_with(Sec_Fetch_Site="cross-site"), login_or_logout) == "Sec-Fetch-Site: cross-site"
        assert cross_site(scope_with(Sec_Fetch_Site="same-site", Origin=here), login_or_logout)  # another port
        assert cross_site(scope_with(Sec_Fetch_Site="same-origin"), login_or_logout) is None
        assert cross_site(scope_with(Sec_Fetch_Site="none"), login_or_logout) is None  # typed
        assert cross_site(scope_with(Origin="http://evil.example"), login_or_logout)
        assert cross_site(scope_with(Origin="null"), login_or_logout)
        assert cross_site(scope_with(Origin=here), login_or_logout) is None
        assert cross_site(scope_with(Referer=here + "/somewhere?x=1"), login_or_logout) is None
        assert cross_site(scope_with(Referer="http://evil.example/" + here), login_or_logout)
        assert cross_site(scope_with(Origin="http://evil.example", Referer=here + "/"), login_or_logout)
    assert cross_site(scope_with(), bare_allowed=True) is None  # curl, the tests: POST /login
    assert cross_site(scope_with(), bare_allowed=False) == "no Sec-Fetch-Site, Origin or Referer"


def test_same_origin_compares_host_and_port():
    assert same_origin("https://chat.example", "chat.example")
    assert same_origin("https://chat.example", "chat.example:443")
    assert same_origin("http://Chat.Example:80/x", "chat.example")
    assert same_origin("http://[::1]:8000", "[::1]:8000")
    assert not same_origin("http://chat.example:8001", "chat.example:8000")
    assert not same_origin("http://chat.example.evil", "chat.example")
    assert not same_origin("http://user@evil.example", "chat.example")
    assert not same_origin("http://chat.example:bad", "chat.example")
    assert not same_origin("file:///etc/passwd", "chat.example")
    assert not same_origin("null", "chat.example")


# ---- a real server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    from tests.support.server import Server, stop_clean

    db = tmp_path_factory.mktemp("signin-device") / "s.db"
    with Store(db, scrypt=cheap_scrypt()) as store:
        for name in ("alice", "bob", "carol"):
            store.create_user(name, f"{name}-password")
    srv = Server(tiny_model_dir, db)
    srv.db = db
    yield srv
    stop_clean(srv)


@pytest.mark.slow
def test_alice_signs_in_from_her_browser_while_failures_elsewhere_lock_out_her_name(server):
    alice = from_address(server.url, 2)
    first = login(alice, "alice")
    assert first.status_code == 200, first.text
    device = [c for c in first.headers.get_list("set-cookie") if c.startswith(PREFIX)]
    assert len(device) == 1 and "HttpOnly" in device[0] and "SameSite=Strict" in device[0], device

    # mallory fails alice's password from rotating addresses, and carol's from alice's own
    names = threading.Thread(target=fail_until_locked, args=(server.url, "alice", "guess", range(20, 250), 8))
    names.start()
    fail_until_locked(server.url, "carol", "guess", [2] * 100, 8)
    names.join()

    with from_address(server.url, 3) as elsewhere:
        assert login(elsewhere, "alice").status_code == 429  # a browser without her cookie
    with from_address(server.url, 2) as same_address:
        locked = login(same_address, "bob")
        assert locked.status_code == 429 and "too many failed sign-ins" in locked.text
    ok = login(alice, "alice")
    assert ok.status_code == 200 and ok.json() == {"success": True}, ok.text
    assert alice.get("/config").status_code == 200  # signed in for real

    with from_address(server.url, 3) as forger:
        forger.cookies.set(DeviceCookies.cookie_name("alice"), "A" * 22 + "." + "B" * 22)
        assert login(forger, "alice").status_code == 429

    with Store(server.db, scrypt=cheap_scrypt()) as store:  # her password changes: the cookie ends
        store.set_password("alice", "alice-password-2")
    assert login(alice, "alice", "alice-password-2").status_code == 429
    alice.close()


@pytest.mark.slow
def test_login_and_logout_refuse_requests_from_another_site(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Referer": "http://evil.example/page"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
        ):
            r = login(c, "bob", **headers)
            assert r.status_code == 403, (headers, r.text)
            assert "did not come from this server's page" in r.json()["detail"], r.text
            assert not c.cookies, "a refused sign-in set a cookie"
        # the page's own, and clients that send none of the headers
        assert login(c, "bob", Origin=server.url).status_code == 200
        assert login(c, "bob", Referer=server.url + "/").status_code == 200
        assert login(c, "bob", **{"Sec-Fetch-Site": "same-origin"}).status_code == 200
        assert login(c, "bob").status_code == 200

        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Referer": "http://evil.example/"}, {}):
            r = c.get("/logout", headers=headers)
            assert r.status_code == 403, (headers, r.text)
            assert c.get("/config").status_code == 200  # still signed in
        out = c.get("/logout", headers={"Sec-Fetch-Site": "same-origin"})
        assert out.status_code == 302, out.text
        assert c.get("/config").status_code == 401
