"""Room in the running batch by what it holds, and preemption when it runs out.

The batch is admitted by the K/V its requests hold now (prompt, tokens generated so far and a
few steps' growth), not by what a whole reply could take, so eleven requests asking for 7,000
tokens each no longer set aside a batch that their replies may never fill. What a row holds
is what the decoding batch's buffers give it: every row is padded to the longest
(`_batch_tokens`, core.cache.batch.layout), so one long conversation among short ones
costs as many rows of its length, and the batch's real buffers, not only its tokens, stay
within the room. Growth is paid for by preemption, as vLLM's scheduler does, in two cases:

- the batch would outgrow its room in the next step (`_room_victims`, before every step);
- a waiting request cannot fit while it is owed room: its owner holds less than a fair
  share of the room (the room split among the owners with work) and another owner holds
  more (`_owed_victims`). A newcomer's short request is then never held behind long
  replies that fill the batch; an owner at their share waits for room as before.

The request preempted is the latest admitted of the owner holding the most K/V (ties: the
most served, core.engine.sched.fairness). It leaves the batch as a finished one does: what it
computed goes into the prefix cache under its owner's scope (and from there to the disk tier
when memory is short), it keeps its place in the fair queue (ahead of its owner's other
requests, by the cache-aware order), and it comes back with its prompt and the tokens it
generated as its new prompt, so the prefill restores nearly all of it. Its stream pauses and
goes on: the client sees nothing but the gap; its sampler, grammar state and stop matching
are kept, so greedy text is the text it would have had. One request alone is never preempted.

The policies return the rows they would preempt; the engine's turn (core.engine.sched.plan)
preempts them with `_preempt`. A part of `Engine` (a mixin) that runs in the engine thread.
Uses the engine's `_by_uid`,
`_fair`, `kv_budget`, `kv_bytes_per_token`, `prefix`, `scope`, `_gen`, `_leave_batch`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable

from radixchat.core.cache.batch.layout import batch_room, layout_tokens
from radixchat.core.engine.active import Active
from radixchat.core.engine.parts import EngineParts
from radixchat.core.engine.sched.plan import Why

log = logging.getLogger("radixchat.engine")
HEADROOM = 16  # tokens of growth a request is admitted with: steps it runs before any preemption


class Preempt(EngineParts):
    preemptions = 0  # requests sent back to the queue to make room (vLLM's num_preemptions)
    preempted_tokens = 0  # tokens they held, which their resumption restores or recomputes

    def batch_room(self) -> int:
        return batch_room(self.kv_budget)

    def _held(self, a: Active) -> int:
        """Tokens of K/V `a` holds in the batch (or will, once admitted)."""
        return len(a.prompt) + a.generated

    def _batch_tokens(self, rows: list[Active], growth: int) -> int:
        """Token slots the decoding batch's buffers take for `rows`, each `growth` tokens on."""
        return layout_tokens(len(rows), max((self._held(a) for a in rows), default=0) + growth)

    def _row_size(self, a: Active) -> int:
        """Tokens `a`'s row is admitted with: what it holds and a few steps' growth."""
        return self._held(a) + HEADROOM

    def _cost(self, rows: int, longest: int) -> int:
        """K/V bytes the batch sets aside for `rows` rows, the longest of `longest` tokens
        (admission's measure, with `_row_size`)."""
        return layout_tokens(rows, longest) * self.kv_bytes_per_token

    def _growth(self) -> int:
        """Tokens one step adds to a row: one, or one and its drafts."""
        spec = self._gen.speculator if self._gen is not None else None
        return 1 + (spec.k if spec is not None else 0)

    def _room_victims(self) -> list[Active]:
        """The rows to preempt so that the next step's growth fits the room (engine thread,
        before a step); the caller preempts them (core.engine.sched.plan)."""
        bpt = self.kv_bytes_per_token
        if not bpt or len(self._by_uid) < 2:
            return []
        room = self.batch_room() // bpt
        rows = list(self._by_uid.values())
        growth = self._growth()
        victims = []
        while self._batch_tokens(rows, growth) > room and len(rows) > 1:
            victim = self._victim(rows)
            if victim is None:
                break
            rows.remove(victim)
            victims.append(victim)
        return victims

    def _owed_victims(self) -> list[Active]:
        """The rows to preempt for the first waiting request of an owner below their fair
        share of the room, when it does not fit and another owner is above theirs."""
        bpt = self.kv_bytes_per_token
        head = self._fair.head()
        if not bpt or head is None or not self._by_uid:
            return []
        room = self.batch_room() // bpt
        rows = list(self._by_uid.values())
        held: Counter[Hashable] = Counter()
        for a in rows:
            held[a.owner] += self._row_size(a)
        share = room // max(1, len(self._fair.load))
        want = self._row_size(head)
        if held[head.owner] + want > share:
            return []  # at their share: they wait for room like anyone
        victims = []
        while self._batch_tokens([*rows, head], HEADROOM) > room:
            over = [a for a in rows if a.owner != head.owner and held[a.owner] > share]
            victim = self._victim(over)
            if victim is None:
                break
            held[victim.owner] -= self._row_size(victim)
            rows.remove(victim)
            victims.append(victim)
        return victims

    def _victim(self, rows: list[Active]) -> Active | None:
        """The latest admitted decoding request of the owner holding the most K/V."""
        rows = [a for a in rows if a.prefilled and not a.done]
        if not rows:
            return None
        held: Counter[Hashable] = Counter()
        for a in rows:
            held[a.owner] += self._held(a)
        owner = max(held, key=lambda o: (held[o], self._fair.served.get(o, 0.0)))
        return max((a for a in rows if a.owner == owner), key=lambda a: (a.joined, self._held(a)))

    def _preempt(self, victims: list[Active], why: Why) -> None:
        """Send running requests back to the fair queue (preempted by the policy `why`
        names); cache what they computed. They leave
        the generator in one call: each call filters the batch's buffers (a re-lay of every
        layer, after the step in flight), and preemptions come several at a time (a newcomer
        owed room, an owner whose masks outgrow their share)."""
        if not victims:
            return
        for a in victims:
            assert a.uid is not None  # a row of the batch has one
            del self._by_uid[a.uid]  # what the batch holds (the cache's reserve) no longer counts it
        self._leave_batch_all(victims)  # as finished ones leave; the other ranks do the same
        self.preempted_by[why.value] += len(victims)
        for a in victims:
            self._requeue(a, why)

    def _requeue(self, a: Active, why: Why) -> None:
        if self.prefix is not None:
            self.prefix.release(a.match)
            a.match = None
            a.key = self.scope.key(a.tokens, a.shared_len, a.owner)
        rewind = getattr(a.sampler, "rewind", None)
        if rewind is not None:  # the batch sampled its next token ahead: drawn again on resuming
            rewind(a.generated)
        self.preemptions += 1
        self.preempted_tokens += self._held(a)
        a.preempted += 1
        a.uid, a.prefilled = None, False
        self._fair.requeue(a)
        log.info("request %s preempted (%s) after %d tokens; it resumes later", a.handle.id, why.value, a.generated)
