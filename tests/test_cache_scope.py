"""Sharing without leaking: what the prefix cache lets one user learn about another's prompts.

A probing user (bob) must get no more `cached_tokens` (and so no less prefill work, the
source of the TTFT side channel) for a guess of alice's private text than for a text nobody
sent, while a system prompt both send is still computed once for both."""

from __future__ import annotations

import pytest

from radixchat.core.cache.scope import CacheScope
from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.seam.requests import ChatRequest, Finished

SYSTEM = (
    "You are the help desk of a small bank. Answer in one short sentence and never repeat "
    "account numbers, PINs or passwords back to the customer, whatever they ask."
)
SECRET = "My PIN is 4711 and my account is 0815-2299-1234, please remember them for later."


def ask(engine, owner, system, user, **kw) -> Finished:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    final = engine.submit(ChatRequest(messages=msgs, owner=owner, sampling={"max_tokens": 4, **kw})).result()
    assert isinstance(final, Finished), final
    return final


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    made = {
        s: Engine(Settings(model=str(tiny_model_dir), max_tokens=4, cache_sharing=s)).start(timeout=120)
        for s in ("system", "all", "user")
    }
    yield made
    for e in made.values():
        e.stop()


def system_len(engine) -> int:
    return len(engine.loaded.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}]))


def test_scope_keys():
    toks = [5, 6, 7, 8]
    assert CacheScope("all").key(toks, 2, "alice") == toks
    system = CacheScope("system")
    a, b = system.key(toks, 2, "alice"), system.key(toks, 2, "bob")
    assert a[:2] == b[:2] == [5, 6] and a[2:] != b[2:] and a != toks
    assert system.key(toks, 2, "alice") == a  # stable per owner
    user = CacheScope("user")
    assert user.key(toks, 2, "alice")[0] != user.key(toks, 2, "bob")[0]
    assert system.min_match(2) == 2 and CacheScope("all").min_match(2) == 0


def test_a_guess_of_anothers_private_text_gets_no_more_than_a_text_nobody_sent(engines):
    eng = engines["system"]
    s = system_len(eng)
    ask(eng, "alice", SYSTEM, SECRET)
    assert ask(eng, "alice", SYSTEM, SECRET).usage.cached_tokens > s  # her own turn is reused
    # two probers, so neither probe finds the other's text in its own namespace
    right = ask(eng, "bob", SYSTEM, SECRET).usage.cached_tokens
    wrong = ask(eng, "mallory", SYSTEM, SECRET.replace("4711", "9358")).usage.cached_tokens
    assert right == wrong == s  # the shared system prompt, nothing of alice's text


def test_without_scoping_the_same_probe_does_leak(engines):
    """The probe above is a real one: with everything shared, bob's exact guess hits."""
    eng = engines["all"]
    s = system_len(eng)
    ask(eng, "alice", SYSTEM, SECRET)
    right = ask(eng, "bob", SYSTEM, SECRET).usage.cached_tokens
    wrong = ask(eng, "mallory", SYSTEM, SECRET.replace("4711", "9358")).usage.cached_tokens
    assert right > wrong > s


def test_part_of_anothers_system_prompt_is_a_miss(engines):
    private_system = SYSTEM + " The vault code for today is 552-981; tell it only to the manager Carol."
    probe_system = SYSTEM + " The vault code for today is 552-9"
    scoped, shared = engines["system"], engines["all"]
    for eng in (scoped, shared):
        ask(eng, "alice", private_system, "Hello")
    assert ask(scoped, "bob", probe_system, "Hello").usage.cached_tokens == 0
    assert ask(shared, "bob", probe_system, "Hello").usage.cached_tokens > system_len(shared)


def test_a_system_prompt_sent_by_both_is_shared(engines):
    eng = engines["system"]
    s = system_len(eng)
    ask(eng, "carol", SYSTEM, "When do you open?")
    assert ask(eng, "dave", SYSTEM, "Where is the nearest branch?").usage.cached_tokens == s


def test_user_scope_shares_nothing_and_no_owner_is_one_user(engines):
    eng = engines["user"]
    ask(eng, "erin", SYSTEM, "When do you open?")
    assert ask(eng, "frank", SYSTEM, "When do you open?").usage.cached_tokens == 0
    assert ask(eng, "erin", SYSTEM, "When do you open?").usage.cached_tokens > system_len(eng)
    scoped = engines["system"]
    ask(scoped, None, SYSTEM, "Is there a fee for transfers?")
    assert ask(scoped, None, SYSTEM, "Is there a fee for transfers?").usage.cached_tokens > system_len(scoped)


def test_answers_are_the_same_in_every_scope(engines):
    texts = {
        name: ask(eng, "gina", SYSTEM, "What is a savings account?", max_tokens=8).text for name, eng in engines.items()
    }
    assert len(set(texts.values())) == 1, texts
