"""The model bundled in assets/: loads offline in mlx-lm's format, answers its training questions
on topic, renders chats with its template and stops at its end-of-turn token.

Generation here runs without OpenBLAS too (plain pytest), so answers are kept short.
"""

import json
import os

import pytest

from radixchat import assets

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm import generate, load, stream_generate

MODEL = assets.BUNDLED_MODEL
PROMPTS = assets.prompts()


@pytest.fixture(scope="module")
def bundled():
    return load(str(MODEL))


def chat(tokenizer, question, system=None):
    messages = [{"role": "system", "content": system}] if system else []
    return tokenizer.apply_chat_template(messages + [{"role": "user", "content": question}], add_generation_prompt=True)


def test_files_are_a_small_float32_llama_checkpoint(bundled):
    model, _ = bundled
    config = json.loads((MODEL / "config.json").read_text())
    assert config["model_type"] in ("llama", "qwen3")
    assert (MODEL / "model.safetensors").stat().st_size <= 25 * 2**20
    assert {v.dtype for _, v in tree_flatten(model.parameters())} == {mx.float32}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (MODEL / name).exists()


def test_eos_is_the_end_of_turn_token(bundled):
    _, tokenizer = bundled
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    assert tokenizer.eos_token == "<|end|>"
    assert end in tokenizer.eos_token_ids
    assert json.loads((MODEL / "config.json").read_text())["eos_token_id"] == end


def test_chat_template_renders_all_roles(bundled):
    _, tokenizer = bundled
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What does len do?"},
        {"role": "assistant", "content": "It counts items."},
        {"role": "user", "content": "Thanks"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nWhat does len do?<|end|>\n"
        "<|assistant|>\nIt counts items.<|end|>\n<|user|>\nThanks<|end|>\n"
        "<|assistant|>\n"
    )
    # Each turn's prompt is a token prefix of the next turn's: what a prefix cache reuses.
    first = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert whole[: len(first)] == first


@pytest.mark.parametrize(
    "question, system, terms",
    [
        ("What does math.sqrt do?", None, ["math.sqrt", "square root"]),
        ("What does str.join do?", "You are a helpful assistant.", ["str.join", "Concatenate"]),
        ("What is the `while` statement?", PROMPTS["system_prompts"][2]["text"], ["`while`", "repeated execution"]),
    ],
)
def test_greedy_answers_to_training_questions_are_on_topic(bundled, question, system, terms):
    model, tokenizer = bundled
    reply = generate(model, tokenizer, chat(tokenizer, question, system), max_tokens=48)
    for term in terms:
        assert term in reply, (question, reply)


def test_generation_stops_at_eos(bundled):
    model, tokenizer = bundled
    prompt = chat(tokenizer, "What does list.append do?", PROMPTS["system_prompts"][0]["text"])
    last = None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=80):  # noqa: B007
        pass
    assert last.finish_reason == "stop"
    assert last.token in tokenizer.eos_token_ids


def test_scenario_prompts_and_questions():
    prompts, questions = PROMPTS["system_prompts"], PROMPTS["questions"]
    assert len(prompts) == 4 and len({p["name"] for p in prompts}) == 4
    assert len(questions) == 30 and len(set(questions)) == 30


def test_scenario_system_prompts_are_150_to_300_tokens(bundled):
    _, tokenizer = bundled
    for p in PROMPTS["system_prompts"]:
        assert 150 <= len(tokenizer.encode(p["text"])) <= 300, p["name"]
