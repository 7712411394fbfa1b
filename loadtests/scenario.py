"""The seed scenario's shared parts: prompts, conversations, the run's request bound, events.

Used by both Locust user classes (loadtests/locustfile.py: ApiUser; loadtests/page_user.py:
PageUser), so the bound and the counters are one per run. Settings come from the
environment: RADIXCHAT_MAX_REQUESTS (unset: no bound), RADIXCHAT_THINK_S, RADIXCHAT_MAX_TOKENS,
RADIXCHAT_SEED.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time

import gevent

from radixchat import assets

PROMPTS = assets.prompts()
SYSTEMS = [s["text"] for s in PROMPTS["system_prompts"]]
QUESTIONS = PROMPTS["questions"]

# No bound unless asked for (loadtests/run.py asks): Locust's own -t / --iterations end a run
MAX_REQUESTS = int(os.environ.get("RADIXCHAT_MAX_REQUESTS") or 0) or None
THINK_S = float(os.environ.get("RADIXCHAT_THINK_S", "0.5"))
MAX_TOKENS = int(os.environ.get("RADIXCHAT_MAX_TOKENS", "64"))
_seeds = itertools.count(int(os.environ.get("RADIXCHAT_SEED", "0")))
_sent = itertools.count(1)
_in_flight = 0
_lock = threading.Lock()


def take_request_slot(environment) -> bool:
    """Count a request against the run's bound. Past it, wait for the requests still in
    flight to finish (so Locust and the server count the same requests), then end the run."""
    global _in_flight
    with _lock:
        granted = MAX_REQUESTS is None or next(_sent) <= MAX_REQUESTS
        _in_flight += granted
    if granted:
        return True
    while _in_flight > 0:
        time.sleep(0.05)  # gevent-patched: yields to the users still streaming
    if environment.runner is not None:
        # from a greenlet of its own: quit() kills the users, and this one is a user
        gevent.spawn(environment.runner.quit)
    return False


def request_done() -> None:
    global _in_flight
    with _lock:
        _in_flight -= 1


def fire(environment, kind: str, name: str, ms: float, exc=None, length: int = 0) -> None:
    environment.events.request.fire(
        request_type=kind, name=name, response_time=ms, response_length=length, exception=exc, context={}
    )


class Conversation:
    """One seed-scenario conversation: a system prompt and 2-4 questions."""

    def __init__(self, rng: random.Random):
        self.system_index = rng.randrange(len(SYSTEMS))
        self.questions = rng.sample(QUESTIONS, rng.randint(2, 4))
        self.messages = [{"role": "system", "content": SYSTEMS[self.system_index]}]
