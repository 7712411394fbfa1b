"""The messages rank 0 sends the other ranks of an mlx.launch group: each change its engine
made to its batch or its prefix cache, as a typed value (`Op`), and as the JSON
core.engine.shard.lockstep carries (`to_wire`, `from_wire`). Values only: rank 0's recorder
(core.engine.shard.recorder) makes them, a follower (core.engine.shard.follower) applies them.
No thread of its own, no MLX.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class AdmitRow:
    """One request rank 0 admitted: what a follower needs to insert the same row."""

    uid: int
    prompt: list[int]
    shared_len: int
    owner: str | None
    boundaries: list[int]
    cached: int  # prompt tokens rank 0 restored from its prefix cache (a follower checks its own)
    max_tokens: int
    ignore_eos: bool
    hurry: bool = False  # its owner had no prompt in prefill: the generator starts it at once
    alone: bool = False  # nor any row, while others had: its first token from a step of its own


@dataclass(frozen=True)
class Admit:
    rows: list[AdmitRow]


@dataclass(frozen=True)
class Finish:
    """A request left the batch; `live` is the running batch's tokens rank 0 counted as it
    cached the request (None: nothing cached)."""

    uid: int
    live: int | None


@dataclass(frozen=True)
class Fail:
    """A request left the batch without caching anything."""

    uid: int


@dataclass(frozen=True)
class Reserve:
    """The bytes the prefix cache keeps free for the running batch."""

    nbytes: int


@dataclass(frozen=True)
class Forget:
    """An owner's namespace left the prefix cache for good (a removed user's); with `tokens`,
    only their prompts that begin with them (a deleted conversation's)."""

    owner: str
    tokens: tuple[int, ...] | None = None
    shared_len: int = 0


Op = Admit | Finish | Fail | Reserve | Forget
_KINDS = {cls.__name__.lower(): cls for cls in (Admit, Finish, Fail, Reserve, Forget)}


def to_wire(op: Op) -> dict[str, Any]:
    return {"kind": type(op).__name__.lower(), **asdict(op)}


def from_wire(d: dict[str, Any]) -> Op:
    fields = {k: v for k, v in d.items() if k != "kind"}
    cls = _KINDS[d["kind"]]
    if cls is Admit:
        return Admit([AdmitRow(**row) for row in fields["rows"]])
    return cls(**fields)
