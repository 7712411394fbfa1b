"""The session store: users, API keys, conversations, messages and request metrics in SQLite.

`Store(path)` is safe to share between threads. It is composed of one mixin per topic, each in
its own module, over the connection base they share:

- core.store.connection: `StoreBase`, per-thread connections, `_tx` (WAL, `BEGIN IMMEDIATE` for
  every write, writers taking turns), closing them;
- core.store.accounts: users, passwords, API keys, signing in;
- core.store.conversations: conversations, messages and branches, links, search, deletion;
- core.store.response_ids: the Responses API's random names of kept turns;
- core.store.metrics: request rows, the queued metrics writer thread, `flush`, the dashboard's reads;
- core.store.page_sessions: page sign-ins kept across restarts.

Mixins rather than a Store holding parts and delegating: the topics meet inside one transaction
(a reply and its request row are written together, a request row checks its conversation's
owner, checking an API key queues a note for the writer thread), which a mixin does with a plain
call on `self` and the same `db`; and each public method keeps its one definition, signature and
docstring, where parts would need a forwarding method apiece in this class. The calls one topic
makes into another are declared on `StoreBase`.

This module only puts them together: opening (the writer's state first, since a failed open
closes the store, then the file, then removing what was deleted while no server ran) and closing
(queued metrics written before the connections go). Not here: the schema and migrations
(core.store.schema), hashing (core.store.auth), export and dashboard formatting
(core.store.report), the SQL of branches (core.store.branches), cookies and HTTP (webui). No MLX. Called from any thread; `close` from whoever owns the store, or at exit.
"""

from __future__ import annotations

from pathlib import Path

from radixchat.core.store import auth
from radixchat.core.store.accounts import AccountsMixin
from radixchat.core.store.conversations import ConversationsMixin
from radixchat.core.store.metrics import MetricsMixin
from radixchat.core.store.page_sessions import PageSessionsMixin
from radixchat.core.store.response_ids import ResponseIdsMixin
from radixchat.core.store.types import StoreError


class Store(AccountsMixin, ConversationsMixin, ResponseIdsMixin, MetricsMixin, PageSessionsMixin):
    def __init__(
        self,
        path: str | Path,
        *,
        scrypt: auth.ScryptCost = auth.DEFAULT_SCRYPT,
        timeout_s: float = 30.0,
        synchronous: str = "FULL",
    ):
        """Open (creating, or migrating forward) the database at `path`.

        `scrypt` is the password-hash cost for new hashes; tests pass a cheap one.
        `timeout_s` is how long a write waits for another writer's lock before failing.
        """
        self._scrypt = scrypt
        self._init_writer()
        self._open(path, timeout_s=timeout_s, synchronous=synchronous)
        try:
            self.purge_deleted()  # what was deleted while no server ran is gone for good
        except StoreError:
            self.close()
            raise

    def close(self) -> None:
        """Write what is queued, stop the writer and close every connection. Idempotent."""
        if self._closed:
            return
        self._stop_writer()
        self._close_connections()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
