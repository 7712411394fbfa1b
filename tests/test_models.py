"""Several models on one server: each by name, loaded on its first request, unloaded when idle.

The set itself with stand-in engines (names, aliases, loading, idle unloading, a load that
fails, a removed user forgotten by a model loaded later), then a real server of two small
random models: each answers as it does served alone, concurrently, streamed and not, and
`/v1/models`, `/health` and `/metrics` say which is loaded.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixchat.core.config import Settings
from radixchat.core.engine.models import ModelSet
from radixchat.core.models.model_size import weights_bytes
from radixchat.core.seam.protocol import EngineStats, ModelInfo
from radixchat.core.seam.requests import RequestError
from tests.support.randmodel import build_random_model
from tests.support.server import Server, stop_clean


class Stand:
    """An engine that serves nothing: what the set asks of one."""

    def __init__(self, settings: Settings, model_id: str):
        self.settings, self.inflight, self.stopped, self.forgotten = settings, 0, False, []
        self.info = ModelInfo(model_id, num_params=1000, dtype="float32", context_length=64, vocab_size=10)

    def stats(self) -> EngineStats:
        return EngineStats(alive=not self.stopped, running=self.inflight, waiting=0)

    fatal = None  # (core.seam.protocol.Lifecycle)

    def stop(self, release: bool = False) -> None:
        self.stopped, self.released = True, release

    def halt(self) -> None:
        self.stop()

    def forget(self, owner: str) -> None:
        self.forgotten.append(owner)


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    return build_random_model(tmp_path_factory.mktemp("second") / "second-random", seed=7, dim=48)


def stand_set(tiny_model_dir, second_model, idle_s=0.2, fail=None, more=(), **extra):
    made = []

    def make(settings, owners):
        assert owners is models.owners  # one count of each user's requests for every model
        if fail is not None and fail(settings):
            raise OSError("the folder went away")
        made.append(Stand(settings, settings.model.rsplit("/", 1)[-1]))
        return made[-1]

    settings = Settings(
        model=str(tiny_model_dir), extra_models=[str(second_model), *map(str, more)], model_idle_s=idle_s, **extra
    )
    models = ModelSet.of(settings, make)
    return models.start(), made


def test_a_model_loads_when_first_named_and_unloads_when_idle(tiny_model_dir, second_model):
    models, made = stand_set(tiny_model_dir, second_model)
    try:
        first, second = (m.model_id for m in models.served())
        assert (first, second) == ("tiny-random", "second-random")
        assert [m.is_loaded for m in models.served()] == [True, False]  # the first loads at start
        assert models.engine("default") is models.engine(first) is models.default  # aliases
        assert models.engine(str(second_model)).info.model_id == second  # the name it was served by
        assert [m.is_loaded for m in models.served()] == [True, True] and len(made) == 2
        busy = made[1]
        busy.inflight = 1  # a request in flight: not idle, however long it runs
        time.sleep(0.6)
        assert models.served()[1].is_loaded and not busy.stopped
        busy.inflight = 0
        deadline = time.time() + 5
        while models.served()[1].is_loaded and time.time() < deadline:
            time.sleep(0.05)
        assert not models.served()[1].is_loaded and busy.stopped and busy.released  # idle: unloaded, memory back
        assert models.served()[0].is_loaded and not made[0].stopped  # the first never
        models.forget("mallory")  # a user removed while it was not loaded
        assert models.engine(second) is made[2] and made[2].forgotten == ["mallory"]  # loaded again
        with pytest.raises(RequestError) as e:
            models.engine("gpt-4")
        assert e.value.status == 404 and e.value.code == "model_not_found"
        assert first in e.value.message and second in e.value.message
    finally:
        models.stop()
    assert all(s.stopped for s in made)


def test_a_model_that_fails_to_load_fails_its_requests_and_the_others_serve(tiny_model_dir, second_model):
    broken = threading.Event()
    broken.set()
    models, made = stand_set(tiny_model_dir, second_model, fail=lambda s: broken.is_set() and "second" in s.model)
    try:
        with pytest.raises(RequestError) as e:
            models.engine("second-random")
        assert e.value.status == 503 and e.value.code == "model_unavailable"
        assert "second-random" in e.value.message and "went away" not in e.value.message  # the log has why
        assert models.engine("tiny-random") is made[0]
        broken.clear()  # the folder is back: the next request loads it
        assert models.engine("second-random").info.model_id == "second-random"
    finally:
        models.stop()


def test_a_model_loads_only_when_it_fits_the_memory_budget(tiny_model_dir, second_model, tmp_path):
    third_model = build_random_model(tmp_path / "third-random", seed=9, dim=32)
    kv = 1 << 20
    need = {p.name: weights_bytes(str(p)) + kv for p in (tiny_model_dir, second_model, third_model)}
    assert all(n > kv for n in need.values())  # the weights are counted
    budget = need["tiny-random"] + max(need["second-random"], need["third-random"]) + kv // 2
    models, made = stand_set(
        tiny_model_dir, second_model, idle_s=0, more=[third_model], cache_bytes=kv, memory_bytes=budget
    )
    try:
        second = models.engine("second-random")
        third = models.engine("third-random")  # no room beside the second, idle: it goes first
        assert second.stopped and second.released and not third.stopped
        assert [m.is_loaded for m in models.served()] == [True, False, True]
        third.inflight = 1  # busy: nothing can make room for the second now
        with pytest.raises(RequestError) as e:
            models.engine("second-random")
        assert e.value.status == 503 and e.value.code == "model_unavailable"
        assert "needs" in e.value.message and "free" in e.value.message and "--memory-bytes" in e.value.message
        assert [m.is_loaded for m in models.served()] == [True, False, True] and not third.stopped
        third.inflight = 0
        assert models.engine("second-random") is made[-1] and third.stopped  # idle again: it goes
    finally:
        models.stop()


def test_the_server_tab_shows_every_model(tiny_model_dir, second_model, store):
    from radixchat.webui.page.logic.dashboard import Presence, summary_table

    models, made = stand_set(tiny_model_dir, second_model, idle_s=0)
    try:
        [line] = [x for x in summary_table(models, store, Presence()).splitlines() if x.startswith("| Models")]
        assert "`tiny-random`: loaded" in line and "`second-random`: not loaded" in line
        models.engine("second-random").inflight = 2
        [line] = [x for x in summary_table(models, store, Presence()).splitlines() if x.startswith("| Models")]
        assert "`second-random`: loaded" in line and "2 running" in line
    finally:
        models.stop()
    one = summary_table(made[0], store, Presence())  # one model: no such line
    assert "| Models" not in one


def test_a_name_served_twice_or_missing_is_refused_at_start(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="already names"):
        ModelSet.of(Settings(model=str(tiny_model_dir), extra_models=[str(tiny_model_dir)]), lambda s, o: None)
    with pytest.raises(FileNotFoundError):
        ModelSet.of(
            Settings(model=str(tiny_model_dir), extra_models=[str(tmp_path / "nothing-here")]), lambda s, o: None
        )


def test_a_users_limit_counts_their_requests_on_every_model(tiny_model_dir, second_model):
    from radixchat.core.engine.engine import Engine
    from radixchat.core.seam.requests import ChatRequest

    settings = Settings(model=str(tiny_model_dir), extra_models=[str(second_model)], max_user_requests=2, max_tokens=8)
    models = ModelSet.of(settings, lambda s, owners: Engine(s, owners).start(timeout=120)).start()

    def ask_long(model: str, owner: str):
        sampling = {"max_tokens": 400, "ignore_eos": True}
        request = ChatRequest(messages=[{"role": "user", "content": "Count"}], sampling=sampling, owner=owner)
        return models.engine(model).submit(request)

    try:
        held = [ask_long("tiny-random", "alice"), ask_long("second-random", "alice")]
        with pytest.raises(RequestError) as e:
            ask_long("second-random", "alice")  # her third, on either model
        assert e.value.status == 429 and e.value.code == "user_limit"
        held.append(ask_long("second-random", "bob"))  # bob's own count
        held[0].cancel()
        held[0].result()
        held.append(ask_long("second-random", "alice"))  # one of hers ended: room again
        for h in held[1:]:
            h.cancel()
            h.result()
        assert models.owners["alice"] == models.owners["bob"] == 0
    finally:
        models.stop()


def test_a_models_file_names_each_model_and_how_it_is_served(tiny_model_dir, second_model, tmp_path):
    listing = tmp_path / "models.toml"
    listing.write_text(
        f"""
