"""The SQLite schema of the session store, and its forward migrations.

The schema version is SQLite's `PRAGMA user_version`. `MIGRATIONS[i]` takes a database from
version i to i + 1; a migration, once released, is never edited, only followed by another.
`migrate` runs the missing ones in one `BEGIN IMMEDIATE` transaction, so two processes
opening the same file at once neither both migrate nor see half a schema.
Reading and writing rows is core.store's job; this module only shapes the tables.

Tables are written as SQL rather than with sqlite-utils' `create()` because they need what
it cannot say: ON DELETE actions, CHECK constraints and a case-insensitive unique name.
Times are Unix seconds (REAL): bucketing by minute is then arithmetic.
"""

from __future__ import annotations

import sqlite3
import time

_V1_CHAT = """
CREATE TABLE users (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE,  -- "Alice" and "alice" are one user
    password_hash TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    owner INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    archived REAL  -- when it was archived; NULL while it is active
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    created REAL NOT NULL
);
-- the page's sidebar: one user's active (or archived) chats, most recently updated first
CREATE INDEX conversations_by_owner ON conversations(owner, archived, updated);
-- a conversation's history in order
CREATE INDEX messages_by_conversation ON messages(conversation, id);
"""

_V2_KEYS_AND_METRICS = """
CREATE TABLE api_keys (
    id INTEGER PRIMARY KEY,
    owner INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    key_hash TEXT NOT NULL UNIQUE,  -- sha256 of the whole key; the key itself is never stored
    visible TEXT NOT NULL,          -- its first characters, to tell keys apart in a list
    label TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    last_used REAL,
    revoked REAL                    -- kept, not deleted, so a revoked key says "revoked"
);
CREATE INDEX api_keys_by_owner ON api_keys(owner);
CREATE TABLE requests (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    -- metrics outlive their user and conversation: the dashboard's history stays whole
    user INTEGER REFERENCES users(id) ON DELETE SET NULL,
    conversation INTEGER REFERENCES conversations(id) ON DELETE SET NULL,
    model TEXT NOT NULL DEFAULT '',
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    generated_tokens INTEGER NOT NULL DEFAULT 0,
    queue_ms REAL,
    ttft_ms REAL,
    total_ms REAL,
    decode_tps REAL,
    finish_reason TEXT,
    error TEXT
);
-- the dashboard reads a time window
CREATE INDEX requests_by_time ON requests(created);
CREATE INDEX requests_by_user ON requests(user, created);
-- without it, deleting a conversation would scan every request to null its link
CREATE INDEX requests_by_conversation ON requests(conversation);
ALTER TABLE messages ADD COLUMN request INTEGER REFERENCES requests(id) ON DELETE SET NULL;
"""

