"""A request leaves no reference cycle behind: what it held is freed by reference counting
when it ends, not by Python's cyclic collector, whose full collections hold the GIL while they
walk and so stop every thread, the engine's steps too (under a flood of grammar requests on
two busy cores, 140-215 ms each before; webui/cli/main.py's `freeze_start_up` keeps what
start-up made out of their walk). The engine's objects (each request's `Active`, its
sampler and grammar) and the API's (each request's `Ledger` and the `RequestEnd` of each
choice)."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable

from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.seam.requests import Sampling
from tests.support.api_app import api_app
from tests.support.fake_engine import FakeEngine


def cyclic_garbage(run: Callable[[], None]) -> Counter[str]:
    """The type names of what only the cyclic collector would have freed of what `run` made."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what it finds is kept in gc.garbage, to be named here
    try:
        run()
        gc.collect()
        return Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_finished_request_of_the_engine_is_no_cycle(tiny_model_dir):
    """A grammar's sampler and a logit_bias's guarded one are kept on the request's `Active`
    and refer back to it: weakly, or every such request would be a cycle."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    kinds = [
        Sampling(max_tokens=8, json_schema=schema),
        Sampling(max_tokens=8, logit_bias={7: 5.0}),
        Sampling(max_tokens=8, temperature=0.7, logit_bias={7: 5.0}),
        Sampling(max_tokens=8),
    ]

    def run() -> None:
        eng = Engine(Settings(model=str(tiny_model_dir))).start(timeout=120)
        try:
            handles = [eng.submit_tokens(list(range(5, 25)), s) for s in kinds for _ in range(2)]
            assert all(h.result().text is not None for h in handles)
        finally:
            eng.stop()

    left = cyclic_garbage(run)
    mine = {k: n for k, n in left.items() if k in ("Active", "Constrained", "Constraint", "RequestHandle")}
    assert not mine, left.most_common(20)


def test_a_finished_api_request_is_no_cycle(store):
    """Each choice's `RequestEnd` writes through a function that holds the request's
    `Ledger`, which holds the ends: the write is dropped once it has run."""
    user = store.create_user("alice", "alice-password")
    key = store.create_api_key(user, "tests")[1]

    def run() -> None:
        with TestClient(api_app(FakeEngine(), store), headers={"Authorization": f"Bearer {key}"}) as client:
            good = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
            for body in (good, {**good, "stream": True}, {**good, "n": 2}):
                assert client.post("/v1/chat/completions", json=body).status_code == 200

    left = cyclic_garbage(run)
    assert not left["Ledger"] and not left["RequestEnd"], left.most_common(20)


def test_start_up_is_frozen_out_of_the_collectors_walk():
    """What exists when the server starts listening is left out of every later collection."""
    from radixchat.webui.cli.main import freeze_start_up

    before = gc.get_freeze_count()
    kept = [[] for _ in range(1000)]  # start-up's objects, in miniature
    try:
        freeze_start_up()
        assert gc.get_freeze_count() >= before + len(kept)
        assert not any(o is kept for o in gc.get_objects())  # the collector's generations lack them
    finally:
        gc.unfreeze()