[[model]]
path = "{tiny_model_dir}"
id = "chat"
aliases = ["assistant"]
temperature = 0.3

[[model]]
path = "{second_model}"
pinned = true
context_length = 256
top_p = 0.5
"""
    )
    made = []

    def make(settings, owners):
        made.append(Stand(settings, settings.served_model_name or settings.model.rsplit("/", 1)[-1]))
        return made[-1]

    models = ModelSet.of(Settings(models=listing, model_idle_s=0.1), make).start()
    try:
        served = models.served()
        assert [(m.model_id, m.pinned) for m in served] == [("chat", True), ("second-random", True)]
        assert {"assistant", "default", str(tiny_model_dir)} <= set(served[0].aliases)
        assert models.engine("assistant") is models.default
        second = models.engine("second-random")
        assert second.settings.context_length == 256 and second.settings.sampling_defaults == {"top_p": 0.5}
        assert made[0].settings.sampling_defaults == {"temperature": 0.3}
        time.sleep(0.5)
        assert models.served()[1].is_loaded  # pinned: never unloaded when idle
    finally:
        models.stop()
    bad = tmp_path / "bad.toml"
    for text, words in [
        ("[[model]]\npath = 'tiny'\n[[model]]\npath = 'tiny'\ntempreature = 1", "number 2, tempreature"),
        ("[[model]]\npath = 'tiny'\ntop_p = 2", "number 1, top_p"),
        ("[model\n", "not TOML"),
        ("", "model: Field required"),
    ]:
        bad.write_text(text)
        with pytest.raises(ValueError) as e:
            ModelSet.of(Settings(models=bad), make)
        assert words in str(e.value) and str(bad) in str(e.value), e.value


def test_a_served_name_and_sampling_reach_what_clients_see(tiny_model_dir):
    from radixchat.core.engine.engine import Engine

    settings = Settings(model=str(tiny_model_dir), served_model_name="chat", sampling_defaults={"temperature": 0.3})
    engine = Engine(settings).start(timeout=120)
    try:
        assert engine.info.model_id == "chat" and engine.info.sampling_defaults == {"temperature": 0.3}
    finally:
        engine.stop()
    with pytest.raises(ValueError, match="only frequency_penalty, presence_penalty"):
        Settings(sampling_defaults={"min_p": 0.1})


# ---- a real server of two models -----------------------------------------------------------


def ask(url: str, model: str, text: str, stream: bool) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0}
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model
        return r.json()["choices"][0]["message"]["content"]
    parts = []
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = httpx.Response(200, content=line[6:]).json()
                assert chunk["model"] == model
                parts += [c["delta"].get("content") or "" for c in chunk["choices"]]
    return "".join(parts)


QUESTIONS = ["What is a list?", "Tell me about dictionaries.", "How do generators work?"]


def answers(url: str, models: list[str]) -> dict:
    """Every question to every model, streamed and not, all at once."""
    jobs = [(m, q, s) for m in models for q in QUESTIONS for s in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        return dict(zip(jobs, pool.map(lambda j: ask(url, *j), jobs)))


def listed(url: str) -> dict:
    return {m["id"]: m["loaded"] for m in httpx.get(url + "/v1/models").json()["data"]}


@pytest.mark.slow
def test_two_models_served_together_answer_as_each_alone(tiny_model_dir, second_model, tmp_path):
    ids = ["tiny-random", "second-random"]
    alone = {}
    for model_dir, model_id in zip((tiny_model_dir, second_model), ids):
        srv = Server(model_dir, tmp_path / f"{model_id}.db", "--no-auth", "--no-warm-presets")
        try:
            alone.update(answers(srv.url, [model_id]))
        finally:
            stop_clean(srv)
    srv = Server(
        tiny_model_dir,
        tmp_path / "both.db",
        "--model",
        str(second_model),
        "--model-idle-s",
        "3",
        "--no-auth",
        "--no-warm-presets",
    )
    try:
        assert listed(srv.url) == {"tiny-random": True, "second-random": False}
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "gpt-4", "messages": []}, timeout=30)
        assert r.status_code in (400, 404)
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        err = r.json()["error"]
        assert r.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
        assert all(i in err["message"] for i in ids)
        together = answers(srv.url, ids)  # the second loads under the first request naming it
        assert together == alone
        assert listed(srv.url) == {"tiny-random": True, "second-random": True}
        assert {m["id"]: m["loaded"] for m in httpx.get(srv.url + "/health").json()["models"]} == listed(srv.url)
        assert all(srv.metric("radixchat:engine_alive", model_name=i) == 1 for i in ids)
        assert srv.metric("radixchat:generation_tokens_total", model_name="second-random") > 0
        deadline = time.time() + 30
        while listed(srv.url)["second-random"] and time.time() < deadline:
            time.sleep(0.2)
        assert listed(srv.url) == {"tiny-random": True, "second-random": False}  # idle: unloaded
        assert srv.metric("radixchat:engine_alive", model_name="second-random") == 0
        assert ask(srv.url, "second-random", QUESTIONS[0], False) == alone[("second-random", QUESTIONS[0], False)]
    finally:
        stop_clean(srv)
