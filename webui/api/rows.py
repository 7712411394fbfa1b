"""Each API request's row in the store, committed before the client reads its answer's end.

A served request's row is written when it ends (webui/api/generation.py's Ledger); a refused
one's here, by the error handlers (webui/api/errors.py), with the route, the status, the
reason's code and the field at fault. Both go through the store's queued writer
(`record_request_acked`), which commits many rows in one transaction, and both answers wait
(`committed`) for their row's commit before their last byte: a request a client saw answered is
a request stored, even if the server is killed the next moment.

Not stored: requests turned away before they are read, by the refusal throttle (a client
flooding refusals must not become a flood of rows: webui/api/refusals.py) or for a body over
the size limit; /metrics counts those by reason.
Runs on the server's event loop; the commits are the store writer thread's. No MLX.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from fastapi import Request

from radixchat.core.store.types import MAX_MODEL_CHARS, RequestRecord

if TYPE_CHECKING:
    from radixchat.core.store import Store

log = logging.getLogger("radixchat.api")

# how long an answer waits for its row before it goes anyway (the store's own lock timeout is
# the usual bound; a store that cannot write for this long is logged, and the reply is not held)
COMMIT_WAIT_S = 30.0

# the routes' short names, as the log lines and the rows of served requests give them
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
}


def route_of(path: str) -> str:
    return ROUTES.get(path, path)


def refusal(
    request: Request, status: int, reason: str, message: str, param: str | None, model: str | None
) -> Future[bool] | None:
    """Queue a refused API request's row, under its user when its key was good; None when there
    is no store (or the path is not the API's)."""
    store: Store | None = getattr(request.app.state, "store", None)
    path = request.url.path
    if store is None or not path.startswith("/v1/"):
        return None
    user = getattr(request.state, "user", None)  # set by the key check, when it passed
    try:
        record = RequestRecord(
            user=user.id if user is not None else None,
            model=(model or "")[:MAX_MODEL_CHARS],
            route=route_of(path),
            status=status,
            reason=reason,
            param=param,
            error=f"{status}: {message}",
        )
        return store.record_request_acked(record)
    except Exception:  # bookkeeping must never turn a clear 4xx into a 500
        log.exception("could not record a refused request")
        return None


async def committed(acks: Iterable[Future[bool] | None], timeout: float = COMMIT_WAIT_S) -> None:
    """Wait until the rows behind `acks` are committed (or could not be: then say so)."""
    waiting = [asyncio.wrap_future(a) for a in acks if a is not None]
    if not waiting:
        return
    done, late = await asyncio.wait(waiting, timeout=timeout)
    lost = len(late) + sum(1 for f in done if f.exception() is not None or not f.result())
    if lost:
        log.warning("%d request rows not stored before their answer went out", lost)
