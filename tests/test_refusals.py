"""A client whose API requests keep being refused is throttled before its bodies are read
(webui/api/refusals.py); other clients, and the same client's accepted requests, are not."""

from __future__ import annotations

import asyncio

import httpx

from radixchat.core.config import Settings
from radixchat.webui.api.refusals import RefusalThrottle
from radixchat.webui.server import build_app
from tests.support.fake_engine import FakeEngine
from tests.support.metrics import metric_value

CHAT = "/v1/chat/completions"
GOOD = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
BIG = {"model": "default", "messages": [{"role": "user", "content": 5}]}  # content must be text: 400


def throttle_of(app) -> RefusalThrottle:
    node = app.middleware_stack
    while not isinstance(node, RefusalThrottle):
        node = node.app
    return node


def test_refusals_past_the_burst_are_429_before_the_body_is_read_and_only_for_that_client():
    app = build_app(FakeEngine(), Settings(no_auth=True), None)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            mallory = {"Authorization": "Bearer mallory-key"}
            assert (await c.post(CHAT, json=GOOD, headers=mallory)).status_code == 200
            throttle_of(app).clock = lambda: 0.0  # time stands still: no refill
            codes = [(await c.post(CHAT, json=BIG, headers=mallory)).status_code for _ in range(65)]
            throttled = await c.post(CHAT, json=GOOD, headers=mallory)
            alice = [(await c.post(CHAT, json=GOOD, headers={"Authorization": "Bearer alice-key"})) for _ in range(3)]
            metrics = (await c.get("/metrics")).text
        return codes, throttled, alice, metrics

    # /metrics answers loopback only; ASGITransport's client is 127.0.0.1
    codes, throttled, alice, metrics = asyncio.run(scenario())
    assert codes[:60] == [400] * 60 and set(codes[60:]) == {429}, codes
    assert throttled.status_code == 429  # a good request too, while her bucket is empty
    err = throttled.json()["error"]
    assert err["code"] == "too_many_refused" and err["type"] == "rate_limit_error"
    assert int(throttled.headers["retry-after"]) >= 1
    assert [r.status_code for r in alice] == [200, 200, 200]
    assert metric_value(metrics, "radixchat:request_refused_total", reason="too_many_refused") == 6


def test_the_bucket_refills_and_accepted_requests_never_drain_it():
    now = [0.0]
    seen = []

    async def app(scope, receive, send):
        body = await receive()
        seen.append(len(body.get("body", b"")))
        status = 400 if scope["path"].endswith("bad") else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    throttle = RefusalThrottle(app, burst=3, per_s=1.0, clock=lambda: now[0])

    async def call(path: str) -> int:
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"x" * 10, "more_body": False}

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "path": path, "headers": [(b"x-api-key", b"k")], "client": ("1.2.3.4", 1)}
        await throttle(scope, receive, send)
        return sent[0]["status"]

    async def scenario():
        good = [await call("/v1/good") for _ in range(50)]
        bad = [await call("/v1/bad") for _ in range(4)]
        read_before = len(seen)
        refused = await call("/v1/good")
        unread = len(seen) == read_before
        now[0] += 1.0  # one refusal's worth refilled
        after = [await call("/v1/bad"), await call("/v1/bad")]
        return good, bad, refused, unread, after

    good, bad, refused, unread, after = asyncio.run(scenario())
    assert set(good) == {200}
    assert bad == [400, 400, 400, 429]
    assert refused == 429 and unread  # its body was never read
    assert after == [400, 429]


def test_a_users_refusals_are_counted_across_all_their_keys(store):
    """Each key was a client of its own: a user with many keys had a bucket per key. Once a
    key is known as hers, her refusals through any key drain one bucket of hers too."""
    mallory, alice = store.create_user("mallory", "pw-mallory-1"), store.create_user("alice", "pw-alice-12")
    keys = [store.create_api_key(mallory)[1] for _ in range(4)]
    _, alices = store.create_api_key(alice)
    app = build_app(FakeEngine(), Settings(), store)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:

            async def post(key, body):
                return (await c.post(CHAT, json=body, headers={"Authorization": f"Bearer {key}"})).status_code

            assert await post(alices, GOOD) == 200  # (the middleware stack is built at the first request)
            throttle_of(app).clock = lambda: 0.0  # time stands still: no refill
            codes = [await post(keys[i % 4], BIG) for i in range(64)]
            after = [await post(k, GOOD) for k in keys]
            hers = await post(alices, GOOD)
        return codes, after, hers

    codes, after, hers = asyncio.run(scenario())
    # 60 refusals (the burst) across her four keys empty her own bucket: each key has 45 left
    assert codes[:60] == [400] * 60 and set(codes[60:]) == {429}, codes
    assert after == [429] * 4  # every key of hers, even a good request
    assert hers == 200  # alice's key is hers alone


