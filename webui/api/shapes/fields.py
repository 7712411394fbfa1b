"""The one rule for request fields, and each API's table of what its fields do here.

A field this server implements is used; an informational one (it cannot change the reply:
`user`, `metadata`, `store`...) is accepted and ignored; one it does not implement is
refused with a 400 naming it unless it holds its "off" value (`logprobs: false`,
`response_format: {"type": "text"}`, null), which is what clients send when they mean
nothing by it; a field the API does not have is refused;
text that is not valid Unicode (a lone surrogate, anywhere in the body) is refused by where it is.
The tables are docs/API.md's parameter table. The request models (webui/api/shapes/schema.py,
webui/api/shapes/responses_shapes.py) run `check_fields` on the raw body before pydantic reads it.
Pure functions on the event loop; no MLX.
"""

from __future__ import annotations

import re
from typing import Any

USED = "used"
IGNORED = "ignored"  # informational: accepted, cannot change the reply
REFUSED = "refused"  # not implemented: a 400 naming it unless it holds its off value

COMMON = {
    "model": USED,
    "max_tokens": USED,
    "temperature": USED,
    "top_p": USED,
    "stop": USED,
    "stream": USED,
    "stream_options": USED,
    "seed": USED,
    "n": USED,
    "presence_penalty": USED,
    "frequency_penalty": USED,
    "repetition_penalty": USED,
    "top_k": USED,
    "min_p": USED,
    "ignore_eos": USED,
    "user": IGNORED,
    "logit_bias": USED,
    "logprobs": USED,
}
CHAT = {
    **COMMON,
    "messages": USED,
    "max_completion_tokens": USED,
    "metadata": IGNORED,
    "store": IGNORED,
    "service_tier": IGNORED,
    "safety_identifier": IGNORED,
    "prompt_cache_key": IGNORED,
    "parallel_tool_calls": IGNORED,
    "top_logprobs": USED,
    "response_format": USED,
    "tools": USED,
    "tool_choice": USED,
    "functions": REFUSED,
    "function_call": REFUSED,
    "audio": REFUSED,
    "modalities": REFUSED,
    "prediction": REFUSED,
    "reasoning_effort": USED,
    "verbosity": REFUSED,
    "web_search_options": REFUSED,
}
COMPLETIONS = {**COMMON, "prompt": USED, "echo": USED, "best_of": REFUSED, "suffix": REFUSED}
RESPONSES = {
    "model": USED,
    "input": USED,
    "instructions": USED,
    "stream": USED,
    "previous_response_id": USED,
    "max_output_tokens": USED,
    "temperature": USED,
    "top_p": USED,
    "store": USED,
    "text": USED,
    "seed": USED,
    "user": IGNORED,
    "metadata": IGNORED,
    "service_tier": IGNORED,
    "truncation": IGNORED,
    "parallel_tool_calls": IGNORED,
    "safety_identifier": IGNORED,
    "prompt_cache_key": IGNORED,
    "stream_options": IGNORED,
    "tools": USED,
    "tool_choice": USED,
    "reasoning": REFUSED,
    "include": REFUSED,
    "background": REFUSED,
    "conversation": REFUSED,
    "prompt": REFUSED,
    "top_logprobs": REFUSED,
    "max_tool_calls": REFUSED,
}
FIELDS = {"chat": CHAT, "completions": COMPLETIONS, "responses": RESPONSES}

# what a refusal calls the feature a field asks for (else the field's own name)
NOT_YET = {
    "response_format": "structured output",
    "tools": "tool calling",
    "tool_choice": "tool calling",
    "functions": "function calling",
    "function_call": "function calling",
    "audio": "audio output",
    "modalities": "audio output",
}


def _off(name: str, value: Any) -> bool:
    """Does this value of a refused field ask for nothing (what clients send by default)?"""
    if name == "best_of":
        return value in (None, 1)
    return value in (None, False, 0, "", [], {}, "none", "auto") or value == {"type": "text"} or value == ["text"]


def check_fields(data: Any, table: dict[str, str], api: str) -> Any:
    """The one rule of the module docstring, on the raw body (before pydantic reads it):
    `table` says what each field of `api` (its name, for the message) does here. Returns
    the fields the request model reads."""
    if not isinstance(data, dict):
        return data
    refuse_lone_surrogate(data)
    for name, value in data.items():
        use = table.get(name)
        if use is None:
            raise ValueError(
                f"{name}: unknown field (this server takes the fields of OpenAI's {api} API listed in its docs/API.md)"
            )
        if use == REFUSED and not _off(name, value):
            what = NOT_YET.get(name, name)
            raise ValueError(f"{name}: {what} is not supported by this server")
    return {k: v for k, v in data.items() if table[k] == USED}


# JSON may escape half of a UTF-16 pair alone ("\ud800"); such text can be neither tokenized
# nor stored, and the tokenizer's complaint is no answer for a client
NOT_UNICODE = "text must be valid Unicode (it holds a lone surrogate, half of a UTF-16 pair)"
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any) -> str | None:
    """Where in `value` (JSON as Python reads it) a string or key holds a lone surrogate
    ("messages.0.content"; "body" for the top), or None if nowhere. A loop, not recursion:
    a body may nest as deep as the JSON parser allows."""
    todo: list[tuple[Any, str]] = [(value, "")]
    while todo:
        v, where = todo.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return where or "body"
        elif isinstance(v, dict):
            for k, item in reversed(v.items()):
                if isinstance(k, str) and _SURROGATE.search(k):
                    return where or "body"
                todo.append((item, f"{where}.{k}" if where else str(k)))
        elif isinstance(v, list):
            todo.extend((item, f"{where}.{i}" if where else str(i)) for i, item in reversed(list(enumerate(v))))
    return None


def refuse_lone_surrogate(value: Any) -> None:
    """ValueError naming where `value` holds a lone surrogate, if it does (every API's body)."""
    where = lone_surrogate(value)
    if where is not None:
        raise ValueError(f"{where}: {NOT_UNICODE}")


PENALTIES = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}  # and their off values


def penalties(body: object, defaults: dict[str, float] | None) -> dict[str, float]:
    """The request's penalties; what it left out from `defaults` (the model card's), else off."""
    defaults = defaults or {}
    return {
        k: getattr(body, k) if getattr(body, k, None) is not None else defaults.get(k, off)
        for k, off in PENALTIES.items()
    }


def with_defaults(
    temperature: float | None, top_p: float | None, defaults: dict[str, float] | None
) -> dict[str, float]:
    """The request's temperature and top_p; what it left out from `defaults` (the model card's
    recommendation), else OpenAI's 1.0."""
    defaults = defaults or {}
    return {
        "temperature": temperature if temperature is not None else defaults.get("temperature", 1.0),
        "top_p": top_p if top_p is not None else defaults.get("top_p", 1.0),
    }
