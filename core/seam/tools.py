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

A template with none of these (SmolLM2's, most small models') gets the generic format, as
llama-server gives such models one: `generic_messages` describes the tools in the system
message and asks for a call as the whole reply, one JSON object `{"name": .., "arguments":
{..}}`, and rewrites earlier calls and tool results as plain turns the template can render.
`grammar` builds an llguidance Lark grammar (with the call's JSON schema embedded) for
`tool_choice` "required" or a named function, so the reply is exactly a call (constrained
decoding in core/engine/sample/constrain.py). No MLX; any thread.
"""

from __future__ import annotations

import json
import re
import uuid

from radixchat.core.seam.requests import RequestError
from radixchat.core.seam.schema_finite import finite

FAMILIES = ("hermes", "llama3", "mistral", "generic")
MARKERS = {"hermes": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
# the generic format's instructions, before the list of tools (worded for small models)
GENERIC_HOW = (
    "Available tools are listed below. If the user's request matches a tool, output the call "
    'as JSON: {"name": "tool_name", "arguments": {"arg": "value"}}. Example: for "weather in '
    'Rome" output {"name": "get_weather", "arguments": {"city": "Rome"}}. Otherwise reply in '
    "text.\nTools:"
)
# a forced call none of whose tools' parameters any finite JSON satisfies
NO_CALL = "tools: no call of these tools can be written (the parameters admit no finite JSON)"
# an example of each tool's call, its arguments' values by type (an example helps small
# models most: SmolLM2-135M picked the right tool for 3 of 9 questions without one, 6 with)
_EXAMPLE = {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
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


def generic_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """`messages` for a template without a tool format: the tools described at the end of
    the system message (one is added first when there is none), each earlier call written
    as the assistant's JSON and each tool result as a user turn naming its tool."""
    out = [dict(m) for m in messages]
    if tools:
        lines = [GENERIC_HOW]
        for t in tools:
            fn = t["function"]
            params = fn.get("parameters") or {"type": "object"}
            props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
            args = {k: _EXAMPLE.get(v.get("type") if isinstance(v, dict) else None, "...") for k, v in props.items()}
            example = {"name": fn["name"], "arguments": args}
            about = f": {fn['description']}." if fn.get("description") else ":"
            lines.append(
                f"- {fn['name']}{about} Call it as {json.dumps(example)} "
                f"(arguments: {json.dumps(params, separators=(',', ':'))})"
            )
        how = "\n".join(lines)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{how}"
        else:
            out.insert(0, {"role": "system", "content": how})
    names: dict[str, str] = {}  # call id -> tool name, for the results that answer them
    for m in out:
        calls = m.pop("tool_calls", None)
        if m["role"] == "assistant" and calls:
            written = []
            for c in calls:
                fn = c.get("function", {})
                names[c.get("id", "")] = fn.get("name", "")
                args = fn.get("arguments") or {}  # an object as templates take it, or its JSON
                args = args if isinstance(args, str) else json.dumps(args)
                written.append(f'{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {args}}}')
            m["content"] = "\n".join(filter(None, [m.get("content") or "", *written]))
        elif m["role"] == "tool":
            name = m.pop("name", None) or names.get(m.pop("tool_call_id", None) or "", "") or "the tool"
            m["role"], m["content"] = "user", f"Result of {name}: {m['content']}"
        m.pop("tool_call_id", None)
        m.pop("name", None)
    return out


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
    if not finite(schema):  # the call would run into the grammar engine's depth mid-reply
        raise RequestError(NO_CALL, code="invalid_schema")
    call = "call: %json " + json.dumps(schema)
    if fam == "hermes":
        return 'start: "<tool_call>\\n" call "\\n</tool_call>"\n' + call
    if fam == "mistral":
        return 'start: "[TOOL_CALLS] [" call "]"\n' + call
    return "start: call\n" + call  # llama3's and the generic format: the reply is the call


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
    if fam == "generic":  # small models like to fence their JSON
        fenced = _FENCE.match(body)
        body = fenced.group(1) if fenced else body
    try:
        obj = json.loads(body)
        return "", [_call(obj["name"], obj.get("parameters", obj.get("arguments")))]
    except (ValueError, KeyError, TypeError, AttributeError):
        return text, []


def held_back(fam: str, text: str) -> int:
    """Where streaming must stop showing text: at the start of a call, or of what may still
    become one (a prefix of the marker at the end); len(text) when nothing is held."""
    marker = MARKERS.get(fam)
    if marker is None or fam == "llama3":
        stripped = text.lstrip()
        if stripped[:1] in ("{", "<", "`") or not stripped:
            return 0  # a call is the whole reply: wait for the first character
        return len(text)
    at = text.find(marker)
    if at >= 0:
        return at
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)
