"""The engine of a rank other than 0 in an mlx.launch group: it does what rank 0's engine did.

A `Follower` loads its shard of the model and builds its prefix cache exactly as rank 0's
`Engine` does (the same start-up, in the same order: a forward there runs collectives), then
waits for rank 0's messages (core.engine.shard.lockstep). Each applies, in rank 0's order:

- `admit`: the requests rank 0 admitted, with their prompts: the same prefix-cache lookups
  (a hit on rank 0 is a hit here: the trees have one shape) and the same insert into the
  generator, so the batch's rows and uids agree;
- `finish`: a request that left the batch: its K/V cached as rank 0 cached it (counting the
  running batch as rank 0 counted it then), its lock released;
- `fail`, `reserve`: a request dropped without caching; the bytes the tree keeps free;
- `forget`: an owner's namespace dropped from the tree, as rank 0 dropped it;

then checks its tree's counters against rank 0's and, when told, steps. Within a step it
caches finished prompts as rank 0 does (`Engine._on_prompt`, the same code at the same
moment) and counts each request's tokens, which are rank 0's (lockstep.share_tokens). It
decides nothing: no sampling that matters, no text, no HTTP, no store.

Runs in its own engine thread; `follow` is what `radixchat serve` runs on such a rank.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from radixchat.core.config import Settings
from radixchat.core.engine.active import Active
from radixchat.core.engine.engine import Engine
from radixchat.core.engine.shard.lockstep import counters, shape_digest
from radixchat.core.engine.shard.ops import Admit, AdmitRow, Fail, Finish, Forget, Op, Reserve, from_wire
from radixchat.core.seam.requests import Sampling

if TYPE_CHECKING:
    from radixchat.core.engine.shard.lockstep import Link
    from radixchat.core.engine.step.generator import Generator
    from radixchat.core.seam.handle import RequestHandle
    from radixchat.core.seam.requests import Event

log = logging.getLogger("radixchat.follower")


class _Quiet:
    """A request handle nobody reads: a follower's requests have no client."""

    def __init__(self, rid: str):
        self.id = rid

    def push(self, event: Event) -> None:
        pass


class Follower(Engine):
    def __init__(self, settings: Settings):
        super().__init__(settings)
        self._ops = None  # a follower records nothing: it is the one that applies
        # uid -> (caches, tokens) of a row the generator ended
        self._finals: dict[int, tuple[list[Any] | None, list[int]]] = {}
        self.exit_code = 0

    def _loop(self) -> None:
        try:
            while True:
                # (a follower runs in a group only: the engine thread joined it before this loop)
                msg = cast("Link", self.link).recv()
                if msg.get("stop"):
                    return
                for op in msg["ops"]:
                    self._apply(from_wire(op))
                tree = self.prefix.tree if self.prefix is not None else None
                mine = counters(tree, len(self._by_uid))
                if mine != msg["state"]:
                    raise RuntimeError(
                        f"out of step with rank 0 (prefix cache counters and running "
                        f"requests): {mine} here, {msg['state']} there"
                    )
                if msg.get("digest"):
                    cast("Link", self.link).digests(shape_digest(tree, len(self._by_uid)))
                if msg["step"]:
                    self._follow_step()
                else:  # rank 0 is idle: sleep rather than spin in the next collective
                    time.sleep(msg["nap"])
        except Exception as e:
            self.exit_code = 1
            log.error("radixchat rank %d: %s: %s: stopping", cast("Link", self.link).rank, type(e).__name__, e)
        finally:
            self._closed = True

    def _apply(self, op: Op) -> None:
        match op:
            case Admit(rows):
                self._admit_as_rank0(rows)
            case Finish(uid, live):
                self._finish_as_rank0(uid, live)
            case Fail(uid):
                self._fail_as_rank0(uid)
            case Reserve(nbytes):
                if self.prefix is not None:
                    self.prefix.reserve(nbytes)
            case Forget(owner, tokens, shared_len):
                self._forget(owner, tokens, shared_len)

    def _admit_as_rank0(self, rows: list[AdmitRow]) -> None:
        news = []
        for row in rows:
            a = Active(
                cast("RequestHandle", _Quiet(f"rank0-{row.uid}")),  # (all the engine uses of one: id, push)
                row.prompt,
                Sampling(ignore_eos=row.ignore_eos),
                row.max_tokens,
                time.perf_counter(),
                boundaries=row.boundaries,
                shared_len=row.shared_len,
                owner=row.owner,
                hurry=row.hurry,
                alone=row.alone,
            )
            if self.prefix is not None:
                a.key = self.scope.key(a.prompt, a.shared_len, a.owner)
            news.append((row.uid, row.cached, a))
        # samplers: None, so the library's argmax; the tokens fed back are rank 0's
        self._insert([a for _, _, a in news], [None] * len(news))
        for uid, cached, a in news:
            if a.cached != cached:
                raise RuntimeError(f"rank 0 restored {cached} cached tokens of request {uid}, this rank {a.cached}")
            if a.uid != uid:
                raise RuntimeError(f"the generator numbered a request {a.uid}, rank 0's {uid}")

    def _finish_as_rank0(self, uid: int, live: int | None) -> None:
        a = self._by_uid[uid]
        final = self._finals.pop(uid, None)
        if final is None:
            # (the generator is made before the loop runs, as Engine._step says)
            final = cast("Generator", self._gen).remove([uid], return_prompt_caches=self.prefix is not None).get(uid)
        if live is not None and final is not None and final[0] is not None:
            self._store(a, final[1], final[0], live=live)
        self._drop(a)

    def _fail_as_rank0(self, uid: int) -> None:
        if self._finals.pop(uid, None) is None:
            cast("Generator", self._gen).remove([uid])  # (as above)
        self._drop(self._by_uid[uid])

    def _drop(self, a: Active) -> None:
        del self._by_uid[cast(int, a.uid)]  # (a row of the batch: it has its uid)
        if self.prefix is not None:
            self.prefix.release(a.match)
            a.match = None

    def _follow_step(self) -> None:
        """One step, as rank 0's; the rows the generator ended wait for rank 0's `finish`."""
        prompt_resps, gen_resps = cast("Generator", self._gen).next()  # (as in _finish_as_rank0)
        self.steps += 1
        self._on_prompt(prompt_resps)
        for r in gen_resps:
            a = self._by_uid.get(r.uid)
            if a is None:
                continue
            a.generated += 1
            if r.finish_reason is not None:
                self._finals[r.uid] = (r.prompt_cache, r.all_tokens)


def follow(settings: Settings) -> int:
    """Serve as a rank other than 0 until rank 0 stops (0) or is lost (1)."""
    engine = Follower(settings)
    try:
        engine.start()
    except Exception as e:
        print(f"radixchat: could not load model {settings.model!r}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    engine._thread.join()
    return engine.exit_code
