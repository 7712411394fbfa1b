"""Conversations: their rows, their messages and branches, read-only links, search, and deletion
with undo.

Isolation: every read or change of a conversation or message takes the requesting user, and a
conversation of someone else is `NotFound`, exactly like one that does not exist (`_conv`, which
core.store.metrics also asks before a request row may point at a conversation). A deleted
conversation (`mark_deleted`, the page's "Delete" with its undo) is `NotFound` to every read too,
its owner's included, until `undelete_conversation` brings it back within `DELETED_KEPT_S`; past
that `purge_deleted` (run on each delete and when the store opens) removes it.
Search (`search_conversations`) reads FTS5 indexes of titles and messages that triggers keep in
step (core.store.schema); it joins them to conversations and filters on the owner in SQL. It
indexes every message, of every branch. A conversation's messages are a tree (an edited message
or another answer is a sibling, `edit_message`, `append_reply(parent=)`); every read of messages
(history, prompt, exports, a shared link) follows the branch in view, and `show_version` changes
which one that is. A conversation's `model` (`set_conversation_model`; None: the server's first) is
kept as given: whether the server still serves it is the web layer's to check.

Leaves to others: the SQL of branches (core.store.branches), a reply's request row
(`_insert_request`, core.store.metrics, written in the reply's own transaction so both or
neither are kept), export formatting (core.store.report), who is signed in (webui). Called from
HTTP handlers and the page's workers, each thread on its own connection.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlite_utils import Database

from radixchat.core.store import branches
from radixchat.core.store import report as store_report
from radixchat.core.store.connection import StoreBase
from radixchat.core.store.types import (
    DEFAULT_TITLE,
    MAX_LIST,
    MAX_MESSAGE_CHARS,
    MAX_SYSTEM_PROMPT_CHARS,
    MAX_TITLE_CHARS,
    ROLES,
    Branch,
    Conversation,
    Invalid,
    Message,
    NotFound,
    RequestRecord,
    SearchHit,
    User,
    as_id,
    check_text,
    clean_model,
    clean_title,
    user_id,
)

DELETED_KEPT_S = 60.0  # how long a deleted conversation can be brought back (the page's undo)

MAX_SEARCH_CHARS = 1_000
MAX_SEARCH_WORDS = 16
SNIPPET_TOKENS = 12  # about how many words of the matching text a search hit shows
# the words of a query as FTS5's unicode61 tokenizer sees them: letters and digits
_WORD = re.compile(r"[^\W_]+")

_CONV_COLUMNS = "SELECT id, owner, title, system_prompt, created, updated, archived, model FROM conversations"
_CONV_FIELDS = 8  # the columns above: a Conversation

# Both indexes, each joined to its conversation and filtered by owner; per conversation its best
# hit (bm25: lower is better; a title hit counts double) and that hit's snippet.
_SEARCH = f"""
    WITH hits AS (
        SELECT c.id AS conv, 2 * bm25(titles_fts) AS score,
               snippet(titles_fts, 0, '', '', '…', {SNIPPET_TOKENS}) AS snip
        FROM titles_fts JOIN conversations c ON c.id = titles_fts.rowid
        WHERE titles_fts MATCH :q AND c.owner = :uid
        UNION ALL
        SELECT c.id, bm25(messages_fts), snippet(messages_fts, 0, '', '', '…', {SNIPPET_TOKENS})
        FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
        JOIN conversations c ON c.id = m.conversation
        WHERE messages_fts MATCH :q AND c.owner = :uid),
    best AS (SELECT conv, min(score) AS score, snip FROM hits GROUP BY conv)
    SELECT c.id, c.owner, c.title, c.system_prompt, c.created, c.updated, c.archived, c.model, best.snip
    FROM best JOIN conversations c ON c.id = best.conv AND c.owner = :uid AND c.deleted IS NULL
    ORDER BY best.score, c.updated DESC, c.id DESC LIMIT :limit"""


def fts_query(text: str) -> str:
    """A user's search as an FTS5 query of its words, each a quoted prefix ("word"*): every
    word must occur, and nothing typed is read as FTS5 syntax. "" when it has no words."""
    words = _WORD.findall(text)[:MAX_SEARCH_WORDS]
    return " ".join(f'"{w}"*' for w in words)


def _check_message(role: str, content: str) -> None:
    if role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    # a reply may be empty (stopped at once); what a person sends may not
    check_text(content, f"{role} message", MAX_MESSAGE_CHARS, allow_empty=role == "assistant")


def _user_exists(db: Database, uid: int) -> bool:
    return db.execute("SELECT 1 FROM users WHERE id = ?", [uid]).fetchone() is not None


def _new_conversation(db: Database, uid: int, title: str, system_prompt: str, now: float, model: str | None) -> int:
    if not _user_exists(db, uid):
        raise NotFound(f"user {uid} not found")
    row = {"owner": uid, "title": title, "system_prompt": system_prompt, "created": now, "updated": now, "model": model}
    return db["conversations"].insert(row).last_pk


def _purge(db: Database, before: float) -> int:
    # SQL for the count: sqlite-utils' delete_where() does not say how many rows went
    return db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL AND deleted < ?", [before]).rowcount


def _share_token(db: Database, conv_id: int) -> str | None:
    row = db.execute("SELECT token FROM shares WHERE conversation = ?", [conv_id]).fetchone()
    return row[0] if row else None


class ConversationsMixin(StoreBase):
    """Conversations, messages, branches, links, search and deletion (see the module docstring)."""

    # ---- conversations ----

    def _conv(self, db: Database, uid: int, conv_id: Any) -> Conversation:
        """The conversation if `uid` owns it; otherwise NotFound, with no hint that it exists."""
        cid = as_id(conv_id, "conversation")
        row = db.execute(_CONV_COLUMNS + " WHERE id = ? AND owner = ? AND deleted IS NULL", [cid, uid]).fetchone()
        if row is None:
            raise NotFound(f"conversation {cid} not found")
        return Conversation(*row)

    def create_conversation(
        self, user: User | int, title: str | None = None, system_prompt: str = "", *, model: str | None = None
    ) -> Conversation:
        uid = user_id(user)
        title = DEFAULT_TITLE if title is None else clean_title(title)
        check_text(system_prompt, "system prompt", MAX_SYSTEM_PROMPT_CHARS, allow_empty=True)
        model = clean_model(model)
        now = time.time()
        with self._tx(write=True) as db:
            cid = _new_conversation(db, uid, title, system_prompt, now, model)
        return Conversation(cid, uid, title, system_prompt, now, now, None, model)

    def get_conversation(self, user: User | int, conv_id: int) -> Conversation:
        with self._tx(write=False) as db:
            return self._conv(db, user_id(user), conv_id)

    def list_conversations(
        self,
        user: User | int,
        *,
        archived: bool | None = False,
        search: str | None = None,
        limit: int = 200,
        offset: int = 0,
        with_messages: bool = False,
    ) -> list[Conversation]:
        """Most recently updated first. archived: False = active only, True = archived only,
        None = both. `search` matches anywhere in the title, ignoring ASCII case.
        `with_messages`: only those with a message (a chat whose first message was refused
        stays empty, and is no chat to list)."""
        sql, args = _CONV_COLUMNS + " WHERE owner = ? AND deleted IS NULL", [user_id(user)]
        if with_messages:
            sql += " AND leaf IS NOT NULL"
        if archived is not None:
            sql += " AND archived IS NOT NULL" if archived else " AND archived IS NULL"
        if search:
            check_text(search, "search", MAX_TITLE_CHARS)
            sql += " AND title LIKE ? ESCAPE '\\'"
            args.append("%" + re.sub(r"([\\%_])", r"\\\1", search) + "%")
        sql += " ORDER BY updated DESC, id DESC LIMIT ? OFFSET ?"
        args += [max(0, min(int(limit), MAX_LIST)), max(0, int(offset))]
        with self._tx(write=False) as db:
            return [Conversation(*r) for r in db.execute(sql, args)]

    def search_conversations(self, user: User | int, query: str, limit: int = 50) -> list[SearchHit]:
        """The user's conversations, open and archived, whose title, or one of whose messages,
        holds every word of `query` (a word also as the start of a longer one; case and accents
        aside),
        best match first, each with a short snippet of the text that matched. The query is
        words only: FTS5's syntax (quotes, *, AND, -, column:) is taken as text. An empty
        query, or one without words, finds nothing. The owner filter is in the SQL."""
        check_text(query or "", "search", MAX_SEARCH_CHARS, allow_empty=True)
        match = fts_query(query or "")
        if not match:
            return []
        args = {"q": match, "uid": user_id(user), "limit": max(0, min(int(limit), MAX_LIST))}
        with self._tx(write=False) as db:
            return [
                SearchHit(Conversation(*r[:_CONV_FIELDS]), " ".join(r[_CONV_FIELDS].split()))
                for r in db.execute(_SEARCH, args)
            ]

    def _update_conv(
        self, user: User | int, conv_id: int, updates: dict, conversions: dict | None = None
    ) -> Conversation:
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            db["conversations"].update(conv.id, updates, conversions=conversions)
            return self._conv(db, uid, conv.id)

    def rename_conversation(self, user: User | int, conv_id: int, title: str) -> Conversation:
        return self._update_conv(user, conv_id, {"title": clean_title(title)})

    def set_system_prompt(self, user: User | int, conv_id: int, system_prompt: str) -> Conversation:
        check_text(system_prompt, "system prompt", MAX_SYSTEM_PROMPT_CHARS, allow_empty=True)
        return self._update_conv(user, conv_id, {"system_prompt": system_prompt})

    def set_conversation_model(self, user: User | int, conv_id: int, model: str | None) -> Conversation:
        """The model the conversation chats with from its next reply on (None: the server's
        first); owner only. Its messages stay as they are: the next model reads them all."""
        return self._update_conv(user, conv_id, {"model": clean_model(model)})

    def archive_conversation(self, user: User | int, conv_id: int) -> Conversation:
        # COALESCE: archiving twice keeps the first time
        return self._update_conv(user, conv_id, {"archived": time.time()}, {"archived": "COALESCE(archived, ?)"})

    def restore_conversation(self, user: User | int, conv_id: int) -> Conversation:
        return self._update_conv(user, conv_id, {"archived": None})

    def fresh_conversation(
        self, user: User | int, system_prompt: str = "", exclude: Iterable[int] = (), *, model: str | None = None
    ) -> Conversation:
        """A conversation to start a new chat in, with `system_prompt` and `model`: the user's
        newest one that is still untitled and empty (not one in `exclude`), else a new one. In
        one transaction, so two callers never both take the same one unless both may."""
        uid = user_id(user)
        check_text(system_prompt, "system prompt", MAX_SYSTEM_PROMPT_CHARS, allow_empty=True)
        model = clean_model(model)
        skip = sorted({int(i) for i in exclude})[:500]
        now = time.time()
        with self._tx(write=True) as db:
            row = db.execute(
                "SELECT id FROM conversations c WHERE owner = ? AND deleted IS NULL AND title = ? "
                "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation = c.id)"
                + (f" AND id NOT IN ({','.join('?' * len(skip))})" if skip else "")
                + " ORDER BY updated DESC, id DESC LIMIT 1",
                [uid, DEFAULT_TITLE, *skip],
            ).fetchone()
            if row is None:
                cid = _new_conversation(db, uid, DEFAULT_TITLE, system_prompt, now, model)
            else:
                cid = row[0]
                db["conversations"].update(
                    cid, {"system_prompt": system_prompt, "model": model, "updated": now, "archived": None}
                )
            return self._conv(db, uid, cid)

    def set_open_conversation(self, user: User | int, conv_id: int | None) -> None:
        """Note the conversation the user has open (None: none), for `open_conversation`."""
        uid = user_id(user)
        with self._tx(write=True) as db:
            cid = None if conv_id is None else self._conv(db, uid, conv_id).id
            # SQL, not users.update(): with None, a user removed meanwhile is nothing to note
            db.execute("UPDATE users SET open_conversation = ? WHERE id = ?", [cid, uid])

    def open_conversation(self, user: User | int) -> Conversation | None:
        """The conversation the user last had open, if it is still there (not deleted)."""
        uid = user_id(user)
        with self._tx(write=False) as db:
            row = db.execute("SELECT open_conversation FROM users WHERE id = ?", [uid]).fetchone()
            if row is None or row[0] is None:
                return None
            try:
                return self._conv(db, uid, row[0])
            except NotFound:
                return None

    # ---- deletion: at once, or with undo ----

    def delete_conversation(self, user: User | int, conv_id: int) -> None:
        """Deletes it and its messages; its request metrics stay, unlinked."""
        with self._tx(write=True) as db:
            conv = self._conv(db, user_id(user), conv_id)
            db["conversations"].delete(conv.id)

    def mark_deleted(self, user: User | int, conv_id: int) -> Conversation:
        """Delete with undo: the conversation is NotFound to every read from now on, and
        `undelete_conversation` can bring it back for DELETED_KEPT_S; owner only. Removes for
        good what was deleted longer ago than that (anyone's). Returns it as it was."""
        now = time.time()
        with self._tx(write=True) as db:
            conv = self._conv(db, user_id(user), conv_id)
            db["conversations"].update(conv.id, {"deleted": now})
            _purge(db, now - DELETED_KEPT_S)
        return conv

    def undelete_conversation(self, user: User | int, conv_id: int) -> Conversation:
        """Undo `mark_deleted`, by its owner, while it is kept; NotFound otherwise (also for
        a conversation that was never deleted: there is nothing to undo)."""
        uid, cid = user_id(user), as_id(conv_id, "conversation")
        with self._tx(write=True) as db:
            # the WHERE is the check (owner, deleted, still kept): one statement, its rowcount the answer
            if not db.execute(
                "UPDATE conversations SET deleted = NULL WHERE id = ? AND owner = ? "
                "AND deleted IS NOT NULL AND deleted >= ?",
                [cid, uid, time.time() - DELETED_KEPT_S],
            ).rowcount:
                raise NotFound(f"conversation {cid} not found")
            return self._conv(db, uid, cid)

    def purge_deleted(self, older_than_s: float = DELETED_KEPT_S) -> int:
        """Delete for good (messages and links with them) conversations deleted longer than
        `older_than_s` ago; how many went."""
        with self._tx(write=True) as db:
            return _purge(db, time.time() - older_than_s)

    # ---- read-only links (the page's "Share") ----

    def share_conversation(self, user: User | int, conv_id: int) -> str:
        """The token of the conversation's read-only link, made now if it has none; the owner
        only (another user's conversation is NotFound). Sharing again gives the same token
        until `revoke_share`. Unguessable (secrets.token_urlsafe(24), 192 bits) and kept as
        is rather than hashed: the owner must be able to see the same link again, and the file
        that would hold the token already holds the conversation it opens."""
        with self._tx(write=True) as db:
            conv = self._conv(db, user_id(user), conv_id)
            token = _share_token(db, conv.id)
            if token is None:
                token = secrets.token_urlsafe(24)
                db["shares"].insert({"conversation": conv.id, "token": token, "created": time.time()})
            return token

    def share_token(self, user: User | int, conv_id: int) -> str | None:
        """The conversation's live token, or None when it is not shared; owner only."""
        with self._tx(write=False) as db:
            return _share_token(db, self._conv(db, user_id(user), conv_id).id)

    def revoke_share(self, user: User | int, conv_id: int) -> bool:
        """Ends the conversation's link (its token is then NotFound); owner only. True if it
        was shared. Sharing afterwards makes a new token."""
        with self._tx(write=True) as db:
            conv = self._conv(db, user_id(user), conv_id)
            if _share_token(db, conv.id) is None:
                return False
            db["shares"].delete(conv.id)
            return True

    def shared_conversation(self, token: str) -> tuple[str, list[Message]]:
        """(title, messages) of the conversation that `token` opens, for any reader; NotFound,
        the same for each, for a wrong or revoked token and for a conversation since deleted."""
        if not isinstance(token, str) or not token or len(token) > 200:
            raise NotFound("shared conversation not found")
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT c.id, c.title FROM shares s JOIN conversations c ON c.id = s.conversation "
                "WHERE s.token = ? AND c.deleted IS NULL",
                [token],
            ).fetchone()
            if row is None:
                raise NotFound("shared conversation not found")
            return row[1], branches.path(db, row[0])  # the branch in view, as its owner sees it

    # ---- messages ----
    # A conversation is a tree of messages, of which one branch is in view (core.store.branches):
    # appending goes on from its last message, editing or answering again adds a sibling, and
    # each of these makes the new message the branch's end. Reads follow the branch in view.

    @staticmethod
    def _insert_message(
        db: Database,
        conv: Conversation,
        role: str,
        content: str,
        request: int | None,
        now: float,
        parent: int | None,
    ) -> Message:
        row = {
            "conversation": conv.id,
            "role": role,
            "content": content,
            "created": now,
            "request": request,
            "parent": parent,
        }
        mid = db["messages"].insert(row).last_pk
        db["conversations"].update(conv.id, {"updated": now, "leaf": mid})
        return Message(mid, conv.id, role, content, now, request, parent)

    def append_message(
        self,
        user: User | int,
        conv_id: int,
        role: str,
        content: str,
        *,
        request: int | None = None,
        after: int | None = None,
    ) -> Message:
        """Add a message at the end of the branch in view, or after the message `after` of this
        conversation (the end of the branch its caller read: what it follows must not change
        meanwhile), and mark the conversation updated. Committed on return."""
        _check_message(role, content)
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            if (
                request is not None
                and db.execute("SELECT 1 FROM requests WHERE id = ?", [as_id(request, "request")]).fetchone() is None
            ):
                raise NotFound(f"request {request!r} not found")
            return self._insert_message(
                db, conv, role, content, request, time.time(), branches.follows(db, conv.id, after)
            )

    def append_reply(
        self, user: User | int, conv_id: int, content: str, record: RequestRecord, *, parent: int | None = None
    ) -> Message:
        """The assistant's reply and its request metrics, in one transaction: both or neither.
        It answers `parent` (a message of this conversation; None: the end of the branch in
        view); another answer to the same message is a new version of the answer, shown from
        now on."""
        _check_message("assistant", content)
        uid = user_id(user)
        record = replace(record, user=uid, conversation=as_id(conv_id, "conversation"))
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            after = branches.follows(db, conv.id, parent)
            rid = self._insert_request(db, record)
            return self._insert_message(db, conv, "assistant", content, rid, time.time(), after)

    def edit_message(self, user: User | int, conv_id: int, message_id: int, content: str) -> Message:
        """A new version of one of the user's messages: a sibling of it (the same parent), the
        end of the branch in view from now on. The message, and what followed it, stay as they
        were, on their own branch. Only a user message can be edited."""
        _check_message("user", content)
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            old = branches.message(db, conv.id, message_id)
            if old.role != "user":
                raise Invalid("only a message of the user can be edited")
            return self._insert_message(db, conv, "user", content, None, time.time(), old.parent)

    def show_version(self, user: User | int, conv_id: int, message_id: int) -> Branch:
        """Bring a version of a message into view, with the branch last written through it (to
        its newest message): what is shown, and what the model sees next, from now on."""
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            chosen = branches.message(db, conv.id, message_id)
            db["conversations"].update(conv.id, {"leaf": branches.newest_under(db, conv.id, chosen.id)})
            return branches.branch(db, conv.id)

    def history(self, user: User | int, conv_id: int) -> list[Message]:
        """The branch in view, first message to last."""
        with self._tx(write=False) as db:
            return branches.path(db, self._conv(db, user_id(user), conv_id).id)

    def branch(self, user: User | int, conv_id: int) -> Branch:
        """The branch in view with the versions of each of its messages."""
        with self._tx(write=False) as db:
            return branches.branch(db, self._conv(db, user_id(user), conv_id).id)

    def prompt_messages(self, user: User | int, conv_id: int) -> list[dict]:
        """The conversation as chat messages for the engine: its system prompt, then the branch in view."""
        with self._tx(write=False) as db:
            conv = self._conv(db, user_id(user), conv_id)
            messages = branches.path(db, conv.id)
        head = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        return head + [{"role": m.role, "content": m.content} for m in messages]

    def openings(self, user: User | int, conv_id: int) -> list[list[dict]]:
        """How the conversation's prompts to the engine begin: its system prompt, if any,
        with each version of its first message (what the engine forgets of it once deleted)."""
        with self._tx(write=False) as db:
            conv = self._conv(db, user_id(user), conv_id)
            firsts = branches.firsts(db, conv.id)
        head = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        return [[*head, {"role": m.role, "content": m.content}] for m in firsts if m.role == "user"]

    def export_conversation(self, user: User | int, conv_id: int, fmt: str = "json") -> str:
        """The conversation as a JSON document or as Markdown (fmt "json" or "md"): the branch in view."""
        if fmt not in store_report.EXPORT_FORMATS:
            raise Invalid(f"export format must be json or md, not {fmt!r}")
        with self._tx(write=False) as db:
            conv = self._conv(db, user_id(user), conv_id)
            owner = db.execute("SELECT name FROM users WHERE id = ?", [conv.owner]).fetchone()[0]
            msgs = branches.path(db, conv.id)
        render = store_report.export_json if fmt == "json" else store_report.export_markdown
        return render(conv, msgs, owner)
