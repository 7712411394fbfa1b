"""Grammars compiled once per user (core.engine.sample.grammar_cache): a schema sent again is a copy
of the matcher compiled for it, the reply the same as from a fresh compile; kept per owner,
refusals remembered, a removed user's schemas dropped, the number kept bounded."""

from __future__ import annotations

import threading

import pytest

from radixchat.core.engine.sample.constrain import SchemaError
from radixchat.core.engine.sample.grammar_cache import CompiledGrammars
from radixchat.core.seam.requests import ChatRequest, Finished


class Built:
    """A stand-in for a compiled Constraint: which build made it, and how many copies."""

    def __init__(self, n: int):
        self.n, self.copies = n, 0

    def copy(self) -> Built:
        self.copies += 1
        return Built(self.n)


def counting():
    builds = []

    def build() -> Built:
        builds.append(1)
        return Built(len(builds))

    return builds, build


def test_a_source_sent_again_by_its_owner_is_a_copy_not_a_compile():
    cache, (builds, build) = CompiledGrammars(), counting()
    first = cache.constraint("alice", "json {}", build)
    again = cache.constraint("alice", "json {}", build)
    assert len(builds) == 1 and again is not first and again.n == first.n
    assert (cache.hits, cache.misses) == (1, 1)


def test_another_owners_same_source_compiles_its_own():
    cache, (builds, build) = CompiledGrammars(), counting()
    cache.constraint("alice", "json {}", build)
    cache.constraint("mallory", "json {}", build)
    assert len(builds) == 2  # no one's timing says what another sent


def test_a_refused_source_is_refused_again_without_compiling():
    cache, calls = CompiledGrammars(), []

    def bad():
        calls.append(1)
        raise SchemaError("not a usable JSON schema: because")

    for _ in range(3):
        with pytest.raises(SchemaError, match="because"):
            cache.constraint("mallory", "json bad", bad)
    assert len(calls) == 1


def test_forgetting_an_owner_drops_only_their_grammars():
    cache, (builds, build) = CompiledGrammars(), counting()
    cache.constraint("alice", "json a", build)
    cache.constraint("bob", "json a", build)
    cache.forget("alice")
    cache.constraint("alice", "json a", build)
    cache.constraint("bob", "json a", build)
    assert len(builds) == 3


def test_only_the_latest_used_are_kept():
    cache, (builds, build) = CompiledGrammars(size=2), counting()
    for source in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" comes
        cache.constraint("alice", source, build)
    assert len(builds) == 3
    cache.constraint("alice", "a", build)
    cache.constraint("alice", "b", build)
    assert len(builds) == 4


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]+$"}},
    "required": ["city"],
}


def chat(owner: str, schema=SCHEMA) -> ChatRequest:
    return ChatRequest(
        messages=[{"role": "user", "content": "Name a city."}],
        sampling={"max_tokens": 12, "json_schema": schema},
        owner=owner,
    )


def test_a_users_repeated_schema_compiles_once_and_answers_as_a_fresh_compile(engine, monkeypatch):
    import radixchat.core.engine.sample.constrain as constrain

    compiled, real = [], constrain.grammar_for

    def counted(schema):
        compiled.append(schema)
        return real(schema)

    monkeypatch.setattr(constrain, "grammar_for", counted)
    fresh = engine.submit(chat("grammar-cache-first")).result()
    assert isinstance(fresh, Finished) and len(compiled) == 1
    finals = [engine.submit(chat("grammar-cache-first")).result() for _ in range(2)]
    assert len(compiled) == 1  # the same owner's same schema: copies of the first compile
    assert [f.text for f in finals] == [fresh.text] * 2

    # two at once, each its own copy of the matcher: neither moves the other's grammar on
    results: list = [None, None]

    def one(i: int) -> None:
        results[i] = engine.submit(chat("grammar-cache-first")).result()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.text for r in results] == [fresh.text] * 2 and len(compiled) == 1

    other = engine.submit(chat("grammar-cache-second")).result()
    assert len(compiled) == 2 and other.text == fresh.text  # another owner compiles their own
    engine.forget("grammar-cache-first")
    engine.submit(chat("grammar-cache-first")).result()
    assert len(compiled) == 3  # a removed user's schemas went with them
