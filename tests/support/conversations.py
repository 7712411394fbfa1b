"""Many users' multi-turn conversations on a real engine, the prefix-cache tests' workload: an
engine with the prefix cache on or off (`engine_for`), a seeded plan of who asks what under
which system prompt (`conversations`), and running it with every user at once (`run_users`)."""

from __future__ import annotations

import random
import threading
import time

from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.seam.requests import ChatRequest, Finished


def engine_for(model_dir, prefix: bool, **kw) -> Engine:
    return Engine(
        Settings(model=str(model_dir), prefix_cache=prefix, max_batch=8, max_prefill_batch=4, max_tokens=12, **kw)
    ).start(timeout=120)


SYSTEMS = [f"You are assistant {i}. " + " ".join(["Answer about Python lists and dicts."] * (i + 2)) for i in range(4)]
QUESTIONS = [
    "What is a list?",
    "How do dicts work?",
    "Explain generators.",
    "What is a tuple?",
    "Why use sets?",
    "What does yield do?",
]


def conversations(seed: int, users: int, turns: int):
    rng = random.Random(seed)
    return [(rng.randrange(4), [rng.choice(QUESTIONS) for _ in range(turns)]) for _ in range(users)]


def run_users(engine, plan, seed: int) -> dict:
    """Each user holds a multi-turn conversation; users run concurrently, shuffled start."""
    answers, cached = {}, {}
    order = list(range(len(plan)))
    random.Random(seed).shuffle(order)
    barrier = threading.Barrier(len(plan))

    def user(u):
        system, questions = plan[u]
        msgs = [{"role": "system", "content": SYSTEMS[system]}]
        barrier.wait()
        for t, q in enumerate(questions):
            msgs.append({"role": "user", "content": q})
            final = engine.submit(ChatRequest(messages=msgs)).result()
            assert isinstance(final, Finished), final
            answers[u, t] = final.text
            cached[u, t] = final.usage.cached_tokens
            msgs.append({"role": "assistant", "content": final.text})

    threads = [threading.Thread(target=user, args=(u,)) for u in order]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert len(answers) == sum(len(q) for _, q in plan)
    return answers, cached


def wait_disk_idle(eng, timeout: float = 30) -> bool:
    """Until everything the engine's disk tier was given is written and read results are in."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = eng.stats().disk_cache
        if d is not None and d.waiting == d.backlog_bytes == d.deleting == d.reading == 0:
            return True
        time.sleep(0.05)
    return False
