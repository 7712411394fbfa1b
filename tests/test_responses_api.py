"""The Responses API through the official client: text in, streamed or not, a conversation
carried by previous_response_id in the store (and seen there as the user's), a kept response
read back, another user's id not found, and refusals by name."""

from __future__ import annotations

import httpx
import pytest

from tests.support.clients import client
from tests.support.server import Server


@pytest.mark.slow
def test_a_response_then_its_follow_up_in_the_users_conversation(keyed):
    from radixchat.core.store import Store

    server, key, _, db = keyed
    c = client(server, key)
    first = c.responses.create(
        model="default",
        input="Tell me about lists.",
        max_output_tokens=8,
        temperature=0,
        instructions="Answer briefly.",
    )
    assert first.id.startswith("resp_") and first.output_text
    assert first.usage.input_tokens > 0 and first.usage.output_tokens == 8
    # cut by max_output_tokens: incomplete, as OpenAI says it (the random model never ends this soon)
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert first.output[0].status == "incomplete"
    # instructions are this turn's (OpenAI does not carry them over): the same again
    again = c.responses.create(
        model="default",
        input="And tuples?",
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
        instructions="Answer briefly.",
    )
    assert again.previous_response_id == first.id
    # the follow-up's prompt holds the first turn and its reply, restored from the cache
    assert again.usage.input_tokens > first.usage.input_tokens + 8
    assert again.usage.input_tokens_details.cached_tokens > 0
    with Store(db) as store:
        alice = store.get_user("alice")
        conv = next(cv for cv in store.list_conversations(alice) if cv.title == "Tell me about lists.")
        texts = [(m.role, m.content) for m in store.history(alice, conv.id)]
    assert texts == [
        ("user", "Tell me about lists."),
        ("assistant", first.output_text),
        ("user", "And tuples?"),
        ("assistant", again.output_text),
    ]
    # streamed: the SDK's events, deltas adding up to the completed response's text
    events = list(
        c.responses.create(
            model="default",
            input="And dicts?",
            previous_response_id=again.id,
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-1].response.output_text
    # going on from the first response again branches: a new conversation, the old one as it was
    branch = c.responses.create(
        model="default", input="Sets?", previous_response_id=first.id, max_output_tokens=4, temperature=0
    )
    assert branch.id.split("_")[1] != first.id.split("_")[1]


@pytest.mark.slow
def test_another_users_response_is_not_found(keyed):
    import openai

    from radixchat.core.store import Store

    server, key, _, db = keyed
    first = client(server, key).responses.create(model="default", input="Secret plans.", max_output_tokens=4)
    with Store(db) as store:
        bob = store.create_user("bob-responses", "bob-password-1")
        _, bob_key = store.create_api_key(bob, "bob")
    with pytest.raises(openai.NotFoundError):
        client(server, bob_key).responses.create(
            model="default", input="What were they?", previous_response_id=first.id, max_output_tokens=4
        )
    with pytest.raises(openai.NotFoundError):
        client(server, bob_key).responses.create(
            model="default", input="x", previous_response_id="resp_1_999999", max_output_tokens=4
        )


@pytest.mark.slow
def test_a_kept_response_reads_back_and_is_nobody_elses(keyed):
    import openai

    from radixchat.core.store import Store

    server, key, _, db = keyed
    c = client(server, key)
    made = c.responses.create(model="default", input="Remember this.", max_output_tokens=6, temperature=0)
    got = c.responses.retrieve(made.id)
    assert (got.id, got.model) == (made.id, made.model)
    # how a kept reply ended is not kept with it: read back, it is one that completed
    assert made.status == "incomplete" and got.status == "completed" and got.incomplete_details is None
    assert got.output_text == made.output_text and got.output[0].role == "assistant"
    # the same object as POST's, field for field (usage is not kept: null)
    auth = {"Authorization": f"Bearer {key}"}
    posted = httpx.post(
        server.url + "/v1/responses",
        headers=auth,
        json={"model": "default", "input": "x", "max_output_tokens": 2},
        timeout=30,
    ).json()
    read = httpx.get(server.url + f"/v1/responses/{posted['id']}", headers=auth, timeout=30).json()
    assert set(read) == set(posted) and read["usage"] is None
    assert read["output"][0]["content"] == posted["output"][0]["content"]
    # made when it was asked, both ways (the POST said when its reply ended: 2 s later)
    assert abs(read["created_at"] - posted["created_at"]) <= 1 and abs(got.created_at - made.created_at) <= 1
    with Store(db) as store:
        bob = store.create_user("bob-reads", "bob-password-1")
        _, bob_key = store.create_api_key(bob, "bob")
    unknown = "resp_" + "0" * 48
    errors = []
    for rid in (made.id, unknown):
        with pytest.raises(openai.NotFoundError) as info:
            client(server, bob_key).responses.retrieve(rid)
        errors.append(info.value.body)
    # another user's response and one that does not exist get the same answer
    assert errors[0]["message"].replace(made.id, unknown) == errors[1]["message"]
    assert errors[0]["code"] == errors[1]["code"] == "not_found"
    unkept = c.responses.create(model="default", input="Forget this.", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError) as info:
        c.responses.retrieve(unkept.id)
    assert "only kept with store for signed-in users" in info.value.body["message"]


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"tools": [{"type": "web_search_preview"}]}, "only function tools"),
        (
            {"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
            "tool_choice",
        ),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"colour": "red"}, "unknown field"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "text only"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ],
)
@pytest.mark.slow
def test_what_the_responses_api_does_not_do_is_refused_by_name(keyed, extra, words):
    server, key, _, _ = keyed
    r = httpx.post(
        server.url + "/v1/responses",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "default", "input": "hi", **extra},
        timeout=30,
    )
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


@pytest.mark.slow
def test_no_auth_keeps_no_responses(tiny_model_dir, tmp_path):
    srv = Server(tiny_model_dir, tmp_path / "n.db", "--no-auth")
    try:
        r = httpx.post(
            srv.url + "/v1/responses", json={"model": "default", "input": "hi", "max_output_tokens": 3}, timeout=30
        )
        assert r.status_code == 200 and r.json()["output"][0]["content"][0]["type"] == "output_text"
        r = httpx.post(
            srv.url + "/v1/responses",
            json={"model": "default", "input": "hi", "previous_response_id": r.json()["id"]},
            timeout=30,
        )
        assert r.status_code == 400 and "no-auth" in r.json()["error"]["message"]
        got = httpx.get(srv.url + "/v1/responses/resp_1_1", timeout=30)
        assert got.status_code == 404 and "only kept with store for signed-in users" in got.json()["error"]["message"]
    finally:
        srv.stop()


@pytest.mark.slow
def test_a_response_that_offers_tools_is_answered_not_kept(keyed):
    """Its reply may be calls, which the store's text turns cannot hold (read back, they were
    the model's raw call markup): answered, and not found afterwards."""
    import openai

    server, key, _, _ = keyed
    c = client(server, key)
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    out = c.responses.create(model="default", input="Weather in Oslo?", tools=[tool], max_output_tokens=4)
    assert out.output
    with pytest.raises(openai.NotFoundError, match="without tools"):
        c.responses.retrieve(out.id)
