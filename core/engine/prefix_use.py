"""How the engine uses the prefix cache and its disk tier (core/cache): the glue, in one place.

`PrefixUse` is a part of `Engine` (a mixin) that runs in the engine thread: it decides
whether a request should wait for another that is prefilling the same long prefix, or its
whole prompt (`_should_wait`), caches a request's tokens under its owner's scope (`_store`),
gives the disk tier its share of each turn (`_disk_turn`: opened at the first, then a
bounded amount of writing and reading back), holds a request's path while its prefix is read
from disk (`_disk_wait`, `_unprefetch`), starts the warm-up of system prompts, and forgets
an owner (`forget`, the seam's method, any thread: a `Forget` command; `_forget` in the
engine thread drops their namespace, in memory and on disk, and keeps them out of the cache
for good; the disk tier adopts, at start-up, only the files of owners `cache_owners` knows)
or a deleted conversation (`forget_conversation`: what is cached below its first turn). The
tree, its K/V and the files are core.cache's; who may share what is core.cache.scope's.

Uses of the engine's fields: `settings`, `loaded`, `prefix`, `scope`, `_active`,
`_by_uid`, `_cmds`, `_disk_first`, `_prefetch`, `_forgotten`, `cache_owners`, `alive`,
`submit`, `_record`, `_inflight`, `_grammars`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from radixchat.core.cache.forget import forget, forget_below
from radixchat.core.cache.prefix_match import common_prefix
from radixchat.core.cache.warm import WARM_OWNER
from radixchat.core.engine.active import Active, Forget, Wake
from radixchat.core.engine.parts import EngineParts
from radixchat.core.engine.sched.admission import MIN_SHARED_PREFIX
from radixchat.core.engine.shard import ops
from radixchat.core.seam.requests import ChatRequest, RequestError

if TYPE_CHECKING:
    from radixchat.core.cache.kv import PrefixStore  # it imports MLX
    from radixchat.core.cache.radix import Node

log = logging.getLogger("radixchat.engine")
WRITES_WAIT_S = 0.5  # the longest the disk tier's writes wait for newcomers' first tokens, at a time


class PrefixUse(EngineParts):
    # when the disk tier's writes began to wait for a newcomer (monotonic s; 0: they do not)
    _writes_waiting_since = 0.0

    def _should_wait(self, a: Active, admitting: list[Active]) -> bool:
        """Should `a` wait for a request that is prefilling a long prefix `a` shares, or
        the whole of `a`'s prompt however short?

        Computing a shared prefix (a system prompt several users send at once) once and
        restoring it beats prefilling it side by side: on a compute-bound device the
        batched prefill costs about the sum of its rows. The wait ends when that request's
        prompt is in the cache (or it ends), at most one prefill later. A prompt someone is
        prefilling whole is an n>1 request's other choices (each its own request) or a
        client sending one twice: prefilled side by side, a flood's n=16 of a 22-token
        prompt made the step that admitted it ~4x the others, the step a newcomer's first
        token waited behind.
        """
        if self.prefix is None:
            return False
        # (with the cache on, every request has its key: Engine._drain_commands)
        head, least = cast("list[int]", a.key)[:-1], self.scope.min_match(a.shared_len)
        others = [b.key for b in admitting] + [
            b.key for b in self._active.values() if b.uid is not None and not b.prefilled and not b.done
        ]
        shared = max((common_prefix(head, k) for k in others), default=0)
        if shared < least:  # a part of someone else's system message: it would be a miss
            return False
        cached = self.prefix.tree.peek(head, least)
        return shared - cached >= MIN_SHARED_PREFIX or shared == len(head) > cached

    def _store(self, a: Active, tokens: list[int], caches: list[Any], live: int | None = None) -> int | None:
        """Cache a request's tokens; returns the running batch's tokens it counted (which a
        sharded rank 0 sends the others: they count theirs at another moment)."""
        if self.prefix is None or a.owner in self._forgotten:  # a removed user's: never again
            return None
        # the running batch shares the budget with the tree, as its buffers lay it out (each
        # row padded to the longest); requests still waiting in the fair queue hold no K/V yet
        if live is None:
            live = self._batch_tokens(list(self._by_uid.values()), 0)
        self.prefix.reserve(live * self.prefix.bytes_per_token)
        if self.prefix.disk is not None:  # its files name the owner, not this process's number
            self.prefix.disk.note_owner(self.scope.tag(a.owner), a.owner)
        key = self.scope.key(list(tokens), a.shared_len, a.owner)
        self.prefix.store(key, caches, by=a.handle.id, keep=a.owner == WARM_OWNER)
        return live

    def _disk_turn(self) -> None:
        """The disk tier's share of an engine turn (engine thread): open it at the first,
        then write and read back a bounded amount (core.cache.disk.tier.DiskTier.tick)."""
        if self._disk_first:
            self._disk_first = False
            if self.settings.cache_disk_bytes > 0:
                from radixchat.core.cache.disk.tier import open_tier

                cmds = self._cmds  # (the disk threads keep this queue, not the engine)
                try:
                    open_tier(
                        self.settings, self.loaded, self.prefix, self.scope, lambda: cmds.put(Wake()), self._adopts
                    )
                except Exception:
                    log.exception("the prefix cache's disk tier did not open: memory tier only")
            self._start_warm_up()
        disk = cast("PrefixStore", self.prefix).disk  # (Engine._schedule comes here with the cache on only)
        if disk is None:
            return
        if disk.tick(write=not self._writes_wait()):
            self._cmds.put(Wake())
        elif not self._by_uid and disk.loading:
            disk.wait_io(0.02)  # nothing decodes: wait for the reader rather than spin

    def _writes_wait(self) -> bool:
        """Do the disk tier's writes wait this turn? While a newcomer's first token is on its
        way (an owner waiting with no row in the batch, or a row admitted alone that has no
        token yet): a turn's writes are the engine thread's work (K/V into a file's bytes:
        10-90 ms a turn under a flood of long prompts on the bundled model), and they came
        between a newcomer's arrival and its step. Never longer than WRITES_WAIT_S at a time,
        so that newcomers arriving without end do not keep everything in memory. (The step in
        flight asks of the requests not yet drained from the command queue: the engine's
        `_newcomer_waiting`.)"""
        busy = {a.owner for a in self._by_uid.values()}
        waiting = any(o not in busy for o in self._fair.owners()) or any(
            a.alone and a.t_first is None for a in self._by_uid.values()
        )
        now = time.monotonic()
        if not waiting:
            self._writes_waiting_since = 0.0
            return False
        if not self._writes_waiting_since:
            self._writes_waiting_since = now
        return now - self._writes_waiting_since < WRITES_WAIT_S

    def _adopts(self, owner: str) -> bool:
        """May the disk tier, opening, adopt a file of `owner` (a name as files keep it: ""
        for --no-auth's one user)? Not a forgotten one's, nor, when the CLI said whose files
        to keep (the store's users when the server started), anyone else's: a user removed
        while no server ran leaves files nobody may read."""
        if owner in self._forgotten:
            return False
        return self.cache_owners is None or owner in ("", WARM_OWNER) or self.cache_owners(owner)

    def forget(self, owner: str) -> None:
        """The seam's `forget` (any thread): the engine thread drops `owner`'s namespace in
        its next turn (`_forget`); what their requests compiled goes now."""
        self._grammars.forget(owner)
        self._cmds.put(Forget(owner))

    def forget_conversation(self, owner: str | None, messages: list[dict[str, Any]]) -> None:
        """The seam's `forget_conversation` (any thread, blocking while the first turn is
        templated): the engine thread drops what is cached below it in its next turn."""
        if self.prefix is None:
            return
        first = self.template(ChatRequest(messages=messages, owner=owner))
        self._cmds.put(Forget(owner or "", tuple(first.tokens), first.shared_len))

    def _forget(self, owner: str, tokens: tuple[int, ...] | None = None, shared_len: int = 0) -> None:
        """Drop `owner`'s namespace from the prefix cache, in memory and on disk, and keep
        whatever their running requests compute out of it; with `tokens`, what is cached of
        their prompts that begin with them, past what other prompts share (engine thread; a
        sharded rank 0 tells the others to do the same)."""
        self._record(ops.Forget(owner, tokens, shared_len))
        if tokens is not None:
            if self.prefix is not None and (self.scope.owns(owner) or self.scope.sharing == "all"):
                key = self.scope.key(list(tokens), shared_len, owner)
                dropped = forget_below(self.prefix.tree, key, shared_len)
                log.info("prefix cache: forgot %d tokens of a deleted conversation", dropped)
            return
        self._forgotten.add(owner)
        if self.prefix is not None and (theirs := self.scope.owns(owner)) is not None:
            dropped = forget(self.prefix.tree, theirs)
            log.info("prefix cache: forgot %d tokens of a removed user", dropped)

    def _disk_wait(self, a: Active) -> bool:
        """Must `a` wait while part of its cached prefix is read back from disk? Its path
        stays locked meanwhile, so neither tier evicts what it waits for."""
        prefix = self.prefix
        if prefix is None or (disk := prefix.disk) is None:
            return False
        # (with the cache on, every request has its key: Engine._drain_commands)
        m = prefix.to_read(cast("list[int]", a.key), self.scope.min_match(a.shared_len))
        if m is None:
            return False
        node = cast("Node", m.node)  # to_read's match ends at a node (its length is 1 or more)
        held = self._prefetch.get(a.handle.id)
        if held is not node:
            prefix.tree.lock(node)
            if held is not None:
                prefix.tree.unlock(held)
            self._prefetch[a.handle.id] = node
        disk.want(m.path)
        return True

    def _unprefetch(self, a: Active) -> None:
        held = self._prefetch.pop(a.handle.id, None)
        if held is not None:
            assert self.prefix is not None  # a held node is the prefix cache's (_disk_wait)
            self.prefix.tree.unlock(held)

    def _start_warm_up(self) -> None:
        """Prefill the system-prompt presets and --warm-prompts in the background, one at a
        time when no user's request is in the engine, as requests of an owner no user can
        be (not stored, not users' metrics)."""
        from radixchat.core.cache.warm import WARM_OWNER, warm_prompts

        s = self.settings
        if s.cache_sharing == "user":  # nothing is shared: a warm prompt would help nobody
            return
        try:
            prompts = warm_prompts(s.warm_prompts, presets=s.warm_presets and s.cache_disk_bytes > 0)
        except (OSError, ValueError) as e:
            log.warning("warm prompts not read: %s", e)
            return

        def run() -> None:
            for text in prompts:
                # users first: each prompt waits for a moment with none of theirs in the
                # engine, so a request right after start-up shares a step with one at most
                while self.alive and self._inflight:
                    time.sleep(0.1)
                try:
                    req = ChatRequest(
                        messages=[{"role": "system", "content": text}, {"role": "user", "content": "Hello"}],
                        sampling={"max_tokens": 1, "temperature": 0.0},
                        owner=WARM_OWNER,
                    )
                    self.submit(req).result()
                except RequestError as e:
                    log.info("warm prompt skipped: %s", e)
                    if not self.alive:
                        return
                except Exception:
                    log.exception("warm prompt failed")

        threading.Thread(target=run, name="radixchat-warm-up", daemon=True).start()
