"""Turn question/answer records into fixed-length token rows for training.

A row is one conversation: an optional system prompt, then question/answer turns on unrelated
subjects until the row is full, then padding. Each row comes with a weight per target token: 1 on
the answer tokens and the end-of-turn token that closes them (what the model is asked to
produce), 0 elsewhere. Token ids are laid out exactly as the chat template in
`train_tokenizer.py` renders them. It does not know about the model or the optimizer.
"""

import random

import numpy as np
from train_tokenizer import ASSISTANT, END, SYSTEM, USER

# Short prompts and no prompt at all, next to the long scenario prompts, so that the answer does
# not depend on which system prompt came first.
SHORT_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant for Python questions.",
    "Answer questions about Python briefly.",
    "You are an expert Python programmer. Be concise.",
    "You help developers with the Python standard library.",
    "Answer in one or two sentences.",
    "You are a friendly coding assistant.",
    "You are a Python documentation assistant.",
    "Be precise and brief.",
    "You are a teaching assistant for an introductory Python course.",
]


class Layout:
    """Token ids of the chat template's pieces for one tokenizer (a `tokenizers.Tokenizer`)."""

    def __init__(self, tok):
        self.tok = tok
        self.role = {r: tok.token_to_id(t) for r, t in (("system", SYSTEM), ("user", USER), ("assistant", ASSISTANT))}
        self.end = tok.token_to_id(END)
        self.newline = tok.encode("\n").ids

    def turn(self, role, content):
        """(ids, weights) of "<|role|>\\n{content}<|end|>\\n"."""
        body = self.tok.encode(content).ids
        ids = [self.role[role]] + self.newline + body + [self.end] + self.newline
        train = 1 if role == "assistant" else 0
        # Weights align with ids: 1 on each token the model must produce (predicted from the
        # position before it), so the training loss uses weights[1:] against ids[1:].
        n = len(self.newline)
        weights = [0] * (1 + n) + [train] * (len(body) + 1) + [0] * n
        return ids, weights


def vary(question, rng):
    """Users drop the question mark or the capital; the model should not care."""
    r = rng.random()
    if r < 0.1:
        return question.rstrip("?.")
    if r < 0.2:
        return question[0].lower() + question[1:]
    return question


def rows(records, long_prompts, layout, rng: random.Random, length: int):
    """One epoch: every record once, "core" records three times (the questions the load
    scenarios and tests ask must get their answers right).

    Returns (ids, weights), arrays of shape (rows, length + 1).
    """
    order = list(records) + [r for r in records if r["core"]] * 2
    rng.shuffle(order)
    out_ids, out_w = [], []
    i = 0
    while i < len(order):
        r = rng.random()
        system = rng.choice(long_prompts) if r < 0.35 else rng.choice(SHORT_PROMPTS) if r < 0.8 else None
        ids, w = layout.turn("system", system) if system else ([], [])
        turns = 0
        while i < len(order):
            rec = order[i]
            q_ids, q_w = layout.turn("user", vary(rng.choice(rec["questions"]), rng))
            a_ids, a_w = layout.turn("assistant", rec["answer"])
            if len(ids) + len(q_ids) + len(a_ids) > length + 1:
                if turns == 0:
                    i += 1  # longer than a row on its own: drop it
                break
            ids, w = ids + q_ids + a_ids, w + q_w + a_w
            turns, i = turns + 1, i + 1
        if turns:
            pad = length + 1 - len(ids)
            out_ids.append(ids + [layout.end] * pad)
            out_w.append(w + [0] * pad)
    return np.array(out_ids, dtype=np.int32), np.array(out_w, dtype=np.float32)
