"""Page sign-ins kept across restarts: which user a page cookie's token signs in, until when.

Gradio keeps its sign-in tokens in a dict in memory (webui/auth/gate.py's `SessionTokens` stands in
for it), so a server restart signed every page out and lost what people were doing. Each
sign-in is also a row here: a SHA-256 of the token (whoever reads the database cannot sign in
with it), the user, the user's session key when it was opened (core.store.accounts: a password
change or a removal gives the user a new one, which ends every older sign-in here as in
memory) and an expiry, `SESSION_DAYS` after it was opened. Signing out ends every sign-in of the
user (`end_page_sessions`), as Gradio's /logout does in memory. A password changed from a page
sign-in keeps that one sign-in (`keep_only`, in the change's transaction): its row is bound to
the new session key and the user's other rows go.

Leaves to others: the cookie and its token (Gradio), when a row is looked up (webui/auth/gate.py),
the table (core.store.schema). Called from the event loop and Gradio's worker threads, each
on its own connection.
"""

from __future__ import annotations

import hashlib
import time

from radixchat.core.store.connection import StoreBase

SESSION_DAYS = 30


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def keep_only(db, user: int, token: str, key: str) -> bool:
    """Inside the transaction that gave `user` the new session `key`: the kept sign-in of
    `token` (if it is theirs and not expired) is bound to `key`, and every other of theirs
    ends. Whether there was one to keep."""
    kept = db.execute(
        "UPDATE page_sessions SET session_key = ? WHERE token_hash = ? AND user = ? AND expires > ?",
        [key, _hash(token), user, time.time()],
    ).rowcount
    db.execute("DELETE FROM page_sessions WHERE user = ? AND token_hash != ?", [user, _hash(token)])
    return bool(kept)


class PageSessionsMixin(StoreBase):
    """Page sign-ins in the store (see the module docstring)."""

    def open_page_session(self, name: str, token: str, days: float = SESSION_DAYS) -> str | None:
        """Keep `token` as a sign-in of `name` for `days`; the user's session key it is bound
        to (None: no such user, or a disabled one: nothing kept). Expired rows go at the same time."""
        now = time.time()
        with self._tx(write=True) as db:
            # read as `session_key` reads it: a disabled user has none to bind a sign-in to
            sql = "SELECT id, session_key FROM users WHERE name = ? AND disabled IS NULL"
            row = db.execute(sql, [name]).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM page_sessions WHERE expires < ?", [now])
            db.execute(
                "INSERT OR REPLACE INTO page_sessions(token_hash, user, session_key, expires) VALUES (?, ?, ?, ?)",
                [_hash(token), row[0], row[1], now + days * 86400],
            )
        return row[1]

    def page_session(self, token: str) -> tuple[str, str] | None:
        """(user name, session key) that `token` signs in, while it has not expired and the
        key is still the user's; None otherwise."""
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT u.name, s.session_key FROM page_sessions s JOIN users u ON u.id = s.user"
                " WHERE s.token_hash = ? AND s.expires > ? AND u.session_key = s.session_key",
                [_hash(token), time.time()],
            ).fetchone()
        return (row[0], row[1]) if row else None

    def end_page_session(self, token: str) -> None:
        with self._tx(write=True) as db:
            db.execute("DELETE FROM page_sessions WHERE token_hash = ?", [_hash(token)])

    def end_page_sessions(self, name: str) -> None:
        """End every kept sign-in of `name` (signing out ends them all)."""
        with self._tx(write=True) as db:
            db.execute("DELETE FROM page_sessions WHERE user IN (SELECT id FROM users WHERE name = ?)", [name])
