"""The front end's engines by URL (`radixchat serve --engine URL`, repeatable): each URL a
`radixchat worker` (webui/remote/remote_engine.py's RemoteEngine) or a router with workers of one
model behind it (webui/remote/routed_engine.py's RoutedEngine), told apart by what they answer.

`RemoteEngines` is the seam's Engines over them, one model per URL, each serving the model
its workers name (the first URL's the default); `connect_engines` builds it or refuses with
one line (StartError). Left to others: the HTTP to each engine. Threads: none of its own
(each engine has its poller); every method is safe from any thread. No MLX here.
"""

from __future__ import annotations

from typing import Any

from radixchat.core.engine.models import ALIASES
from radixchat.core.seam.protocol import ServedModel
from radixchat.core.seam.requests import RequestError
from radixchat.webui.remote.remote_engine import RemoteEngine, StartError
from radixchat.webui.remote.routed_engine import RoutedEngine, router_workers

Remote = RemoteEngine | RoutedEngine  # one worker, or workers of one model behind a router


class RemoteEngines:
    """The seam's Engines over remote engines, one model each (the first the default)."""

    def __init__(self, engines: list[Remote]):
        self._engines = engines

    @property
    def default(self) -> Remote:
        return self._engines[0]

    def _names(self, i: int, engine: Remote) -> tuple[str, ...]:
        return ALIASES if i == 0 else ()

    def served(self) -> list[ServedModel]:
        return [ServedModel(e.info.model_id, self._names(i, e), True, True) for i, e in enumerate(self._engines)]

    def _find(self, name: str) -> Remote:
        for i, e in enumerate(self._engines):
            if name == e.info.model_id or name in self._names(i, e):
                return e
        ids = ", ".join(repr(e.info.model_id) for e in self._engines)
        raise RequestError(f"model {name!r} not found; this server serves {ids}", 404, "model_not_found")

    def find(self, name: str) -> ServedModel:
        e = self._find(name)
        return ServedModel(e.info.model_id, self._names(self._engines.index(e), e), True, True)

    def serving(self) -> list[Remote]:
        return list(self._engines)

    def engine(self, name: str) -> Remote:
        return self._find(name)

    async def aengine(self, name: str) -> Remote:
        return self._find(name)

    def forget(self, owner: str) -> None:
        for e in self._engines:
            e.forget(owner)

    def forget_conversation(self, owner: str | None, messages: list[dict[str, Any]]) -> None:
        for e in self._engines:
            e.forget_conversation(owner, messages)

    def memory_bound(self) -> None:
        return None  # the engines' memory is their workers' processes', not this one's

    def halt(self) -> None:
        for e in self._engines:
            e.halt()

    @property
    def fatal(self) -> str | None:
        return None  # a worker that stops is waited for (its requests fail), never fatal here

    def stop(self) -> None:
        for e in self._engines:
            e.stop()


def connect_engine(url: str, key: str | None) -> Remote:
    """The worker at `url`, or the workers behind the router there (a router answers 404 to
    a worker's /engine/info and lists its workers); StartError (one line) when neither."""
    try:
        return RemoteEngine.connect(url, key)
    except StartError as e:
        if e.status != 404:
            raise
        workers = router_workers(url.rstrip("/"), key)
        if workers is None:
            raise
    return RoutedEngine.connect_router(url, key, workers)


def connect_engines(urls: list[str], key: str | None) -> RemoteEngines:
    """The engines at `urls`, each asked what it serves; StartError (one line) for one that
    cannot serve, or two that serve the same model (put a router in front of those)."""
    engines: list[Remote] = []
    try:
        for url in urls:
            e = connect_engine(url, key)
            engines.append(e)
            twin = next((o for o in engines[:-1] if o.info.model_id == e.info.model_id), None)
            if twin is not None:
                raise StartError(
                    f"{twin.url} and {e.url} both serve {e.info.model_id!r}: put a router in front of "
                    "workers of one model (smg: see docs/DEPLOY.md) and give its URL once"
                )
    except StartError:
        for e in engines:
            e.stop()
        raise
    return RemoteEngines(engines)
