"""How well a model chooses tools: a small fixed set of questions, three tools, through the API.

Starts `radixchat serve --model M --no-auth` and asks each question with the tools, greedy,
twice: with tool_choice "auto" (does it call when a tool is needed, the right one, with
arguments its schema accepts, and answer in text when none is?) and "required" (the
grammar makes every reply a valid call: is it the right tool?). A model whose template has
no tool format (SmolLM2) uses radixchat's generic one. Prints the counts and each miss.

    python -m loadtests.bench_tools [--model default]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import jsonschema
import openai

from tests.support.procs import free_port, start_radixchat, stop_process


def _tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    params = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS = [
    _tool(
        "get_weather",
        "The weather forecast for a city",
        {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        ["city"],
    ),
    _tool("get_time", "The current time in a time zone", {"zone": {"type": "string"}}, ["zone"]),
    _tool(
        "convert_currency",
        "Convert an amount of money from one currency to another",
        {"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
        ["amount", "from", "to"],
    ),
]
# (question, the tool it needs, or None: it needs none)
CASES = [
    ("What will the weather be in Paris tomorrow?", "get_weather"),
    ("Is it going to rain in Oslo this week?", "get_weather"),
    ("Give me the 3-day forecast for Lima.", "get_weather"),
    ("What time is it in Tokyo right now?", "get_time"),
    ("What's the current time in UTC?", "get_time"),
    ("Tell me the time in New York.", "get_time"),
    ("How many euros is 100 US dollars?", "convert_currency"),
    ("Convert 250 GBP to JPY.", "convert_currency"),
    ("What is 40 Swiss francs in euros?", "convert_currency"),
    ("Write a haiku about autumn.", None),
    ("What is the capital of France?", None),
    ("Explain what a Python list is in one sentence.", None),
]


def ask(client: openai.OpenAI, question: str, choice) -> tuple[str | None, dict | None, str]:
    out = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": question}],
        tools=TOOLS,
        tool_choice=choice,
        temperature=0,
        max_tokens=96,
    )
    msg = out.choices[0].message
    if not msg.tool_calls:
        return None, None, msg.content or ""
    call = msg.tool_calls[0].function
    try:
        args = json.loads(call.arguments)
    except ValueError:
        args = None
    return call.name, args, call.arguments


def valid(name: str, args) -> bool:
    schema = next((t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name), None)
    if schema is None or not isinstance(args, dict):
        return False
    try:
        jsonschema.validate(args, schema)
        return True
    except jsonschema.ValidationError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_radixchat(args.model, Path(tmp) / "db", port, Path(tmp) / "log", "--no-auth", "--no-warm-presets")
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
            auto = [(q, want, *ask(client, q, "auto")) for q, want in CASES]
            required = [(q, want, *ask(client, q, "required")) for q, want in CASES if want]
        finally:
            stop_process(proc)
    needs = [r for r in auto if r[1]]
    called = [r for r in needs if r[2]]
    right = [r for r in called if r[2] == r[1]]
    ok = [r for r in right if valid(r[2], r[3])]
    quiet = [r for r in auto if not r[1] and not r[2]]
    print(f"model {args.model!r}, {len(CASES)} questions, {len(TOOLS)} tools, greedy")
    print(
        f"auto: called a tool for {len(called)}/{len(needs)} that need one, the right one {len(right)}, "
        f"with valid arguments {len(ok)}; answered in text {len(quiet)}/{len(auto) - len(needs)} that need none"
    )
    req_right = [r for r in required if r[2] == r[1]]
    req_ok = [r for r in req_right if valid(r[2], r[3])]
    print(f"required: the right tool {len(req_right)}/{len(required)}, with valid arguments {len(req_ok)}")
    for q, want, name, _, raw in auto + required:
        if name != want or (name and not valid(name, json.loads(raw) if raw.startswith("{") else None)):
            print(f"  miss: {q!r} wanted {want}, got {name or 'text'}: {raw[:100]!r}")


if __name__ == "__main__":
    main()
