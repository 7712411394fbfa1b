"""The one path of a generating API request through the engine, for chat completions,
completions and responses alike: submit its n choices (all or none), then either wait for
their final events or stream them as server-sent events, and cancel in the engine whatever
the client no longer waits for.

A client that goes away cancels its request, streaming or not: a stream notices when
Starlette's response does (its generator is closed, and `stream` cancels what has not
ended); a whole reply has a watcher on the connection while it waits (without one, clients
that hung up kept their work running and their user's share of --max-user-requests taken).
Each accepted request's end (metrics, its row) is recorded once by a RequestEnd
(webui/request_end.py) hooked on the handle at submit, whether or not the client stays to
read it; the row goes through the store's queued writer, so the engine's output thread that
ends the request never waits for SQLite, and the answer's last event waits for its commit
(webui/api/rows.py). A refusal's row is the error handler's. How a reply is framed is
the caller's (a `Framing`: webui/api/chat.py, webui/api/shapes/responses_shapes.py). Everything
here runs on the server's event loop. No MLX.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from radixchat.core.seam.handle import RequestHandle
from radixchat.core.seam.requests import (
    SEED_MAX,
    Event,
    Failed,
    Finished,
    RequestError,
    Sampling,
    TextDelta,
)
from radixchat.core.store import Store
from radixchat.core.store.types import RequestRecord, User
from radixchat.webui.api import rows
from radixchat.webui.api.errors import ApiError, named_field
from radixchat.webui.api.metrics import Metrics
from radixchat.webui.request_end import RequestEnd

T = TypeVar("T")
log = logging.getLogger("radixchat.api")
CLIENT_GONE = 499  # nginx's "client closed request"; never sent, the connection is gone
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class Ledger:
    """Where one API request's outcome goes: metrics (through RequestEnd) and a row under
    the key's user in the store (none without a store), committed before the answer ends."""

    metrics: Metrics
    store: Store | None
    model: str
    user: User | None
    route: str = "api"  # which API, for the log line and the row
    watch: Callable[[RequestHandle], None] | None = None  # stops it if its user or key is cut off
    ends: list[RequestEnd[Future[bool] | None]] = field(default_factory=list)  # one per submitted choice

    def ended(self, final: Finished | Failed) -> Future[bool] | None:
        u = final.usage
        # one line per request, as it ends (a refusal's is the error handler's)
        ttft = "-" if u.ttft_ms is None else f"{u.ttft_ms / 1e3:.3f}s"
        log.info(
            "%s %s %s %s prompt=%d cached=%d generated=%d ttft=%s total=%.3fs",
            self.route,
            self.user.name if self.user else "-",
            self.model,
            getattr(final, "finish_reason", "failed"),
            u.prompt_tokens,
            u.cached_tokens,
            u.generated_tokens,
            ttft,
            u.total_ms / 1e3,
        )
        return self.row(
            status=200 if isinstance(final, Finished) else 500,
            prompt_tokens=u.prompt_tokens,
            cached_tokens=u.cached_tokens,
            generated_tokens=u.generated_tokens,
            queue_ms=u.queue_ms,
            ttft_ms=u.ttft_ms,
            total_ms=u.total_ms,
            decode_tps=u.decode_tps,
            finish_reason=getattr(final, "finish_reason", None),
            error=getattr(final, "message", None),
        )

    def row(self, **fields: Any) -> Future[bool] | None:
        """A served request's row under the key's user (a refused one's is the error
        handler's: webui/api/rows.py); its future says when it is committed."""
        if self.store is None:
            return None
        user = self.user.id if self.user else None
        try:
            record = RequestRecord(user=user, model=self.model, route=self.route, **fields)
            return self.store.record_request_acked(record)
        except Exception:  # bookkeeping must never break a reply
            log.exception("could not record request metrics")
            return None

    async def committed(self) -> None:
        """Wait until every submitted choice's row is committed: the answer's end waits for it."""
        acks: list[Future[bool] | None] = []
        for end in self.ends:
            try:
                acks.append(await end.wait())
            except Exception:  # logged where it failed; the answer still goes
                pass
        await rows.committed(acks)


Build = Callable[[], Awaitable[RequestHandle]]


