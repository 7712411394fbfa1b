"""One request inside the engine (`Active`), its prompt as templated, and the commands
callers put on the engine thread's queue.

An `Active` is made by the caller's side (core.engine.intake) and from then on read and
written by the engine thread, except its stream and what it has to send, which the output
thread (core.engine.output) works on in the engine's order (core.engine.emit). No MLX here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from radixchat.core.cache.radix import Match
from radixchat.core.engine.textstream import TextStream
from radixchat.core.seam.handle import RequestHandle
from radixchat.core.seam.requests import Sampling, TokenLogprob, Usage

if TYPE_CHECKING:
    from radixchat.core.engine.sample.constrain import Constraint


@dataclass
class Active:
    """Engine-thread state of one request."""

    handle: RequestHandle
    prompt: list[int]
    sampling: Sampling
    max_tokens: int
    t_submit: float
    boundaries: list[int]  # message ends inside the prompt (hybrid models only)
    shared_len: int = 0  # the system message's tokens: the part other users may share
    owner: str | None = None  # whose namespace of the prefix cache holds the rest
    key: list[int] | None = None  # the prompt as the prefix cache keys it (core.cache.scope)
    uid: int | None = None
    stream: TextStream | None = None
    error: BaseException | None = None  # set by a guarded sampler
    generated: int = 0
    t_admitted: float | None = None
    t_first: float | None = None
    t_last: float | None = None
    done: bool = False
    prefilled: bool = False  # its prompt is through prefill (and in the prefix cache, if on)
    match: Match | None = None  # the prefix-cache match this request holds a lock on
    cached: int = 0  # prompt tokens restored from the prefix cache
    constraint: Constraint | None = None  # core.engine.sample.constrain.Constraint: the grammar its reply follows
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of every generated token (with `logprobs`)
    unsent: list[TokenLogprob] = field(default_factory=list)  # those not yet attached to a delta
    out: list[int] = field(default_factory=list)  # generated token ids (a resumed request's prompt ends with them)
    hit: int = 0  # tokens restored from the prefix cache at its latest admission
    joined: int = 0  # the engine step of its latest admission (the latest joined is preempted first)
    hurry: bool = False  # its owner had no prompt in prefill when it was admitted
    alone: bool = False  # and no row at all, while others had or joined: its first token from a step of its own
    preempted: int = 0  # times it left the batch to make room (core.engine.sched.preempt)
    sampler: object | None = None  # kept across a preemption: a seeded stream goes on where it was
    penalty: object | None = (
        None  # its penalties, when the batch sampler applies them (core.engine.sample.batch_sampler)
    )

    @property
    def tokens(self) -> list[int]:
        """What its K/V must hold before its next token: the prompt, and after a preemption
        the tokens generated so far as well."""
        return self.prompt + self.out if self.out else self.prompt

    @property
    def tokens_left(self) -> int:
        return self.max_tokens - self.generated

    def usage(self) -> Usage:
        now = time.perf_counter()
        start = self.t_admitted or now
        decode_s = (self.t_last - self.t_first) if self.t_first and self.t_last else 0.0
        return Usage(
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
            generated_tokens=self.generated,
            queue_ms=(start - self.t_submit) * 1e3,
            ttft_ms=(self.t_first - self.t_submit) * 1e3 if self.t_first else None,
            total_ms=(now - self.t_submit) * 1e3,
            decode_tps=(self.generated - 1) / decode_s if decode_s > 0 else 0.0,
        )


@dataclass
class Templated:
    """A chat request's prompt as tokens, with the positions the prefix cache cares about."""

    tokens: list[int]
    boundaries: list[int]  # message ends where snapshots are taken (hybrid models only)
    shared_len: int  # where the system message ends (0 without one)


@dataclass
class Submit:
    """Command: admit a validated, tokenized request."""

    active: Active


@dataclass
class Cancel:
    """Command: stop a request (queued or running) at the next step."""

    rid: str


@dataclass
class Forget:
    """Command: drop `owner`'s namespace from the prefix cache, in memory and on disk, and
    never store anything of theirs again (a removed user's); with `tokens`, only what is
    cached of their prompts that begin with them (a deleted conversation's first turn,
    whose first `shared_len` are its system message)."""

    owner: str
    tokens: tuple[int, ...] | None = None
    shared_len: int = 0


@dataclass
class Wake:
    """Command: nothing; wakes the engine thread so it sees `_stopping`."""


Command = Submit | Cancel | Forget | Wake

FinishReason = Literal["stop", "length", "cancelled"]  # why a request ended, as its Finished says
