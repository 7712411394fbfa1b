"""Locust users for the "seed" scenario (shared/seeds/000: 4 system prompts x 30 questions).

Each simulated user picks one of the 4 system prompts in assets/prompts.json and holds a
multi-turn conversation (2-4 turns, each turn appending the previous answer), with a
think time between turns. `ApiUser` talks to the OpenAI-compatible API (streaming);
`PageUser` (loadtests/page_user.py) to the web page through Gradio's queue protocol.

Locust stops its clock at the response headers of a streamed response, so every turn
also fires its own events: "TTFT" (to the first content) and "STREAM" (to the end).
Run it as Locust's users do (`locust -f loadtests/locustfile.py --host URL`, with Locust's UI
or -t/-u), or through loadtests/run.py, which starts a server and bounds the run in count and
time. Settings come from the environment: RADIXCHAT_API_KEY, RADIXCHAT_MAX_REQUESTS (a bound
on requests; unset: none), RADIXCHAT_THINK_S, RADIXCHAT_MAX_TOKENS, RADIXCHAT_SEED,
RADIXCHAT_USERS_FILE (page users' credentials; unset: PageUser is skipped).
"""

from __future__ import annotations

import json
import os
import random
import time

from locust import HttpUser, between, task

from loadtests.scenario import MAX_TOKENS, THINK_S, Conversation, _seeds, fire, request_done, take_request_slot


class ApiUser(HttpUser):
    wait_time = between(THINK_S * 0.5, THINK_S * 1.5)

    def on_start(self):
        self.rng = random.Random(next(_seeds))
        self.headers = {"Authorization": f"Bearer {os.environ.get('RADIXCHAT_API_KEY', '')}"}

    @task
    def conversation(self):
        conv = Conversation(self.rng)
        for q in conv.questions:
            if not take_request_slot(self.environment):
                return
            conv.messages.append({"role": "user", "content": q})
            try:
                answer = self.turn(conv)
            finally:
                request_done()
            if answer is None:
                return
            conv.messages.append({"role": "assistant", "content": answer})
            time.sleep(self.rng.uniform(THINK_S * 0.5, THINK_S * 1.5))

    def turn(self, conv: Conversation) -> str | None:
        body = {
            "model": "default",
            "messages": conv.messages,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        name = f"chat[system {conv.system_index}]"
        t0 = time.perf_counter()
        first = None
        parts, usage = [], None
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=self.headers,
            stream=True,
            name="/v1/chat/completions",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                fire(
                    self.environment,
                    "STREAM",
                    name,
                    (time.perf_counter() - t0) * 1e3,
                    RuntimeError(f"HTTP {r.status_code}"),
                )
                return None
            try:
                for line in r.iter_lines():
                    if not line or not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RuntimeError(chunk["error"]["message"])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices", []):
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            first = first or time.perf_counter()
                            parts.append(text)
                if usage is None:
                    raise RuntimeError("stream ended without usage")
            except Exception as e:  # a broken stream is this request's failure
                r.failure(str(e))
                fire(self.environment, "STREAM", name, (time.perf_counter() - t0) * 1e3, e)
                return None
            r.success()
        end = time.perf_counter()
        fire(self.environment, "TTFT", name, ((first or end) - t0) * 1e3)
        fire(self.environment, "STREAM", name, (end - t0) * 1e3, length=usage["completion_tokens"])
        return "".join(parts)


if os.environ.get("RADIXCHAT_USERS_FILE"):
    from loadtests.page_user import PageUser  # noqa: F401  (Locust finds user classes here)
else:  # without accounts a page user cannot sign in: run the API users alone, and say so
    import logging

    logging.getLogger("radixchat.loadtest").warning(
        'PageUser skipped: set RADIXCHAT_USERS_FILE to a JSON list of {"name", "password"} '
        "accounts (radixchat users add) to load the page too"
    )