def test_a_front_ends_end_users_each_have_their_own_bucket_and_an_ordinary_key_does_not(store):
    """Open WebUI's one key carries every end user's requests (X-OpenWebUI-User-Id names each,
    a user of their own): mallory refused through it must not 429 alice through it. An
    ordinary key's such header names nobody, so varying it does not escape the key's bucket."""
    owui, bob = store.create_user("owui", "pw-owui-123"), store.create_user("bob", "pw-bob-1234")
    _, front = store.create_api_key(owui, front_end=True)
    _, bobs = store.create_api_key(bob)
    app = build_app(FakeEngine(), Settings(), store)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:

            async def post(key, body, end=None):
                headers = {"Authorization": f"Bearer {key}"} | ({"X-OpenWebUI-User-Id": end} if end else {})
                return (await c.post(CHAT, json=body, headers=headers)).status_code

            assert await post(front, GOOD, "alice") == 200  # (the middleware stack is built at the first request)
            throttle_of(app).clock = lambda: 0.0  # time stands still: no refill
            mallory = [await post(front, BIG, "mallory") for _ in range(64)]
            alice = [await post(front, GOOD, "alice") for _ in range(3)]
            bob_codes = [await post(bobs, BIG, f"someone-{i}") for i in range(64)]
            store.revoke_api_key(front)  # a key no longer a front end's: its headers name nobody
            revoked = [await post(front, BIG, f"someone-{i}") for i in range(64)]
        return mallory, alice, bob_codes, revoked

    mallory, alice, bob_codes, revoked = asyncio.run(scenario())
    assert mallory[:60] == [400] * 60 and set(mallory[60:]) == {429}, mallory
    assert alice == [200] * 3
    assert bob_codes[:60] == [400] * 60 and set(bob_codes[60:]) == {429}, bob_codes
    # the first refusal still counts to its end user (the key was a front end's until then)
    assert revoked.count(401) == 61 and set(revoked[-3:]) == {429}, revoked


def test_a_user_at_their_limit_is_refused_before_the_body_is_read_through_any_key(store):
    """Only the engine counted a user's requests, after their bodies were parsed and checked:
    mallory at her limit re-sending 64 KB schemas kept the event loop ~75% busy. Now a POST of
    hers past her limit is 429 `user_limit` before its body is read (a body that would be a
    400 gets the 429), through any key of hers; alice is not; and a request stops counting as
    its answer ends, so one sent at once after it is not refused."""
    mallory, alice = store.create_user("mallory", "pw-mallory-1"), store.create_user("alice", "pw-alice-12")
    store.set_request_limit("mallory", 2)
    keys = [store.create_api_key(mallory)[1] for _ in range(2)]
    _, alices = store.create_api_key(alice)
    engine = FakeEngine()
    app = build_app(engine, Settings(), store)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:

            async def post(key, body):
                return await c.post(CHAT, json=body, headers={"Authorization": f"Bearer {key}"})

            for k in keys:  # each learnt as hers (her limit 2) at its first answer
                assert (await post(k, GOOD)).status_code == 200
            assert (await post(keys[0], GOOD)).status_code == 200  # (the last one no longer counts)
            engine.hold = True
            held = [asyncio.create_task(post(keys[i], GOOD)) for i in range(2)]
            while len(engine._held) < 2:
                await asyncio.sleep(0.01)
            refused = [await post(k, BIG) for k in keys]
            engine.hold = False
            hers = await post(alices, GOOD)
            engine.release()
            done = [(await t).status_code for t in held]
            again = await post(keys[1], GOOD)
        return refused, hers, done, again

    refused, hers, done, again = asyncio.run(scenario())
    for r in refused:
        assert r.status_code == 429, r.text
        assert (
            r.json()["error"]["code"] == "user_limit" and "you already have 2 requests" in r.json()["error"]["message"]
        )
        assert r.headers["retry-after"] == "2"
    assert hers.status_code == 200
    assert done == [200, 200] and again.status_code == 200
