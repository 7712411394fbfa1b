"""The OpenAI-compatible API on a real server process, driven by the official client."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.clients import GOOD, RECIPE, client
from tests.support.metrics import metric_value
from tests.support.procs import RADIXCHAT
from tests.support.server import Server

SYSTEM = "You are a helpful Python tutor. Answer briefly about lists, dicts and generators."


@pytest.mark.slow
def test_official_client_non_streaming_and_cached_tokens(keyed):
    server, key, _, db = keyed
    c = client(server, key)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a list?"}]
    first = c.chat.completions.create(model="default", messages=msgs, max_tokens=8, temperature=0)
    assert first.choices[0].message.role == "assistant" and first.choices[0].message.content
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.usage.completion_tokens <= 8 and first.usage.prompt_tokens > 10
    msgs[1]["content"] = "What is a dict?"
    second = c.chat.completions.create(model=first.model, messages=msgs, max_tokens=8, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= len(SYSTEM) // 8  # the system prompt hit
    with Store(db) as store:
        alice = store.get_user("alice")
    # every API request is logged under the key's user (the server writes asynchronously)
    deadline = time.time() + 10
    while time.time() < deadline:
        with sqlite3.connect(db) as con:
            rows = con.execute("SELECT user, prompt_tokens, cached_tokens FROM requests").fetchall()
        if len(rows) >= 2:
            break
        time.sleep(0.2)
    assert len(rows) >= 2 and all(user == alice.id for user, _, _ in rows)
    assert any(cached > 0 for _, _, cached in rows)


@pytest.mark.slow
def test_official_client_streaming(keyed):
    server, key, _, _ = keyed
    c = client(server, key)
    stream = c.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Explain generators."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(chunks) >= 4 and text and finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    plain = c.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Explain generators."}], max_tokens=12, temperature=0
    )
    assert plain.choices[0].message.content == text  # greedy: streaming changes nothing


@pytest.mark.slow
def test_completions_and_models(keyed):
    server, key, _, _ = keyed
    c = client(server, key)
    models = c.models.list().data
    assert len(models) == 1
    out = c.completions.create(model=models[0].id, prompt="def main():", max_tokens=5, temperature=0)
    assert out.choices[0].text and out.usage.completion_tokens == 5
    streamed = list(
        c.completions.create(model="default_model", prompt="def main():", max_tokens=5, temperature=0, stream=True)
    )
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == out.choices[0].text


def bad_cases(key, revoked):
    auth = {"Authorization": f"Bearer {key}"}
    j = {**auth, "Content-Type": "application/json"}
    chat = "/v1/chat/completions"

    def body(**changes):
        b = {**GOOD, **changes}
        return json.dumps({k: v for k, v in b.items() if v is not ...})

    return [
        # (method, path, headers, body, status, words in message)
        ("POST", chat, {"Content-Type": "application/json"}, body(), 401, "missing API key"),
        ("POST", chat, {"Authorization": "Bearer nope", "Content-Type": "application/json"}, body(), 401, "invalid"),
        (
            "POST",
            chat,
            {"Authorization": f"Bearer {revoked}", "Content-Type": "application/json"},
            body(),
            401,
            "revoked",
        ),
        ("POST", chat, {"Authorization": "Basic abc", "Content-Type": "application/json"}, body(), 401, "Bearer"),
        ("POST", chat, j, "{not json", 400, "not valid JSON"),
        ("POST", chat, j, "[1, 2]", 400, "JSON object"),
        ("POST", chat, j, body(model=...), 400, "model"),
        ("POST", chat, j, body(messages=...), 400, "messages"),
        ("POST", chat, j, body(messages=[]), 400, "messages"),
        ("POST", chat, j, body(messages="hello"), 400, "messages"),
        ("POST", chat, j, body(messages=[{"role": "robot", "content": "x"}]), 400, "role"),
        ("POST", chat, j, body(messages=[{"role": "user"}]), 400, "content"),
        ("POST", chat, j, body(messages=[{"role": "user", "content": 5}]), 400, "content"),
        ("POST", chat, j, body(max_tokens=-3), 400, "max_tokens"),
        ("POST", chat, j, body(max_tokens=0), 400, "max_tokens"),
        ("POST", chat, j, body(max_tokens="many"), 400, "max_tokens"),
        ("POST", chat, j, body(temperature=-1), 400, "temperature"),
        ("POST", chat, j, body(temperature="hot"), 400, "temperature"),
        ("POST", chat, j, body(top_p=0), 400, "top_p"),
        ("POST", chat, j, body(n=17), 400, "n"),
        ("POST", chat, j, body(stop=[""]), 400, "stop"),
        ("POST", chat, j, body(stream="yes please"), 400, "stream"),
        ("POST", chat, j, body(tools=[{"type": "function"}]), 400, "tools.0.function"),
        ("POST", chat, j, body(presence_penalty=2.5), 400, "penalty"),
        ("POST", chat, j, body(repetition_penalty=0), 400, "repetition_penalty"),
        ("POST", chat, j, body(messages=[{"role": "assistant", "content": "I said"}]), 400, "last message"),
        ("POST", chat, j, body(model="gpt-4o"), 404, "not found"),
        ("POST", chat, j, body(messages=[{"role": "user", "content": "lists " * 3000}]), 400, "maximum context length"),
        ("POST", chat, j, body(messages=[{"role": "user", "content": "x" * (2 << 20)}]), 413, "body"),
        ("POST", "/v1/completions", j, json.dumps({"model": "default", "prompt": ""}), 400, "prompt"),
        ("POST", "/v1/completions", j, json.dumps({"model": "default", "prompt": ["a", "b"]}), 400, "one prompt"),
        ("GET", "/v1/nothing-here", auth, None, 404, "unknown route"),
        ("GET", "/v1/models", {}, None, 401, "API key"),
        ("GET", "/v1/models/gpt-4o", auth, None, 404, "not found"),
        # the parameter table: not implemented is refused by name, never silently ignored
        ("POST", chat, j, body(functions=[{"name": "f"}]), 400, "functions"),
        ("POST", chat, j, body(tool_choice="required"), 400, "tool_choice"),
        ("POST", chat, j, body(reasoning_effort="high"), 400, "reasoning_effort"),
        ("POST", chat, j, body(frobnicate=1), 400, "frobnicate: unknown field"),
        (
            "POST",
            chat,
            j,
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                    }
                ]
            ),
            400,
            "text only",
        ),
        ("POST", chat, j, body(messages=[{"role": "tool", "content": "42"}]), 400, "tool_call_id"),
        ("POST", chat, j, body(messages=[{"role": "user", "content": "hi", "colour": "red"}]), 400, "colour"),
        (
            "POST",
            "/v1/completions",
            j,
            json.dumps({"model": "default", "prompt": "a", "echo": True, "logprobs": 1}),
            400,
            "echo",
        ),
        ("POST", "/v1/completions", j, json.dumps({"model": "default", "prompt": "a", "best_of": 3}), 400, "best_of"),
        ("POST", "/v1/completions", j, json.dumps({"model": "default", "prompt": "a", "suffix": "z"}), 400, "suffix"),
    ]


@pytest.mark.slow
def test_fields_that_ask_for_nothing_are_accepted(keyed):
    """What clients send by default (off values, informational fields) is not an error."""
    server, key, _, _ = keyed
    auth = {"Authorization": f"Bearer {key}"}
    quiet = {
        "logprobs": False,
        "top_logprobs": None,
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "logit_bias": {},
        "user": "u1",
        "metadata": {"a": "b"},
        "store": False,
        "service_tier": "auto",
        "parallel_tool_calls": True,
        "n": 1,
        "presence_penalty": 0,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "bob"}],
    }
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post("/v1/chat/completions", headers=auth, json={**GOOD, **quiet})
        assert r.status_code == 200, r.text
        r = http.post(
            "/v1/completions",
            headers=auth,
            json={"model": "default", "prompt": "a", "max_tokens": 2, "echo": False, "best_of": 1, "logprobs": None},
        )
        assert r.status_code == 200, r.text
        for name in ("default", server_model_id(http, auth)):
            card = http.get(f"/v1/models/{name}", headers=auth)
            assert card.status_code == 200 and card.json()["object"] == "model", card.text
            assert card.json()["id"] == server_model_id(http, auth)


def server_model_id(http, auth) -> str:
    return http.get("/v1/models", headers=auth).json()["data"][0]["id"]


@pytest.mark.slow
def test_errors_carry_the_types_clients_map_to_their_exceptions(keyed):
    """The official client (and litellm, which reads the type and the wording) raise the
    exception a caller catches: a bad key is an AuthenticationError, a prompt over the
    context a BadRequestError with OpenAI's code and words."""
    import openai

    server, key, revoked, _ = keyed
    for bad in ("sk-not-a-key", revoked):
        with pytest.raises(openai.AuthenticationError) as info:
            client(server, bad).models.list()
        assert info.value.body["type"] == "authentication_error" and info.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as info:
        client(server, key).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "lists " * 3000}]
        )
    assert info.value.code == "context_length_exceeded" and info.value.body["type"] == "invalid_request_error"
    assert (
        info.value.message.startswith("Error code: 400")
        and "This model's maximum context length is" in info.value.body["message"]
    )


