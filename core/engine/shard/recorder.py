"""Rank 0's side of serving sharded over an mlx.launch group: what it tells the other ranks.

Every change rank 0's engine makes to its batch or its prefix cache is recorded as a typed
message (core.engine.shard.ops: `Admit`, `Finish`, `Fail`, `Reserve`, `Forget`) and sent,
before the next step, with the step's flag and rank 0's counters (core.engine.shard.lockstep carries them as JSON); a follower
(core.engine.shard.follower) applies them in the same order. `Recorder` is a part of `Engine`
(a mixin) and runs in the engine thread, except `_fatal`, which the watchdog thread may
call too. With no group (`self._ops is None`) recording costs nothing.

Uses of the engine's fields: `link`, `prefix`, `_by_uid`, `_ops`, `_busy_since`,
`_digested`, `in_step`, `fatal`, `on_fatal`, `_stopping`, `_output`, `_close`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, cast

from radixchat.core.engine.parts import EngineParts
from radixchat.core.engine.shard.lockstep import IDLE_TICK_S, counters, shape_digest
from radixchat.core.engine.shard.ops import Op, to_wire

if TYPE_CHECKING:
    from radixchat.core.engine.shard.lockstep import Link

log = logging.getLogger("radixchat.engine")


def lost(e: BaseException) -> bool:
    """Did a sharded step fail because a rank is gone (rather than inside this process)?"""
    return any(w in str(e).lower() for w in ("peer", "[ring]", "jaccl", "mpi", "socket"))


class Recorder(EngineParts):
    def _record(self, op: Op) -> None:
        """Note a change the other ranks must make before the next step (rank 0)."""
        if self._ops is not None:
            self._ops.append(op)

    def _sync(self, step: bool) -> None:
        """Send the other ranks what changed and whether a step follows; when the engine is
        idle and the tree changed since the last check, compare its shape across ranks."""
        self._busy_since = time.monotonic()
        link = cast("Link", self.link)  # (the engine syncs only when sharded: with a link, and its _ops a list)
        tree = self.prefix.tree if self.prefix is not None else None
        now = counters(tree, len(self._by_uid))
        digest = not step and now != self._digested
        ops, self._ops = cast("list[Op]", self._ops), []
        link.send(
            {
                "ops": [to_wire(op) for op in ops],
                "step": step,
                "state": now,
                "digest": digest,
                "nap": 0 if step else IDLE_TICK_S,
            }
        )
        if digest:
            digests = link.digests(shape_digest(tree, len(self._by_uid)))
            self._digested = now
            self.in_step = len(set(digests)) == 1
            if not self.in_step:
                raise RuntimeError(f"the ranks' prefix caches differ in shape: {digests}")

    def _fatal(self, reason: str) -> None:
        """A sharded server cannot go on (a rank lost or out of step): fail every request
        with `reason`, stop, and let the server exit (any thread: the watchdog's too)."""
        if self.fatal is not None:
            return
        self.fatal = reason
        log.error("radixchat: %s", reason)
        self._stopping = True
        # The engine thread may be stuck in a message or a step for good (a peer that hangs):
        # it will read no more commands, so what is queued fails here too, or its stream
        # would stay open unanswered.
        self._close(reason)
        self._output.send()
        if self.on_fatal is not None:
            self.on_fatal(reason)
