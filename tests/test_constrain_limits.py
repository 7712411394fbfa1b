"""Structured output whose grammar cannot go on mid-reply, on the tiny random model.

llguidance's matcher, once a step runs past its parser's limits, is in an error state for
good, and its mask then allows the end of the text alone: without a check the reply ended
as a "stop" with broken JSON. The request must fail with a sentence that says so (and the
log says why), and the engine go on.
"""

from __future__ import annotations

import logging

import pytest

from radixchat.core.engine.sample.constrain import ConstraintFailed
from radixchat.core.seam.requests import ChatRequest, Failed, Finished

# the reply must reach a string: its opening is forced, its body is where the lexer needs fuel
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}, "required": ["name"]}


def chat(**sampling) -> ChatRequest:
    # an owner of its own: its prompts stay out of the prefix cache other tests' owners read
    return ChatRequest(
        messages=[{"role": "user", "content": "Tell me about lists"}], sampling=sampling, owner="constrain-limits"
    )


@pytest.fixture
def tight_limits(monkeypatch):
    """Every Constraint's matcher built with parser limits small enough to run out mid-reply."""
    import llguidance

    import radixchat.core.engine.sample.constrain as constrain

    real_init = constrain.Constraint.__init__

    def tight(self, grammar, tokenizer, vocab_size):
        real_init(self, grammar, tokenizer, vocab_size)
        limits = llguidance.LLParserLimits(step_lexer_fuel=TIGHT_FUEL)
        self.matcher = llguidance.LLMatcher(constrain._tokenizer(tokenizer, vocab_size), grammar, limits=limits)

    monkeypatch.setattr(constrain.Constraint, "__init__", tight)


# measured: enough for the JSON's punctuation, too little for the regex of a string's body
TIGHT_FUEL = 100


def test_a_grammar_out_of_its_limits_fails_the_request_in_words(engine, tight_limits, caplog):
    with caplog.at_level(logging.WARNING, logger="radixchat.engine"):
        ended = engine.submit(chat(max_tokens=24, json_schema=SCHEMA)).result()
    assert isinstance(ended, Failed), ended
    assert ended.message == ConstraintFailed.MESSAGE
    assert ended.usage.generated_tokens > 0  # mid-reply, once the grammar reached a string
    assert "structured output could not go on" in caplog.text
    assert engine.stats().inflight == 0


def test_the_engine_goes_on_after_a_grammar_failed(engine, tight_limits):
    engine.submit(chat(max_tokens=24, json_schema=SCHEMA)).result()
    plain = engine.submit(chat(max_tokens=4)).result()
    assert isinstance(plain, Finished) and plain.usage.generated_tokens == 4


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"allOf": [{"$ref": "#"}]},
        {"anyOf": [{"$ref": "#"}]},
        # no finite JSON: each begins well and runs into llguidance's depth mid-reply
        {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
        {
            "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
            "type": "object",
            "properties": {"head": {"$ref": "#/$defs/n"}},
            "required": ["head"],
        },
    ],
)
def test_a_schema_no_reply_can_satisfy_is_refused_before_it_is_queued(engine, schema):
    """A schema defined only by itself admits no JSON at all: its first step failed the
    request (a 500 to a client, or a 200 and then an error event when streamed). One whose
    every instance holds another of its own kind admits no finite JSON: the reply failed
    mid-way, after a streamed client's 200."""
    from radixchat.core.engine.sample.constrain import EMPTY
    from radixchat.core.seam.requests import RequestError

    with pytest.raises(RequestError) as refused:
        engine.submit(chat(max_tokens=8, json_schema=schema))
    assert refused.value.status == 400 and refused.value.code == "invalid_schema"
    assert refused.value.message == f"response_format: {EMPTY}"
    assert engine.stats().inflight == 0


def test_a_grammar_that_fails_mid_reply_is_the_clients_400_not_a_500(tiny_model_dir, tight_limits):
    """Its own schema's fault: an `invalid_schema` 400 for a reply sent whole (streamed, the
    200 has gone with the first chunk, and the stream ends with the error). An engine of its
    own: the API's no-auth requests would land in the shared engine's anonymous cache
    namespace, where other tests count cached tokens."""
    import asyncio

    import httpx

    from radixchat.core.config import Settings
    from radixchat.core.engine.engine import Engine
    from radixchat.webui.server import build_app

    engine = Engine(Settings(model=str(tiny_model_dir), prefix_cache=False)).start(timeout=120)
    app = build_app(engine, Settings(no_auth=True), None)
    body = {
        "model": engine.info.model_id,
        "max_tokens": 24,
        "messages": [{"role": "user", "content": "Tell me about lists"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
    }

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.post("/v1/chat/completions", json=body, timeout=120)

    try:
        r = asyncio.run(post())
    finally:
        engine.stop()
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_schema" and err["message"] == ConstraintFailed.MESSAGE
