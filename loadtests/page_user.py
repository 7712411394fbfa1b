"""A Locust user that chats through the web page the way a browser does.

It signs in (POST /login), reads the page's config, opens the page (the `on_load` event),
opens a tab with its system prompt (`new_tab`), then sends each question with `respond`,
all through Gradio's queue protocol (sse_v3): POST /gradio_api/queue/join, then read the
session's server-sent events until `process_completed`. The page keeps the history, so a
turn only sends the new question. Time to first token is the first streamed update after
the page's placeholder; the full stream ends at `process_completed`.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from pathlib import Path

from locust import HttpUser, between, task

from loadtests.scenario import MAX_TOKENS, SYSTEMS, THINK_S, Conversation, _seeds, fire, request_done, take_request_slot


class PageError(Exception):
    pass


class PageUser(HttpUser):
    wait_time = between(THINK_S * 0.5, THINK_S * 1.5)

    def on_start(self):
        self.rng = random.Random(next(_seeds))
        users = json.loads(Path(os.environ["RADIXCHAT_USERS_FILE"]).read_text())
        cred = users[self.rng.randrange(len(users))]
        r = self.client.post("/login", data={"username": cred["name"], "password": cred["password"]}, name="/login")
        if r.status_code != 200:
            raise PageError(f"sign-in failed: HTTP {r.status_code}")
        config = self.client.get("/config", name="/config").json()
        self.prefix = config.get("api_prefix", "/gradio_api")
        self.fns = {d["api_name"]: d for d in config["dependencies"]}
        self.session = uuid.uuid4().hex[:11]
        self.call("on_load", [None])

    def call(self, fn: str, data: list, on_update=None) -> dict:
        """Run one page event; returns its final output. on_update(t) sees each streamed update."""
        dep = self.fns[fn]
        join = self.client.post(
            f"{self.prefix}/queue/join",
            name=f"queue/join {fn}",
            json={
                "data": data,
                "event_data": None,
                "fn_index": dep["id"],
                "trigger_id": dep["targets"][0][0],
                "session_hash": self.session,
            },
        )
        if join.status_code != 200:
            raise PageError(f"queue/join {fn}: HTTP {join.status_code}")
        event = join.json()["event_id"]
        with self.client.get(
            f"{self.prefix}/queue/data",
            params={"session_hash": self.session},
            stream=True,
            catch_response=True,
            name=f"queue/data {fn}",
        ) as stream:
            for line in stream.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("event_id") != event:
                    continue
                if msg.get("msg") == "process_generating" and on_update:
                    on_update(time.perf_counter())
                if msg.get("msg") == "process_completed":
                    if not msg.get("success"):
                        error = f"{fn} failed: {msg.get('output', {}).get('error')}"
                        stream.failure(error)
                        raise PageError(error)
                    stream.success()
                    return msg["output"]
            stream.failure("the event stream ended early")
        raise PageError(f"{fn}: the event stream ended early")

    @task
    def conversation(self):
        conv = Conversation(self.rng)
        out = self.call("new_tab", [SYSTEMS[conv.system_index], None])
        tab = out["data"][0]["value"]
        for q in conv.questions:
            if not take_request_slot(self.environment):
                return
            try:
                ok = self.turn(conv, tab, q)
            finally:
                request_done()
            if not ok:
                return
            time.sleep(self.rng.uniform(THINK_S * 0.5, THINK_S * 1.5))

    def turn(self, conv: Conversation, tab, question: str) -> bool:
        name = f"page[system {conv.system_index}]"
        updates: list[float] = []
        t0 = time.perf_counter()
        try:
            self.call("respond", [question, tab, 0, MAX_TOKENS, None], updates.append)
        except Exception as e:  # this turn's failure, reported as such
            fire(self.environment, "STREAM", name, (time.perf_counter() - t0) * 1e3, e)
            return False
        end = time.perf_counter()
        # the first update only shows the page's placeholder; the next one carries text
        first = updates[1] if len(updates) > 1 else end
        fire(self.environment, "TTFT", name, (first - t0) * 1e3)
        fire(self.environment, "STREAM", name, (end - t0) * 1e3)
        return True