@pytest.mark.slow
def test_litellm_raises_what_its_callers_catch(keyed):
    """litellm maps by status, type and OpenAI's wording: a bad key is its AuthenticationError,
    a prompt over the context its ContextWindowExceededError (what agents catch to trim)."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of its price list at import
    import litellm

    server, key, _, _ = keyed

    def ask(api_key, words):
        return litellm.completion(
            model="openai/default",
            api_base=server.url + "/v1",
            api_key=api_key,
            messages=[{"role": "user", "content": words}],
            max_tokens=3,
            num_retries=0,
        )

    with pytest.raises(litellm.AuthenticationError):
        ask("sk-not-a-key", "hi")
    with pytest.raises(litellm.ContextWindowExceededError):
        ask(key, "lists " * 3000)
    assert ask(key, "hi").choices[0].message.content is not None


@pytest.mark.slow
def test_bad_requests_get_clear_errors_and_server_goes_on(keyed):
    server, key, revoked, _ = keyed
    cases = bad_cases(key, revoked)
    assert len(cases) >= 25
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for method, path, headers, body, status, words in cases:
            r = http.request(method, path, headers=headers, content=body)
            assert r.status_code == status, (path, body and body[:80], r.status_code, r.text)
            err = r.json()["error"]
            assert words.lower() in err["message"].lower(), (words, err)
            assert err["type"] and "message" in err
        # greedy: sampled at temperature 1, the random model may end at once with no text
        ok = http.post(
            "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={**GOOD, "temperature": 0}
        )
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_disconnect_mid_stream_cancels_in_engine(keyed):
    server, key, _, _ = keyed
    cancelled_before = server.metric("radixchat:request_success_total", finished_reason="cancelled")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            # ignore_eos: a sampled end of text must not finish it before the hang-up
            json={**GOOD, "max_tokens": 400, "stream": True, "ignore_eos": True},
        ) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: ") for line in got)
        # the response is closed: within a few seconds the engine has nothing running
        deadline = time.time() + 10
        while time.time() < deadline:
            health = http.get("/health").json()
            if health["active_requests"] == 0 and server.metric("radixchat:prefix_cache_locks") == 0:
                break
            time.sleep(0.1)
        assert health["active_requests"] == 0 and health["queue_depth"] == 0
        assert server.metric("radixchat:prefix_cache_locks") == 0
        assert server.metric("radixchat:request_success_total", finished_reason="cancelled") == cancelled_before + 1


@pytest.mark.slow
def test_queue_full_is_429_with_retry_after(tmp_path):
    from tests.support.randmodel import build_random_model

    # a long reply (ignore_eos: no early end of sequence) keeps the only slot busy a while
    model = build_random_model(tmp_path / "m", dim=128, layers=4, context=4096)
    server = Server(model, tmp_path / "q.db", "--no-auth", "--max-queue", "1")
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            with http.stream(
                "POST", "/v1/chat/completions", json={**GOOD, "max_tokens": 4000, "ignore_eos": True, "stream": True}
            ) as r:
                lines = r.iter_lines()
                while not next(lines).startswith('data: {"id"') or http.get("/health").json()["active_requests"] == 0:
                    pass  # until the long reply is really running in the engine
                busy = http.post("/v1/chat/completions", json=GOOD)
            assert busy.status_code == 429 and int(busy.headers["Retry-After"]) > 0, busy.text
            assert "busy" in busy.json()["error"]["message"] and busy.json()["error"]["type"] == "requests"
    finally:
        server.stop()


def test_each_api_request_is_recorded_once(engine, store, tiny_model_dir):
    """In-process: every request, served or refused, is one row and one count, however it
    was answered (whole, streamed, plain completion)."""
    from fastapi.testclient import TestClient

    from radixchat.core.config import Settings
    from radixchat.webui.server import build_app

    alice = store.create_user("alice", "alice-password")
    _, key = store.create_api_key(alice, "tests")
    app = build_app(engine, Settings(model=str(tiny_model_dir)), store)
    auth = {"Authorization": f"Bearer {key}"}
    with TestClient(app, client=("127.0.0.1", 50000)) as http:  # /metrics answers this machine
        assert http.post("/v1/chat/completions", headers=auth, json=GOOD).status_code == 200
        streamed = http.post("/v1/chat/completions", headers=auth, json={**GOOD, "stream": True})
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
        plain = http.post(
            "/v1/completions", headers=auth, json={"model": "default", "prompt": "def main():", "max_tokens": 4}
        )
        assert plain.status_code == 200
        too_long = {**GOOD, "messages": [{"role": "user", "content": "lists " * 3000}]}
        assert http.post("/v1/chat/completions", headers=auth, json=too_long).status_code == 400
        text = http.get("/metrics").text
    assert store.flush()
    with sqlite3.connect(store.path) as con:
        rows = con.execute("SELECT user, finish_reason, error FROM requests ORDER BY id").fetchall()
    assert len(rows) == 4 and all(user == alice.id for user, _, _ in rows)
    assert [r[1] is not None for r in rows] == [True, True, True, False] and rows[3][2].startswith("400")

    ended = metric_value(text, "radixchat:request_success_total")
    refused = metric_value(text, "radixchat:request_refused_total", reason="context_length_exceeded")
    cancelled = metric_value(text, "radixchat:request_success_total", finished_reason="cancelled")
    assert (ended, refused, cancelled, metric_value(text, "radixchat:request_failure_total")) == (3, 1, 0, 0)


@pytest.mark.slow
def test_no_auth_on_lan_needs_explicit_flag(tiny_model_dir, tmp_path):
    out = subprocess.run(
        [
            RADIXCHAT,
            "serve",
            "--model",
            str(tiny_model_dir),
            "--host",
            "0.0.0.0",
            "--no-auth",
            "--db",
            str(tmp_path / "x.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "allow-open-lan" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_logprobs_and_top_logprobs_through_the_official_client(keyed):
    server, key, _, _ = keyed
    c = client(server, key)
    msgs = [{"role": "user", "content": "What does a list comprehension do?"}]
    out = c.chat.completions.create(
        model="default", messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    entries = out.choices[0].logprobs.content
    assert len(entries) == out.usage.completion_tokens > 0
    # each token decoded alone: the reply's first loses its leading space in the joint decode,
    # and a character the last tokens only began is held back from the text (U+FFFD alone)
    joined = "".join(e.token for e in entries).lstrip()
    assert joined.rstrip("\ufffd") == out.choices[0].message.content.lstrip()
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0 and e.bytes == list(e.token.encode())
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True) and sum(math.exp(t) for t in tops) <= 1 + 1e-4
        assert abs(e.logprob - tops[0]) < 1e-4  # greedy picks the most likely token
    # streamed, the chunks carry the same tokens and numbers
    chunks = list(
        c.chat.completions.create(
            model="default", messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, stream=True
        )
    )
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in entries]
    # without logprobs nothing is reported
    assert c.chat.completions.create(model="default", messages=msgs, max_tokens=2).choices[0].logprobs is None


@pytest.mark.slow
def test_completions_echo_starts_with_the_prompt(keyed):
    server, key, _, _ = keyed
    c = client(server, key)
    plain = c.completions.create(model="default", prompt="def main():", max_tokens=5, temperature=0)
    echoed = c.completions.create(model="default", prompt="def main():", max_tokens=5, temperature=0, echo=True)
    assert echoed.choices[0].text == "def main():" + plain.choices[0].text
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(
            model="default", prompt="def main():", max_tokens=5, temperature=0, echo=True, stream=True
        )
        if ch.choices
    )
    assert streamed == echoed.choices[0].text


@pytest.mark.slow
def test_completions_logprobs_in_the_legacy_shape(keyed):
    server, key, _, _ = keyed
    out = client(server, key).completions.create(
        model="default", prompt="def main():", max_tokens=6, temperature=0, logprobs=2
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == out.usage.completion_tokens
    assert "".join(lp.tokens).lstrip().rstrip("\ufffd") == out.choices[0].text.lstrip()  # (as chat's)
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[0] == 0 and all(v <= 0 for v in lp.token_logprobs)


@pytest.mark.slow
def test_logit_bias_moves_the_choice(keyed, tiny_model_dir):
    import mlx.core as mx
    from mlx_lm import load

    model, tok = load(str(tiny_model_dir))
    server, key, _, _ = keyed
    c = client(server, key)
    msgs = [{"role": "user", "content": "What does dict.get do?"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True)
    # the server's BLAS may sum in another order than this process's: near a tie its first
    # token is one of this forward's most likely few
    likely = mx.argsort(-model(mx.array([prompt]))[0, -1])[:5].tolist()

    def first(**kw):
        out = c.chat.completions.create(
            model="default", messages=msgs, max_tokens=3, temperature=0, logprobs=True, **kw
        )
        return out.choices[0].logprobs.content

    plain = first()
    greedy_first = next(t for t in likely if tok.decode([t]) == plain[0].token)  # the id banned below
    avoided = first(logit_bias={str(greedy_first): -100})
    # logprobs are the model's own (before the bias): the next best token, less likely
    assert avoided[0].logprob < plain[0].logprob
    forced = tok.encode("list")[-1]
    assert [e.token for e in first(logit_bias={str(forced): 100})] == [tok.decode([forced])] * 3


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "needs logprobs"),
        ({"logit_bias": {"abc": 1}}, "token ids"),
        ({"logit_bias": {"1": 200}}, "between -100 and 100"),
        ({"logit_bias": {"99999999": 1}}, "vocabulary"),
    ],
)
@pytest.mark.slow
def test_bad_logprobs_and_bias_are_refused(keyed, extra, words):
    server, key, _, _ = keyed
    r = httpx.post(
        server.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={**GOOD, **extra},
        timeout=30,
    )
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


@pytest.mark.slow
def test_n_choices_share_one_prompt_computation(keyed):
    server, key, _, db = keyed
    c = client(server, key)
    msgs = [
        {"role": "system", "content": SYSTEM + " n-choices test."},
        {"role": "user", "content": "Name three uses of a generator expression, please."},
    ]
    out = c.chat.completions.create(model="default", messages=msgs, max_tokens=6, temperature=1.0, seed=7, n=3)
    assert [ch.index for ch in out.choices] == [0, 1, 2] and len({ch.message.content for ch in out.choices}) > 1
    u = out.usage
    assert u.prompt_tokens > 20 and u.completion_tokens <= 3 * 6
    # the prompt was computed once: each choice is a row in the store, two of them served from
    # the cache all but the last token (the engine holds a choice until another prefilled it)
    deadline = time.time() + 10
    while time.time() < deadline:
        with sqlite3.connect(db) as con:
            rows = con.execute(
                "SELECT prompt_tokens, cached_tokens FROM requests WHERE prompt_tokens = ? ORDER BY id DESC LIMIT 3",
                (u.prompt_tokens,),
            ).fetchall()
        if len(rows) == 3:
            break
        time.sleep(0.2)
    cached = sorted(c for _, c in rows)
    assert cached[1] >= u.prompt_tokens - 2 and cached[0] < u.prompt_tokens - 2, rows
    assert u.prompt_tokens_details.cached_tokens == max(0, u.prompt_tokens - sum(p - c for p, c in rows))
    # the same seed gives the same choices; streamed, every choice comes with its index
    again = c.chat.completions.create(model="default", messages=msgs, max_tokens=6, temperature=1.0, seed=7, n=3)
    assert [ch.message.content for ch in again.choices] == [ch.message.content for ch in out.choices]
    texts = {}
    for ch in c.chat.completions.create(
        model="default",
        messages=msgs,
        max_tokens=6,
        temperature=1.0,
        seed=7,
        n=3,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert [texts[i] for i in range(3)] == [ch.message.content for ch in out.choices]


@pytest.mark.slow
def test_metrics_have_vllms_names_types_and_labels(keyed):
    """Dashboards built for vLLM work with the prefix changed: the names, counters for totals,
    histograms from 1 ms, model_name on every series, refusals counted by reason."""
    from prometheus_client.parser import text_string_to_metric_families

    server, key, _, _ = keyed
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert (
            http.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={**GOOD, "max_tokens": 5, "temperature": 0},
            ).status_code
            == 200
        )
        before = server.metric("radixchat:request_refused_total", reason="invalid_api_key")
        assert http.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert (
            http.post(
                "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={**GOOD, "top_p": 0}
            ).status_code
            == 400
        )
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    want = {
        "radixchat:time_to_first_token_seconds": "histogram",
        "radixchat:inter_token_latency_seconds": "histogram",
        "radixchat:e2e_request_latency_seconds": "histogram",
        "radixchat:request_queue_time_seconds": "histogram",
        "radixchat:request_prefill_time_seconds": "histogram",
        "radixchat:request_decode_time_seconds": "histogram",
        "radixchat:prompt_tokens": "counter",
        "radixchat:generation_tokens": "counter",
        "radixchat:prefix_cache_queries": "counter",
        "radixchat:prefix_cache_hits": "counter",
        "radixchat:prefix_cache_lookups": "counter",
        "radixchat:prefix_cache_evictions": "counter",
        "radixchat:request_success": "counter",
        "radixchat:request_refused": "counter",
        "radixchat:num_requests_running": "gauge",
        "radixchat:num_requests_waiting": "gauge",
    }
    assert {name: families[name].type for name in want if name in families} == want
    model = families["radixchat:prompt_tokens"].samples[0].labels["model_name"]
    assert model and all(
        s.labels.get("model_name") == model
        for f in families.values()
        for s in f.samples
        if f.name.startswith("radixchat:")
    )
    buckets = sorted(
        float(s.labels["le"])
        for s in families["radixchat:time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket")
    )
    assert buckets[0] == 0.001
    assert metric_value(text, "radixchat:request_refused_total", reason="invalid_api_key") == before + 1
    assert metric_value(text, "radixchat:request_refused_total", reason="invalid_value") >= 1
    assert metric_value(text, "radixchat:inter_token_latency_seconds_count") >= 4


@pytest.mark.slow
def test_the_grafana_dashboard_asks_for_series_the_server_has(keyed):
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    server, key, _, _ = keyed
    r = httpx.post(
        server.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={**GOOD, "max_tokens": 5, "temperature": 0},
        timeout=30,
    )
    assert r.status_code == 200  # a request's end creates its labelled series
    httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer nope"})  # and a refusal
    dash = json.loads((Path(__file__).resolve().parent.parent / "docs" / "grafana-radixchat.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    asked = {n for e in exprs for n in re.findall(r"radixchat:[a-z0-9_]+", e)}
    served = {
        s.name for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text) for s in f.samples
    }
    assert len(asked) >= 12 and asked <= served, asked - served


@pytest.mark.slow
def test_structured_output_parses_and_validates_on_a_random_model(keyed):
    """Even a random model's reply follows the schema: the grammar masks every other token."""
    server, key, _, _ = keyed
    c = client(server, key)
    fmt = {"type": "json_schema", "json_schema": {"name": "recipe", "schema": RECIPE, "strict": True}}
    for temperature, seed in ((0, None), (1.0, 1), (1.0, 2)):
        out = c.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "A recipe?"}],
            max_tokens=80,
            temperature=temperature,
            seed=seed,
            response_format=fmt,
        )
        assert out.choices[0].finish_reason == "stop", out.choices[0]
        value = json.loads(out.choices[0].message.content)
        assert set(value) == {"name", "vegan", "course"} and isinstance(value["vegan"], bool)
        assert value["course"] in ("starter", "main", "dessert") and len(value["name"]) <= 12
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "A recipe?"}],
            max_tokens=80,
            temperature=0,
            response_format=fmt,
            stream=True,
        )
        if ch.choices
    )
    assert json.loads(streamed) == json.loads(
        c.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "A recipe?"}],
            max_tokens=80,
            temperature=0,
            response_format=fmt,
        )
        .choices[0]
        .message.content
    )


