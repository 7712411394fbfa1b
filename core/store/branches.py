"""A conversation's branches in SQL: the branch in view, each message's versions, where a version's
branch ends.

Messages form a tree (schema V6): each follows its parent, and a conversation's `leaf` is the
last message of the branch in view; a parent's id is always smaller than its children's (it was
written first), so a branch in id order is a branch first to last, and the newest message under
a message is a leaf. Plain functions over a transaction that core.store.Store holds, on a
conversation it has already checked belongs to its user; nothing here opens a database, checks
a user or writes. Every step stays inside the given conversation, so a leaf or parent pointing
elsewhere would show nothing rather than someone else's text. Runs on the caller's thread.
"""

from __future__ import annotations

from sqlite_utils import Database

from radixchat.core.store.types import Branch, Message, NotFound, as_id

COLUMNS = "id, conversation, role, content, created, request, parent"

# the leaf of conversation `c`: the one noted, or its newest message before any was noted
_LEAF = "COALESCE(c.leaf, (SELECT max(id) FROM messages WHERE conversation = c.id))"

# the branch in view, as ids: up from the leaf (the newest message when none was noted yet).
# UNION rather than UNION ALL: a damaged file with a loop in it ends the walk instead of hanging it
_PATH = f"""WITH RECURSIVE path(id) AS (
    SELECT {_LEAF}
    FROM conversations c WHERE c.id = :c
    UNION
    SELECT m.parent FROM messages m JOIN path ON m.id = path.id
    WHERE m.conversation = :c AND m.parent IS NOT NULL)
"""


def path(db: Database, conv_id: int) -> list[Message]:
    """The messages of the branch in view, first to last."""
    rows = db.execute(
        _PATH + f"SELECT {COLUMNS} FROM messages WHERE conversation = :c AND id IN (SELECT id FROM path) ORDER BY id",
        {"c": conv_id},
    )
    return [Message(*r) for r in rows]


def firsts(db: Database, conv_id: int) -> list[Message]:
    """The conversation's first messages: each version of the message every branch begins with."""
    rows = db.execute(
        f"SELECT {COLUMNS} FROM messages WHERE conversation = ? AND parent IS NULL ORDER BY id", [conv_id]
    )
    return [Message(*r) for r in rows]


def branch(db: Database, conv_id: int) -> Branch:
    """The branch in view with each message's versions."""
    messages = path(db, conv_id)
    by_parent: dict[int | None, list[int]] = {}
    # `IS`: the first messages' versions are the conversation's other first messages (NULL parent)
    for mid, parent in db.execute(
        _PATH + "SELECT s.id, s.parent FROM messages s JOIN messages m "
        "ON s.conversation = :c AND s.parent IS m.parent "
        "WHERE m.conversation = :c AND m.id IN (SELECT id FROM path) ORDER BY s.id",
        {"c": conv_id},
    ):
        by_parent.setdefault(parent, []).append(mid)
    return Branch(tuple(messages), {m.id: tuple(by_parent.get(m.parent, [m.id])) for m in messages})


def leaf(db: Database, conv_id: int) -> int | None:
    """The last message of the branch in view; None in a conversation without messages."""
    row = db.execute(f"SELECT {_LEAF} FROM conversations c WHERE c.id = ?", [conv_id]).fetchone()
    return None if row is None else row[0]


def follows(db: Database, conv_id: int, message_id: object | None) -> int | None:
    """What a new message follows: `message_id` (a message of this conversation, else
    NotFound) or, for None, the end of the branch in view."""
    return leaf(db, conv_id) if message_id is None else message(db, conv_id, message_id).id


def message(db: Database, conv_id: int, message_id: object) -> Message:
    """A message of this conversation; NotFound for any other id, the same as for no message."""
    mid = as_id(message_id, "message")
    row = db.execute(f"SELECT {COLUMNS} FROM messages WHERE id = ? AND conversation = ?", [mid, conv_id]).fetchone()
    if row is None:
        raise NotFound(f"message {mid} not found")
    return Message(*row)


def newest_under(db: Database, conv_id: int, message_id: int) -> int:
    """The newest message under `message_id` (itself when it has none): where the branch that
    was last written through it ends."""
    return db.execute(
        """WITH RECURSIVE sub(id) AS (
        SELECT :m UNION
        SELECT m.id FROM messages m JOIN sub ON m.parent = sub.id WHERE m.conversation = :c)
        SELECT max(id) FROM sub""",
        {"m": message_id, "c": conv_id},
    ).fetchone()[0]