async def submit(ledger: Ledger, build: Build) -> RequestHandle:
    """One engine request from `build` (which makes and submits it); a refusal is the
    client's error in OpenAI's shape, recorded."""
    try:
        handle = await build()
    except ValidationError as e:
        first = e.errors()[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        field_ = ".".join(map(str, first["loc"])) or named_field(msg)  # (a check of the whole
        # request names its field itself: "messages: ...")
        named = field_ is None or msg.startswith(f"{field_}: ")  # (the message says where, or nothing can)
        err = ApiError(400, msg if named else f"{field_}: {msg}", code="invalid_value", param=field_)
    except RequestError as e:
        headers = {"Retry-After": "2"} if e.status in (429, 503) else None
        # OpenAI's statuses and types, which clients map to their exceptions: an overflow
        # is a 400 (litellm: ContextWindowExceededError), a busy server a 429 "requests"
        status = 400 if e.code == "context_length_exceeded" else e.status
        type_ = {429: "requests", 503: "server_error"}.get(status, "invalid_request_error")
        message = e.message
        if ledger.route == "messages" and message.startswith("response_format: "):  # (the engine's
            # name of the field; Anthropic's clients send this one)
            message = "output_config.format: " + message.removeprefix("response_format: ")
        param = named_field(message) if status == 400 else None
        err = ApiError(status, message, type_, e.code, param, headers=headers)
    else:
        # hooked before anything is awaited: the end is recorded even if the client
        # leaves before its response starts
        ledger.ends.append(
            RequestEnd(handle, ledger.metrics, lambda final, _text: ledger.ended(final), model=ledger.model)
        )
        if ledger.watch is not None:
            ledger.watch(handle)
        return handle
    err.model = ledger.model
    raise err  # counted on /metrics, logged and stored by the error handler, with the others refused


async def submit_choices(
    ledger: Ledger, n: int, fields: dict[str, Any], build: Callable[[Sampling], Awaitable[RequestHandle]]
) -> list[RequestHandle]:
    """One engine request per choice (n), submitted together: the engine computes their
    shared prompt once (a request waits for another prefilling its prefix) and they decode
    side by side. `fields` are the request's sampling; with a seed, choice i samples with
    seed + i, so the choices differ and the same request gives the same choices again."""
    handles: list[RequestHandle] = []
    for i in range(n):
        mine = dict(fields)
        if mine.get("seed") is not None and i:
            mine["seed"] = (mine["seed"] + i) if mine["seed"] + i <= SEED_MAX else mine["seed"] - i
        try:  # the sampling is checked inside submit: a bad value is its 400
            handles.append(await submit(ledger, lambda: build(Sampling(**mine))))  # noqa: B023
        except BaseException:
            for h in handles:  # all choices or none
                h.cancel()
            raise
    return handles


async def _last_event(handle: RequestHandle) -> Finished | Failed:
    async for ev in handle:  # noqa: B007
        pass
    assert not isinstance(ev, TextDelta)  # a handle's stream ends with its final event
    return ev


async def wait_for_ends(request: Request, handles: list[RequestHandle], ledger: Ledger) -> tuple[list[Finished], bool]:
    """(every handle's final event, whether the client left meanwhile: then the requests were
    cancelled), for a reply sent whole at the end, once their rows are committed; a failed
    request is the reply's 500."""
    watcher = asyncio.create_task(_cancel_when_gone(request, handles))
    try:  # each final event carries its request's whole text
        finals = await asyncio.gather(*(_last_event(h) for h in handles))
    finally:
        watcher.cancel()
        for h in handles:
            h.cancel()  # no-op once finished; frees the slot if this task was cancelled
    await ledger.committed()
    failed = next((ev for ev in finals if isinstance(ev, Failed)), None)
    if failed is not None and failed.theirs:  # the request's own schema
        raise ApiError(400, failed.message, "invalid_request_error", "invalid_schema")
    if failed is not None:
        raise ApiError(500, f"generation failed: {failed.message}", "server_error", "engine_error")
    gone = watcher.done() and not watcher.cancelled() and watcher.result()
    cut = next((h for h, ev in zip(handles, finals) if _cut_by_server(ev)), None)
    if cut is not None and not gone:
        raise _why_cut(cut)
    return cast(list[Finished], finals), gone  # none failed: a Failed was raised above


def _cut_by_server(ev: Finished | Failed) -> bool:
    """Ended as cancelled while its client still waits: the server stopped it (its own stop,
    or the user or key cut off), for "cancelled" is not a finish reason an API client knows."""
    return isinstance(ev, Finished) and ev.finish_reason == "cancelled"


def _why_cut(handle: RequestHandle) -> ApiError:
    if handle.cancelled_because is not None:
        return ApiError(403, handle.cancelled_because, "permission_error", "access_revoked")
    return ApiError(503, STOPPING, "server_error", "server_stopping", headers={"Retry-After": "5"})


STOPPING = "the server stopped before this reply was finished (it is shutting down): send it again"


async def _disconnected(request: Request) -> bool:
    """True once the client disconnects; False at once where the server cannot say (the work
    then runs to its end). Run it as a task beside work that sends nothing until the end, and
    cancel it when the work is done.

    The body is read by then, so the next ASGI message is `http.disconnect`, and waiting on
    `receive` wakes the moment the server sees the close (polling `is_disconnected()` would
    leave each gone request running for up to a poll period). Only one task may wait on
    `receive`: never beside a StreamingResponse, which has its own."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            # anything else breaks the ASGI contract (the body is done); a server that
            # answers at once would make this spin, so it becomes a slow poll instead
            await asyncio.sleep(0.5)
    except Exception:
        log.debug("cannot watch the connection for a disconnect", exc_info=True)
        return False
    return True


async def _cancel_when_gone(request: Request, handles: list[RequestHandle]) -> bool:
    """Cancel `handles` once the client disconnects, and say so (True)."""
    if not await _disconnected(request):
        return False
    for handle in handles:
        handle.cancel()
    return True


async def unless_gone(request: Request, work: Coroutine[Any, Any, T]) -> tuple[T | None, bool]:
    """(`work`'s result, False), or (None, True) when the client disconnected first: the work
    is cancelled then, so what it waits for stops costing anyone (a count's templating still
    in the preparation pool leaves the queue)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done and watcher.result():
            return None, True
        return await task, False
    finally:
        watcher.cancel()
        task.cancel()  # no-op once it is done


class _OpenStreams:
    """How many API streams are under way, for a thread that must wait for them to end: a
    lost rank's stop (webui/cli/main.py) lets the failed streams send their last event, the
    reason, before it signals the server to stop, which would cut a stream still sending."""

    def __init__(self) -> None:
        self._n, self._changed = 0, threading.Condition()

    def opened(self) -> None:
        with self._changed:
            self._n += 1

    def closed(self) -> None:
        with self._changed:
            self._n -= 1
            self._changed.notify_all()

    def wait_ended(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every stream to end; False if some have not."""
        with self._changed:
            return self._changed.wait_for(lambda: self._n == 0, timeout)


OPEN_STREAMS = _OpenStreams()


class Framing(Protocol):
    """How one API frames a streamed reply: each method returns the SSE messages to send."""

    def opening(self) -> list[str]: ...

    def delta(self, i: int, ev: TextDelta) -> list[str]: ...

    def finished(self, i: int, ev: Finished) -> list[str]: ...

    def failed(self, i: int, ev: Failed) -> list[str]: ...

    async def closing(self, finals: list[Finished] | None) -> list[str]:
        """After every choice finished (`finals`, in choice order) or one failed (None)."""
        ...


def stream(handles: list[RequestHandle], framing: Framing, ledger: Ledger) -> StreamingResponse:
    """The choices' events as server-sent events, framed by `framing`."""
    events = _events(handles, framing, ledger)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def _events(handles: list[RequestHandle], framing: Framing, ledger: Ledger) -> AsyncIterator[str]:
    finals: dict[int, Finished | Failed] = {}
    merged: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    async def pump(i: int, h: RequestHandle) -> None:
        async for ev in h.batched():  # a client that fell behind gets what is there in one event
            merged.put_nowait((i, ev))

    OPEN_STREAMS.opened()
    pumps = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        for message in framing.opening():
            yield message
        while len(finals) < len(handles):
            i, ev = await merged.get()
            if isinstance(ev, TextDelta):
                out = framing.delta(i, ev)
            else:
                if _cut_by_server(ev):  # an error event saying why, where a client looks for one
                    ev = Failed(message=_why_cut(handles[i]).message, usage=ev.usage)
                finals[i] = ev
                out = framing.failed(i, ev) if isinstance(ev, Failed) else framing.finished(i, ev)
                if len(finals) == len(handles):
                    await ledger.committed()  # what ends the answer waits for its rows
            for message in out:
                yield message
            if isinstance(ev, Failed):
                break
        whole = [end for i in range(len(handles)) if isinstance(end := finals.get(i), Finished)]
        for message in await framing.closing(whole if len(whole) == len(handles) else None):
            yield message
    finally:
        OPEN_STREAMS.closed()
        for task in pumps:
            task.cancel()
        for i, h in enumerate(handles):
            if i not in finals:  # the client went away, or a sibling failed: stop generating
                h.cancel()
