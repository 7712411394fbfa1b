"""The models a server serves, by name: each behind an engine of its own, loaded on its first
request and unloaded when idle.

`ModelSet` holds one slot per model the server was told to serve (`--model`, repeatable):
its id (what `GET /v1/models` lists and a request's `model` names: the model's card name, or
its folder's `_name_or_path`, found without loading it, core.models.catalog.served_id), its
aliases (the name it was given; `default` and `default_model` for the first), and its engine
once loaded. The first model loads at start and is never unloaded: the page and requests
that name `default` use it. Another loads when a request first names it (that request
waits; the other models keep serving) and unloads after `--model-idle-s` with nothing in
flight. Each engine is a core.engine.engine.Engine of its own: its thread and MLX stream,
its prefix tree and its disk tier (whose files are kept per model fingerprint already).
Every loaded model's weights and K/V budget count against one `--memory-bytes`: before a
model loads, idle ones are unloaded, least recently used first, until it fits; when the
others are busy the request gets a 503 saying what it needs and what is free (its weights
are estimated from its files, core.models.model_size, until it has loaded once). A user's
requests count against `--max-user-requests` on every model together (core.engine.sched.owners).
What the web layer sees of it is the seam (core.seam.protocol.Engines).

Left to others: what an engine does (core.engine.engine), making one (the caller's `make`,
webui/cli/main.py's, which sets what the server wants of it), who may use which (webui).
Threads: any caller's (`engine` blocks while its model loads, one load at a time per model;
`aengine` runs that wait in a thread for asyncio callers), and the set's own idle thread
(`radixchat-models`), which stops engines nobody used for a while. No MLX here: a model
loads on its engine's own thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from radixchat.core.config import Settings, kv_budget, memory_budget
from radixchat.core.engine.sched.owners import OwnerCounts
from radixchat.core.platform.memory import process_bound
from radixchat.core.seam.protocol import EngineClient, Engines, Lifecycle, ServedModel
from radixchat.core.seam.requests import RequestError

log = logging.getLogger("radixchat.models")

ALIASES = ("default", "default_model")  # names of the first model, whatever it is


class ServedEngine(EngineClient, Lifecycle, Protocol):
    """A model's engine as the set holds it: the web layer's calls, and its lifecycle."""

    def stop(self, release: bool = False) -> None:
        """Lifecycle's `stop`; with `release`, the model's memory goes back too (an idle
        model unloaded while the server runs: core.engine.engine.Engine.stop)."""
        ...


@dataclass
class _Slot:
    model_id: str
    aliases: tuple[str, ...]
    settings: Settings | None  # what its engine is made with (None: it came made)
    pinned: bool  # never unloaded
    engine: ServedEngine | None = None
    last_used: float = field(default_factory=time.monotonic)  # a request named it, or it had some in flight
    loading: threading.Lock = field(default_factory=threading.Lock)  # one load at a time
    need: int = 0  # bytes of weights (estimated until loaded) and K/V budget: its share of --memory-bytes


class ModelSet:
    """The served models (the seam's `Engines`). `make(settings, owners)` returns a started
    engine serving `settings.model` that counts each user's requests in `owners` (one count
    for every model: `--max-user-requests` holds across them), or raises why it could not."""

    def __init__(self, slots: list[_Slot], make: Callable[..., ServedEngine] | None, idle_s: float, budget: int = 0):
        self._slots, self._make, self.idle_s = slots, make, idle_s
        self.budget = budget  # --memory-bytes (0: no limit)
        self.owners = OwnerCounts()
        self._room = threading.Lock()  # room made for a model and taken by its load together
        self._forgotten: list[str] = []  # owners removed: a model loaded later forgets them too
        self._lock = threading.Lock()  # guards each slot's `engine` and `_forgotten`
        self._stop = threading.Event()
        self._fatal: str | None = None  # a stopped engine's reason for stopping on its own
        self._idle = threading.Thread(target=self._unload_idle, name="radixchat-models", daemon=True)

    @classmethod
    def of(cls, settings: Settings, make: Callable[..., ServedEngine]) -> ModelSet:
        """The models of `settings` (`model` and `extra_models`, or its `models` file); raises
        ValueError (or FileNotFoundError) for a bad file, a name that does not resolve, or a
        name served twice."""
        from radixchat.core.models.catalog import served_id
        from radixchat.core.models.model_size import weights_bytes
        from radixchat.core.models.models_file import specs

        slots: list[_Slot] = []
        seen: dict[str, str] = {}
        for i, spec in enumerate(specs(settings)):
            model_id = spec.model_id or served_id(spec.name)
            # `default` means the first model, also where a later one is called so
            given = (*spec.aliases, spec.name, *(ALIASES if i == 0 else ()))
            aliases = tuple(dict.fromkeys(n for n in given if n != model_id and (i == 0 or n not in ALIASES)))
            for n in (model_id, *aliases):
                if n in seen:
                    raise ValueError(f"model {spec.name!r}: {n!r} already names model {seen[n]!r}")
                seen[n] = spec.name
            own = settings.model_copy(update={"model": spec.name, **spec.overrides})
            need = weights_bytes(spec.name, own.dtype) + kv_budget(own)
            slots.append(_Slot(model_id, aliases, own, pinned=i == 0 or spec.pinned, need=need))
        return cls(slots, make, settings.model_idle_s, memory_budget(settings))

    @classmethod
    def one(cls, engine: ServedEngine) -> ModelSet:
        """One engine, already started, as the only model (tests, and servers of one model)."""
        slot = _Slot(engine.info.model_id, ALIASES, None, pinned=True, engine=engine)
        return cls([slot], None, 0.0)

    def start(self) -> ModelSet:
        """Load the first model (blocking; raises what its engine raised) and watch for idle ones."""
        first = self._slots[0]
        if first.engine is None:
            if self.budget and first.need > self.budget:  # served anyway: it is the one asked for first
                log.warning(
                    "model %s needs %s, more than --memory-bytes %s", first.model_id, _gb(first.need), _gb(self.budget)
                )
            assert self._make is not None  # a set of slots not yet loaded comes from `of`, with `make`
            first.engine = self._make(first.settings, self.owners)
            self._measured(first)
        if len(self._slots) > 1 and self.idle_s > 0:
            self._idle.start()
        return self

    def stop(self) -> None:
        """Stop every engine (what they had in flight fails) and the idle thread."""
        self._stop.set()
        for slot in self._slots:
            with self._lock:
                engine, slot.engine = slot.engine, None
            if engine is not None:
                engine.stop()
                self._fatal = self._fatal or engine.fatal  # the server reports it after the stop

    def halt(self) -> None:
        """The server is stopping: no model loads any more, and every loaded engine stops, what
        it had in flight ending as cancelled. The stopped engines stay in their slots, so a call
        that comes meanwhile gets the engine's own refusal, not a missing model; `stop` follows."""
        self._stop.set()
        for engine in self.serving():
            engine.halt()

    @property
    def fatal(self) -> str | None:
        """The first loaded engine's reason for stopping on its own, if one did."""
        return self._fatal or next((e.fatal for e in self.serving() if e.fatal), None)

    # ---- what the web layer asks ---------------------------------------------------------

    @property
    def default(self) -> EngineClient:
        """The first model's engine (always loaded)."""
        # (`start` loaded it, and it is pinned: only `stop` takes it out)
        return cast(ServedEngine, self._slots[0].engine)

    def served(self) -> list[ServedModel]:
        return [self.find(s.model_id) for s in self._slots]

    def find(self, name: str) -> ServedModel:
        """The served model `name` names, loaded or not (nothing loads); RequestError 404
        `model_not_found` naming the served ids."""
        s = self._slot(name)
        return ServedModel(s.model_id, s.aliases, s.engine is not None, s.pinned)

    def serving(self) -> list[ServedEngine]:
        """The engines loaded now, with their lifecycle (the web layer sees a Sequence of EngineClient)."""
        with self._lock:
            return [s.engine for s in self._slots if s.engine is not None]

    def memory_bound(self) -> list[tuple[str, int]] | None:
        """This process's bound (core.platform.memory.process_bound): beyond the loaded
        models' weights and K/V budgets, each engine's stated allowance for MLX's arrays, or
        the most MLX has held beyond them if that is more. None before an engine has read
        MLX's memory."""
        stats = [(e.info.weights_bytes, e.stats()) for e in self.serving()]
        mem = next((s.memory for _, s in stats if s.memory is not None), None)
        if mem is None:
            return None  # (MLX's counters are the process's: any engine's reading will do)
        weights, kv = sum(w for w, _ in stats), sum(s.kv_budget for _, s in stats)
        allowance = sum(s.memory.beyond for _, s in stats if s.memory is not None)
        return process_bound(weights, kv, max(allowance, mem.peak - weights - kv), mem.cache_limit)

    def engine(self, name: str) -> EngineClient:
        """The engine of the model `name` names (its id or an alias), loaded now if it is not
        (the caller waits). RequestError: 404 `model_not_found` naming the served ids, or 503
        `model_unavailable` when it could not be loaded."""
        slot = self._slot(name)
        slot.last_used = time.monotonic()
        engine = slot.engine  # read once: the idle thread may unload it meanwhile
        if engine is not None:
            return engine
        with slot.loading:
            if slot.engine is None and self._stop.is_set():  # `halt`: no model starts now
                raise RequestError("the server is stopping", 503, "model_unavailable")
            if slot.engine is None:
                with self._room:
                    self._make_room(slot)
                    self._load(slot)
            slot.last_used = time.monotonic()
            # (loaded above or by a load before, under `slot.loading`, which an unload takes too)
            return cast(ServedEngine, slot.engine)

    async def aengine(self, name: str) -> EngineClient:
        slot = self._slot(name)
        engine = slot.engine
        if engine is not None:  # the common case costs no thread
            slot.last_used = time.monotonic()
            return engine
        return await asyncio.to_thread(self.engine, name)

    def forget(self, owner: str) -> None:
        """The seam's `forget`, on every model: those loaded now, and those loaded later."""
        with self._lock:
            self._forgotten.append(owner)
        for engine in self.serving():
            engine.forget(owner)

    def forget_conversation(self, owner: str | None, messages: list[dict[str, Any]]) -> None:
        """The seam's `forget_conversation`, on every loaded model (one not loaded keeps
        nothing in memory; its files were written when it served the conversation, and go
        when it is loaded again only if the user is removed: left for later)."""
        for engine in self.serving():
            engine.forget_conversation(owner, messages)

    # ---- inside ---------------------------------------------------------------------------

    def _slot(self, name: str) -> _Slot:
        for slot in self._slots:
            if name == slot.model_id or name in slot.aliases:
                return slot
        ids = ", ".join(repr(s.model_id) for s in self._slots)
        raise RequestError(f"model {name!r} not found; this server serves {ids}", 404, "model_not_found")

    def _load(self, slot: _Slot) -> None:
        tic = time.monotonic()
        log.info("loading model %s", slot.model_id)
        assert self._make is not None  # a slot that loads comes from `of`, with `make`
        try:
            engine = self._make(slot.settings, self.owners)
        except Exception as e:
            log.exception("model %s did not load", slot.model_id)
            raise RequestError(
                f"model {slot.model_id!r} could not be loaded ({type(e).__name__}); the other models "
                "are served, and the server's log says why",
                503,
                "model_unavailable",
            ) from None
        if engine.info.model_id not in (
            slot.model_id,
            *slot.aliases,
        ):  # the same bytes once converted under another name
            slot.aliases += (engine.info.model_id,)
        with self._lock:
            forgotten = list(self._forgotten)
            slot.engine = engine
        self._measured(slot)
        for owner in forgotten:
            engine.forget(owner)
        log.info("model %s loaded in %.1f s", slot.model_id, time.monotonic() - tic)

    def _measured(self, slot: _Slot) -> None:
        """Its weights as loaded replace the estimate from its files."""
        assert slot.engine is not None  # (it follows a load)
        weights = slot.engine.info.weights_bytes
        if weights:
            assert slot.settings is not None  # a slot that loads comes from `of`, with its settings
            slot.need = weights + kv_budget(slot.settings)

    def _make_room(self, slot: _Slot) -> None:
        """Unload idle models, least recently used first, until `slot` fits the budget;
        RequestError 503 saying what it needs and what is free when it cannot."""
        while self.budget:
            with self._lock:
                loaded = [(s, s.engine) for s in self._slots if s.engine is not None]
            free = self.budget - sum(s.need for s, _ in loaded)
            if slot.need <= free:
                return
            idle = [s for s, engine in loaded if not s.pinned and not engine.stats().inflight]
            if not idle:
                raise RequestError(
                    f"model {slot.model_id!r} needs {_gb(slot.need)} of memory (weights and K/V); "
                    f"{_gb(max(0, free))} of the server's {_gb(self.budget)} (--memory-bytes) is free, "
                    "and the models holding the rest are in use: retry later",
                    503,
                    "model_unavailable",
                )
            self._unload(min(idle, key=lambda s: s.last_used), idle_s=-1.0)

    def _unload_idle(self) -> None:
        every = min(5.0, max(0.05, self.idle_s / 4))
        while not self._stop.wait(every):
            now = time.monotonic()
            for slot in self._slots:
                engine = slot.engine
                if engine is None or slot.pinned:
                    continue
                try:
                    if engine.stats().inflight:
                        slot.last_used = now  # busy: idle counts from its last request's end
                    elif now - slot.last_used > self.idle_s:
                        self._unload(slot)
                except Exception:  # one model's trouble must not stop the others' unloading
                    log.exception("model %s: idle check failed", slot.model_id)

    def _unload(self, slot: _Slot, idle_s: float | None = None) -> None:
        """Unload `slot`'s model if nothing is in flight and it has been idle for `idle_s`
        (--model-idle-s unless said; less than 0 to make room now)."""
        idle_s = self.idle_s if idle_s is None else idle_s
        with slot.loading:  # not while a request loads it again
            with self._lock:
                engine = slot.engine
                if engine is None or engine.stats().inflight or time.monotonic() - slot.last_used <= idle_s:
                    return
                slot.engine = None
            engine.stop(release=True)  # its thread lets go of the model and gives the memory back
            log.info("model %s unloaded (idle %.0f s)", slot.model_id, time.monotonic() - slot.last_used)


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def as_engines(served: Engines | EngineClient) -> Engines:
    """`served` as a set of models: itself, or one engine as a set of one."""
    # (a set made here is the web layer's `Engines` only: nothing calls its lifecycle, so one
    # engine without it, a test's, does as well)
    return served if isinstance(served, Engines) else ModelSet.one(cast(ServedEngine, served))
