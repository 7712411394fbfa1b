"""Clients of a running server: the official OpenAI client with a key, the smallest good chat
request, a tool in Anthropic's shape (`ANTHROPIC_WEATHER`), an httpx client signed in to the page as one of its users, and `PageClient`, a small
client of Gradio's queue protocol (sse_v3) that speaks for one browser's page session."""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING

import httpx

from tests.support.server import PASSWORDS

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

# a tool for the Anthropic-shaped clients (the anthropic SDK, LangChain's ChatAnthropic)
ANTHROPIC_WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "additionalProperties": False,
        "required": ["city"],
        "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    },
}
# a schema even a random model's reply follows (the grammar masks every other token)
RECIPE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "vegan", "course"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "vegan": {"type": "boolean"},
        "course": {"enum": ["starter", "main", "dessert"]},
    },
}


API = "/gradio_api"
GOOD = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def client(server, key):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def signed_in(url: str, name: str) -> httpx.Client:
    http = httpx.Client(base_url=url, timeout=30)
    r = http.post("/login", data={"username": name, "password": PASSWORDS[name]})
    assert r.status_code == 200, r.text
    return http


class PageClient:
    """One browser's page session, spoken to the way Gradio's browser client does."""

    def __init__(self, http: httpx.Client | TestClient):
        self.http = http
        self.session = secrets.token_hex(6)
        self.fns = {d["api_name"]: d for d in http.get("/config").json()["dependencies"]}

    def join(self, fn: str, data: list) -> tuple[httpx.Response, str | None]:
        dep = self.fns[fn]
        r = self.http.post(
            f"{API}/queue/join",
            json={
                "data": data,
                "event_data": None,
                "fn_index": dep["id"],
                "trigger_id": dep["targets"][0][0],
                "session_hash": self.session,
            },
        )
        return r, (r.json().get("event_id") if r.status_code == 200 else None)

    def messages(self, event_id: str) -> list[dict]:
        """This session's messages for one event, until it completes."""
        seen = []
        with self.http.stream("GET", f"{API}/queue/data", params={"session_hash": self.session}) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("event_id") == event_id:
                    seen.append(msg)
                    if msg.get("msg") == "process_completed":
                        return seen
        raise AssertionError(f"the stream ended before the event completed: {seen}")

    def cancel_body(self, event_id: str, session: str | None = None) -> dict:
        return {"session_hash": session or self.session, "fn_index": self.fns["respond"]["id"], "event_id": event_id}
