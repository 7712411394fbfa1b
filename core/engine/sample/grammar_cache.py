"""Grammars compiled for a user's earlier requests, copied for the next ones.

A client sends the same schema with every request (an app's response_format, an agent's
tools), and compiling it is the costly part of a constrained request: a 64 KB schema of
heavy `pattern`s took 43 ms of a core on the bundled model (llguidance's check 20 ms, the
matcher 23 ms), where a copy of the compiled matcher (`LLMatcher.deep_copy`) takes 0.02 ms.
Under a flood of such requests those compiles took the cores the engine's step needed.

`CompiledGrammars` keeps the last `size` compiled matchers, each as built and checked
(core.engine.sample.constrain.Constraint), keyed by owner and the grammar's source text, and a
refused source's reason, so a schema sent again is neither compiled nor checked again. Kept
per owner: how long a request takes never tells one user what another sent, and a removed
user's schemas go with them (`forget`). Any thread (the preparation pool); the matchers it
hands out are the engine thread's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from radixchat.core.engine.sample.constrain import Constraint, SchemaError

SIZE = 16  # matchers kept: ~2 MiB each for a 64 KB schema on the bundled model


class CompiledGrammars:
    def __init__(self, size: int = SIZE):
        self.size = size
        self._kept: OrderedDict[tuple[str | None, str], Constraint | str] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def constraint(self, owner: str | None, source: str, build: Callable[[], Constraint]) -> Constraint:
        """A fresh `Constraint` of `source` (a grammar's text as the request gave it), from a
        copy of the one compiled for `owner` before, or `build()`'s; SchemaError as before for
        a source refused before."""
        key = (owner, source)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self.hits += 1
                if isinstance(kept, str):
                    raise SchemaError(kept)
                return kept.copy()
            self.misses += 1
        try:
            built = build()
        except SchemaError as e:
            self._keep(key, str(e))
            raise
        self._keep(key, built.copy())  # before the request's first token moves it on
        return built

    def forget(self, owner: str) -> None:
        """Drop what `owner`'s requests compiled (a removed user's schemas are their text)."""
        with self._lock:
            for key in [k for k in self._kept if k[0] == owner]:
                del self._kept[key]

    def _keep(self, key: tuple[str | None, str], value: Constraint | str) -> None:
        with self._lock:
            self._kept[key] = value
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
