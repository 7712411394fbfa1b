"""Response ids: the names the Responses API gives kept turns, and the turn each one names.

An id a client sees must tell nothing of the server: not how many conversations or messages
it holds, not how fast they grow. So a kept response's id is random (the API makes it,
webui/api/responses.py) and this table maps it to the turn's user message; the message's
conversation and owner come with it. `name_turn` keeps a name for a message of the user's;
`named_turn` finds it again for that user only: another user's name, one that was never
kept and one whose conversation is deleted are the same `NotFound`. A name goes with its
message (ON DELETE CASCADE), so with its conversation and its user.

Leaves to others: making the names (webui), the conversations and messages themselves and
the owner check (`_conv`, core.store.conversations), the table (core.store.schema). Called
from the API's worker threads, each on its own connection.
"""

from __future__ import annotations

from radixchat.core.store.connection import StoreBase
from radixchat.core.store.types import Invalid, NotFound, User, as_id, user_id

MAX_NAME_CHARS = 100


def _usable(name) -> bool:
    # anything else can name no kept turn (and a lone surrogate could not even be bound)
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS and name.isascii() and name.isprintable()


class ResponseIdsMixin(StoreBase):
    """Names of kept turns (see the module docstring)."""

    def name_turn(self, user: User | int, conv_id: int, message_id: int, name: str) -> None:
        """Keep `name` for the user message `message_id` of the user's conversation `conv_id`.
        NotFound if it is not theirs or not a user message of that conversation."""
        if not _usable(name):
            raise Invalid(f"a response name is 1-{MAX_NAME_CHARS} printable ASCII characters")
        uid = user_id(user)
        mid = as_id(message_id, "message")
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            found = db.execute(
                "SELECT 1 FROM messages WHERE id = ? AND conversation = ? AND role = 'user'", [mid, conv.id]
            ).fetchone()
            if found is None:
                raise NotFound(f"message {mid} not found")
            db["response_ids"].insert({"id": name, "message": mid})

    def named_turn(self, user: User | int, name: str) -> tuple[int, int]:
        """(conversation, message) that `name` names, if the conversation is the user's and
        not deleted; otherwise NotFound, the same for every other case."""
        uid = user_id(user)
        if not _usable(name):
            raise NotFound("response not found")
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT m.conversation, m.id FROM response_ids r"
                " JOIN messages m ON m.id = r.message"
                " JOIN conversations c ON c.id = m.conversation"
                " WHERE r.id = ? AND c.owner = ? AND c.deleted IS NULL",
                [name, uid],
            ).fetchone()
        if row is None:
            raise NotFound("response not found")
        return row[0], row[1]