# Full-text search over one's own conversations: titles and message texts, each in an
# external-content FTS5 table (the text stays in its own table; the index holds only tokens),
# kept in step by triggers, also when a conversation's deletion cascades to its messages.
# The owner is not in the index: a search joins to conversations and filters on owner in SQL.
# The last two statements index what an older database already holds.
_V3_SEARCH = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE titles_fts USING fts5(
    title, content='conversations', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER titles_fts_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO titles_fts(rowid, title) VALUES (new.id, new.title);
END;
CREATE TRIGGER titles_fts_delete AFTER DELETE ON conversations BEGIN
    INSERT INTO titles_fts(titles_fts, rowid, title) VALUES ('delete', old.id, old.title);
END;
CREATE TRIGGER titles_fts_update AFTER UPDATE OF title ON conversations BEGIN
    INSERT INTO titles_fts(titles_fts, rowid, title) VALUES ('delete', old.id, old.title);
    INSERT INTO titles_fts(rowid, title) VALUES (new.id, new.title);
END;
INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
INSERT INTO titles_fts(titles_fts) VALUES ('rebuild');
"""

# a conversation's read-only link on the LAN (the page's "Share"): at most one live token per
# conversation; "Stop sharing" deletes the row, and deleting the conversation deletes it too.
# The token is kept as is, not hashed, so that sharing again can show the owner the same link.
_V4_SHARES = """
CREATE TABLE shares (
    conversation INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    token TEXT NOT NULL UNIQUE,
    created REAL NOT NULL
);
"""

# the page's sidebar. "Delete" marks a conversation deleted: from then on every read treats it as
# gone (NotFound, never listed, searched or shared), and only its owner may bring it back, within
# a short undo window; past that it is deleted for real (Store.purge_deleted). And each user's
# open conversation, so that a reload or another browser opens it again; it goes NULL with it.
_V5_SIDEBAR = """
ALTER TABLE conversations ADD COLUMN deleted REAL;
ALTER TABLE users ADD COLUMN open_conversation INTEGER REFERENCES conversations(id) ON DELETE SET NULL;
CREATE INDEX conversations_deleted ON conversations(deleted) WHERE deleted IS NOT NULL;
"""

# branches (the page's edit and regenerate): each message follows its parent (NULL for a first
# message); a message edited or answered again gets a sibling, a new child of the same parent.
# A conversation's `leaf` is the last message of the branch in view: what history, the next
# prompt, exports and shared links follow. `leaf` has no REFERENCES on purpose: a message goes
# only with its conversation, and a foreign key there would make every message deleted look
# through all conversations for one pointing at it (readers follow it within its conversation).
# What an older database holds becomes one branch, as the page showed it: a message follows the
# one before it, except that of several replies in a row (answers regenerated until now) each
# follows the message they answer, as siblings; the newest message is the leaf.
_V6_BRANCHES = """
ALTER TABLE messages ADD COLUMN parent INTEGER REFERENCES messages(id) ON DELETE CASCADE;
ALTER TABLE conversations ADD COLUMN leaf INTEGER;
CREATE INDEX messages_by_parent ON messages(parent, conversation);
UPDATE messages SET parent = (
    SELECT p.id FROM messages p
    WHERE p.conversation = messages.conversation AND p.id < messages.id
      AND (messages.role != 'assistant' OR p.role != 'assistant')
    ORDER BY p.id DESC LIMIT 1);
UPDATE conversations SET leaf = (SELECT max(id) FROM messages WHERE conversation = conversations.id);
"""

# identity that outlives no user. `users.id` is reused once the highest one is removed, so
# nothing that must stay one person's may be keyed by it. `cache_key` names a user's private
# namespace in the engine's prefix cache (memory, disk files, restarts): random, set once,
# never reused, never shown to a client. `session_key` is what a page sign-in is bound to: a
# new one on every password change, so the sessions opened before it end (webui/auth/gate.py).
# Removing a user notes their cache key in `removed_users`, which a running server (another
# process than the admin command's) reads to drop that namespace from its cache.
_V7_IDENTITY = """
ALTER TABLE users ADD COLUMN cache_key TEXT;
ALTER TABLE users ADD COLUMN session_key TEXT;
UPDATE users SET cache_key = lower(hex(randomblob(16))), session_key = lower(hex(randomblob(16)));
CREATE UNIQUE INDEX users_by_cache_key ON users(cache_key);
CREATE TABLE removed_users (
    id INTEGER PRIMARY KEY,
    cache_key TEXT NOT NULL,
    removed REAL NOT NULL
);
"""

# the Responses API's ids: random names of kept turns (core.store.response_ids), so an id says
# nothing of how many conversations or messages there are. The ids handed out before named the
# conversation and the user message ("resp_<conversation>_<message>"): each user message gets
# that name here, so a client holding one can still read it back and go on from it.
_V8_RESPONSE_IDS = """
CREATE TABLE response_ids (
    id TEXT PRIMARY KEY,
    message INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX response_ids_by_message ON response_ids(message);
INSERT INTO response_ids(id, message)
    SELECT 'resp_' || conversation || '_' || id, id FROM messages WHERE role = 'user';
"""

# the model a conversation chats with (the page's "Model" picker, when a server serves several):
# a served model's id, or NULL for the server's first model, which is what every conversation
# made before this chatted with. An id the server no longer serves is kept as it is: the page
# falls back to the first model then, and the conversation goes on with the pick if it is back.
_V9_CONVERSATION_MODEL = """
ALTER TABLE conversations ADD COLUMN model TEXT;
"""

# a key marked as a trusted front end's (Open WebUI in front of radixchat, say): requests made
# with it may name their end user in a header, and are then that end user's, a user of its
# own named FRONT/END (webui/api/deps.py). Every key made before is an ordinary one.
_V10_FRONT_END_KEYS = """
ALTER TABLE api_keys ADD COLUMN front_end INTEGER NOT NULL DEFAULT 0;
"""

# a request refused before it generated (a malformed body, a bad key, an unknown model, a busy
# server...) gets a row too: the route it came by, the HTTP status it was answered with, the
# reason's code and the field at fault. Served requests have their route and status 200; rows
# made before this have NULLs there.
_V11_REFUSAL_ROWS = """
ALTER TABLE requests ADD COLUMN route TEXT;
ALTER TABLE requests ADD COLUMN status INTEGER;
ALTER TABLE requests ADD COLUMN reason TEXT;
ALTER TABLE requests ADD COLUMN param TEXT;
"""

# page sign-ins that outlive the process: Gradio's token table was only in memory, so a restart
# signed everyone out. A row names a sign-in by a hash of its cookie's token (the token itself
# is never stored), and holds the user's session key when it was opened: a password change or a
# removal ends it as it ends the sign-ins in memory (core.store.page_sessions).
_V12_PAGE_SESSIONS = """
CREATE TABLE page_sessions (
    token_hash TEXT PRIMARY KEY,
    user INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    session_key TEXT NOT NULL,
    expires REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX page_sessions_by_user ON page_sessions(user);
"""

# accounts run from the page: `admin` may manage the others there (the first user made is one;
# in a database that had users, the earliest made becomes one, so somebody can); `disabled`
# (when, NULL: enabled) keeps a user out of the page and the API without removing what is
# theirs; `request_limit` is a per-user override of --max-user-requests (NULL: the server's).
_V13_ACCOUNT_ROLES = """
ALTER TABLE users ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN disabled REAL;
ALTER TABLE users ADD COLUMN request_limit INTEGER;
UPDATE users SET admin = 1 WHERE id = (SELECT id FROM users ORDER BY created, id LIMIT 1);
"""

# what a user's page settings and unsent drafts are kept under in their browser's storage
# (webui/page/ui/scripts.py, shortcuts.py): they were kept under the user's name, which a new
# user of a removed user's name would have found them by. `browser_key` is random, set once
# and never reused (as `cache_key`, but this one goes to the user's own browser: it only
# names, it opens nothing). Every user of an older database gets one here.
_V14_BROWSER_KEY = """
ALTER TABLE users ADD COLUMN browser_key TEXT;
UPDATE users SET browser_key = lower(hex(randomblob(16)));
CREATE UNIQUE INDEX users_by_browser_key ON users(browser_key);
"""

MIGRATIONS: list[str] = [
    _V1_CHAT,
    _V2_KEYS_AND_METRICS,
    _V3_SEARCH,
    _V4_SHARES,
    _V5_SIDEBAR,
    _V6_BRANCHES,
    _V7_IDENTITY,
    _V8_RESPONSE_IDS,
    _V9_CONVERSATION_MODEL,
    _V10_FRONT_END_KEYS,
    _V11_REFUSAL_ROWS,
    _V12_PAGE_SESSIONS,
    _V13_ACCOUNT_ROLES,
    _V14_BROWSER_KEY,
]
LATEST = len(MIGRATIONS)


def version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def _statements(script: str):
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            yield buf.strip()
            buf = ""
    assert not buf.strip(), f"incomplete statement in migration: {buf!r}"


def _wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch the file to WAL. SQLite answers "database is locked" at once, without its busy
    handler, when another connection is opening or migrating the same new file (several
    threads or processes starting together): wait for it here, as the busy handler would."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def migrate(conn: sqlite3.Connection, target: int = LATEST, timeout_s: float = 30.0) -> tuple[int, int]:
    """Bring `conn`'s database up to `target`; returns (version before, version after).

    `conn` must be in autocommit mode (isolation_level=None). A database newer than `target`
    is left alone and its version returned unchanged: the caller decides whether to refuse.
    """
    # journal_mode cannot change inside a transaction, and sticks to the file once set
    _wal(conn, timeout_s)
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = version(conn)  # read under the write lock: another process may have migrated
        for v in range(before, target):
            # statement by statement: sqlite3's executescript() would commit half-way
            for stmt in _statements(MIGRATIONS[v]):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {v + 1}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return before, max(before, target)
