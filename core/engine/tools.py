"""Tool calling: which format a model's chat template uses, the grammar that forces a call,
and the calls parsed back out of a reply.

The tools themselves reach the model through its own chat template (the `tools` argument
of `apply_chat_template`, as Hugging Face templates take it). What the model writes back
differs by family, and the family is read off the template:

- hermes (Qwen, Hermes, SmolLM3 and most ChatML models): `<tool_call>\n{"name": ..,
  "arguments": {..}}\n</tool_call>`, one block per call, text may come before;
- llama3: the reply is one JSON object `{"name": .., "parameters": {..}}` (optionally after
  `<|python_tag|>`);
- mistral: `[TOOL_CALLS] [{"name": .., "arguments": {..}}, ...]`.

A template with none of these has no tool format: the API refuses `tools` for it.
`grammar` builds an llguidance Lark grammar (with the call's JSON schema embedded) for
`tool_choice` "required" or a named function, so the reply is exactly a call (constrained
decoding in core/engine/constrain.py). No MLX; any thread.
"""

from __future__ import annotations

import json
import re
import uuid

FAMILIES = ("hermes", "llama3", "mistral")
MARKERS = {"hermes": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def family(chat_template: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, or None."""
    t = chat_template or ""
    if "tools" not in t:
        return None
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("<|eot_id|>" in t and "parameters" in t):
        return "llama3"
    return None


def _call_schema(tool: dict, arguments_key: str) -> dict:
    fn = tool["function"]
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", arguments_key],
        "properties": {"name": {"const": fn["name"]}, arguments_key: fn.get("parameters") or {"type": "object"}},
    }


def grammar(fam: str, tools: list[dict], only: str | None = None) -> str:
    """A Lark grammar (llguidance's, JSON schemas embedded) whose only sentences are one call
    of one of `tools` (of `only`, when named) in `fam`'s format."""
    chosen = [t for t in tools if only is None or t["function"]["name"] == only]
    key = "parameters" if fam == "llama3" else "arguments"
    schema = {"x-guidance": {"whitespace_flexible": False}, "anyOf": [_call_schema(t, key) for t in chosen]}
    call = "call: %json " + json.dumps(schema)
    if fam == "hermes":
        return 'start: "<tool_call>\\n" call "\\n</tool_call>"\n' + call
    if fam == "mistral":
        return 'start: "[TOOL_CALLS] [" call "]"\n' + call
    return "start: call\n" + call


def _call(name: str, arguments) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}


def parse(fam: str, text: str) -> tuple[str, list[dict]]:
    """(the reply's text outside any call, the calls in OpenAI's shape). Text that only
    looks like a call but does not parse stays text."""
    calls: list[dict] = []
    if fam == "hermes":
        rest = text
        for m in _HERMES.finditer(text):
            try:
                obj = json.loads(m.group(1))
                calls.append(_call(obj["name"], obj.get("arguments")))
                rest = rest.replace(m.group(0), "", 1)
            except (ValueError, KeyError, TypeError):
                continue
        return (rest.strip() if calls else text), calls
    if fam == "mistral":
        head, marker, tail = text.partition(MARKERS["mistral"])
        if not marker:
            return text, []
        try:
            objs = json.loads(tail.strip())
            objs = objs if isinstance(objs, list) else [objs]
            return head.strip(), [_call(o["name"], o.get("arguments")) for o in objs]
        except (ValueError, KeyError, TypeError):
            return text, []
    body = text.strip().removeprefix(MARKERS["llama3"]).strip()
    try:
        obj = json.loads(body)
        return "", [_call(obj["name"], obj.get("parameters", obj.get("arguments")))]
    except (ValueError, KeyError, TypeError, AttributeError):
        return text, []


def held_back(fam: str, text: str) -> int:
    """Where streaming must stop showing text: at the start of a call, or of what may still
    become one (a prefix of the marker at the end); len(text) when nothing is held."""
    marker = MARKERS[fam] if fam != "llama3" else None
    if fam == "llama3":
        stripped = text.lstrip()
        if stripped[:1] in ("{", "<") or not stripped:
            return 0  # a llama3 call is the whole reply: wait for the first character
        return len(text)
    at = text.find(marker)
    if at >= 0:
        return at
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)