@pytest.mark.slow
def test_json_object_and_a_free_reply_side_by_side(keyed):
    """A constrained row in the batch leaves a free one's greedy reply as it is alone."""
    server, key, _, _ = keyed
    c = client(server, key)
    free = {
        "model": "default",
        "messages": [{"role": "user", "content": "What is a tuple?"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    alone = c.chat.completions.create(**free).choices[0].message.content
    with ThreadPoolExecutor(4) as pool:
        shaped = [
            pool.submit(
                c.chat.completions.create,
                model="default",
                max_tokens=60,
                temperature=1.0,
                seed=i,
                messages=[{"role": "user", "content": "JSON please"}],
                response_format={"type": "json_object"},
            )
            for i in range(3)
        ]
        beside = pool.submit(c.chat.completions.create, **free)
        assert beside.result().choices[0].message.content == alone
        for f in shaped:
            ch = f.result().choices[0]
            if ch.finish_reason == "stop":  # a random model may fill a string until max_tokens
                assert isinstance(json.loads(ch.message.content), dict)
            else:
                assert ch.message.content.startswith("{")


@pytest.mark.parametrize(
    "fmt, words",
    [
        ({"type": "json_schema"}, "json_schema"),
        ({"type": "xml"}, "response_format"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "schema"),
    ],
)
@pytest.mark.slow
def test_bad_response_formats_are_refused(keyed, fmt, words):
    server, key, _, _ = keyed
    r = httpx.post(
        server.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={**GOOD, "response_format": fmt},
        timeout=30,
    )
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
