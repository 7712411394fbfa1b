"""Accounts: users, their passwords and API keys, and signing in with either.

Owns the `users` and `api_keys` rows: creating users, setting passwords, listing, removing a
user (their conversations, messages and keys go with them through ON DELETE CASCADE; their
request metrics stay, unlinked), making, listing and revoking keys, and checking a password or
a key. And a user's random identities (schema V7): the cache key that names their prefix
cache namespace (`User.cache_key`; a removed user's is noted in `removed_users` for the running
server to forget, `removed_cache_keys`), and the session key a page sign-in is bound to (a new
one on each password change: `session_key`, `session_current`), and a third (schema V14) that
names what their page keeps in their browser (`browser_key`). And what the page's Admin tab
manages (schema V13): who is an admin (the first account made is, and whoever an admin
or the admin command makes one; the last one cannot stop being one), who is disabled (kept out of
the page and the API, their rows kept), a per-user request limit (`request_limit`: stored
here, carried by each request of theirs to the engine's count of requests in flight), and
each user's usage (`accounts`, read from the request rows). Hashing itself is
core.store.auth; sign-in throttling, sessions and reading keys from HTTP headers are webui's. A key's "last used" is noted through the metrics
writer thread (`_touch_api_key`, core.store.metrics), so checking a key never waits for the
write lock. Called from HTTP handlers, the page's workers and the admin command, each thread on
its own connection.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace

from radixchat.core.store import auth
from radixchat.core.store.connection import StoreBase
from radixchat.core.store.page_sessions import keep_only
from radixchat.core.store.types import (
    MAX_LABEL_CHARS,
    MAX_PASSWORD_CHARS,
    NAME_RULE,
    AccountDisabled,
    AlreadyExists,
    ApiKey,
    AuthFailed,
    Invalid,
    NotFound,
    User,
    as_id,
    check_account_name,
    check_name,
    check_password,
    check_text,
    is_valid_name,
    is_valid_part,
    user_id,
)

MAX_REQUEST_LIMIT = 10_000  # a per-user override of --max-user-requests, at most
# Live (unrevoked) API keys one user may hold: limits that count by key (the refusal throttle)
# would otherwise be a user's times however many keys they mint (40 in 2.3 s from the page)
MAX_LIVE_KEYS = 20
_TOUCH_EVERY_S = 60.0  # how stale a key's last_used may get: saves a write per API call

# a user without a cache key (one an older program added) reads as "", which owner_of refuses:
# their requests fail rather than share one namespace with every such user
_USER_COLUMNS = "SELECT id, name, created, coalesce(cache_key, ''), request_limit FROM users"
_KEY_COLUMNS = (
    "SELECT k.id, k.owner, u.name, k.visible, k.label, k.created, k.last_used, k.revoked, k.front_end = 1 "
    "FROM api_keys k JOIN users u ON u.id = k.owner"
)


@dataclass(frozen=True)
class Account:
    """A user as an admin sees them: their role, state, limit and how much they used."""

    name: str
    created: float
    admin: bool
    disabled: float | None  # when; None: enabled
    request_limit: int | None  # None: the server's --max-user-requests
    requests: int  # request rows ever recorded for them (the page's and the API's)
    tokens: int  # prompt and generated tokens of those requests


class AccountsMixin(StoreBase):
    """Users, passwords and API keys (see the module docstring)."""

    _scrypt: auth.ScryptCost

    # ---- users ----

    def create_user(self, name: str, password: str, *, admin: bool = False, account: bool = True) -> User:
        """A new user; an admin if `admin`, and always the first account made while no user is
        an admin (someone must be). `account=False`: a user nobody signs in as (--no-auth's one
        local user, a front end's end users), never an admin, and no first account either. An
        account's name has no '/': FRONT/USER names a front end's end user, whom only that front
        end's requests make (an account `a/b` took over what front end `a` said of user `b`)."""
        if account:
            check_account_name(name)
        else:
            check_name(name)
        check_password(password)
        taken = "SELECT 1 FROM users WHERE name = ?"
        with self._tx(write=False) as db:  # a quick refusal, before the slow hash
            if db.execute(taken, [name]).fetchone():
                raise AlreadyExists(f"user {name!r} already exists")
        hashed = auth.hash_password(password, self._scrypt)  # slow: not while holding the lock
        now = time.time()
        cache_key = _new_key()
        with self._tx(write=True) as db:
            if db.execute(taken, [name]).fetchone():  # again: someone may have been quicker
                raise AlreadyExists(f"user {name!r} already exists")
            first = account and db.execute("SELECT 1 FROM users WHERE admin = 1 LIMIT 1").fetchone() is None
            row = {"name": name, "password_hash": hashed, "created": now, "cache_key": cache_key}
            row |= {"session_key": _new_key(), "browser_key": _new_key(), "admin": int(account and (admin or first))}
            uid = db["users"].insert(row).last_pk
        return User(uid, name, now, cache_key)

    def authenticate(self, name: str, password: str) -> User:
        """The user if the password is right; otherwise AuthFailed, the same for an unknown
        name as for a wrong password, and taking as long."""
        row = None
        if is_valid_name(name):
            with self._tx(write=False) as db:
                row = db.execute(
                    "SELECT id, name, created, coalesce(cache_key, ''), request_limit, password_hash, disabled"
                    " FROM users WHERE name = ?",
                    [name],
                ).fetchone()
        if not isinstance(password, str) or len(password) > MAX_PASSWORD_CHARS:
            password = ""
        if row is None:
            auth.burn_password_check(password, self._scrypt)
        elif auth.verify_password(password, row[5]):
            if row[6] is not None:  # only who knows the password learns that the account is disabled
                raise AccountDisabled("this account is disabled: an admin can enable it again")
            return User(*row[:5])
        raise AuthFailed("wrong user name or password")

    def set_password(self, name: str, password: str, *, keep: str | None = None) -> bool:
        """Set a user's password; every page session they opened before ends (a new session
        key, so their device cookies stop counting too), except the kept page sign-in whose
        cookie token is `keep` (the one the change was made from), which goes on under the new
        key. Whether that one was kept."""
        check_password(password)
        hashed = auth.hash_password(password, self._scrypt)
        key = _new_key()
        with self._tx(write=True) as db:
            # by name (case aside, as the column collates), not by id: one statement finds and sets
            sql = "UPDATE users SET password_hash = ?, session_key = ? WHERE name = ? RETURNING id"
            row = db.execute(sql, [hashed, key, name]).fetchone()
            if row is None:
                raise NotFound(f"user {name!r} not found")
            return keep is not None and keep_only(db, row[0], keep, key)

    def session_key(self, name: str) -> str | None:
        """The key a page sign-in of `name` is bound to now (None: no such user). A session
        holds on to it and is valid while `session_current` says so."""
        with self._tx(write=False) as db:
            row = db.execute("SELECT session_key FROM users WHERE name = ? AND disabled IS NULL", [name]).fetchone()
        return row[0] if row else None

    def session_current(self, name: str, key: str) -> bool:
        """Is a page session of `name` bound to `key` still valid? Not once the password
        changed, nor once the user was removed (a new user of the same name has another key),
        nor while the user is disabled."""
        with self._tx(write=False) as db:
            sql = "SELECT 1 FROM users WHERE name = ? AND session_key = ? AND disabled IS NULL"
            row = db.execute(sql, [name, key]).fetchone()
        return row is not None

    def browser_key(self, name: str) -> str | None:
        """What `name`'s page keeps their settings and drafts under in a browser (None: no such
        user): random, never another user's, not even a later one of the same name."""
        with self._tx(write=False) as db:
            row = db.execute("SELECT browser_key FROM users WHERE name = ?", [name]).fetchone()
        return row[0] if row else None

    def get_user(self, name: str) -> User:
        with self._tx(write=False) as db:
            row = db.execute(_USER_COLUMNS + " WHERE name = ?", [name]).fetchone()
        if row is None:
            raise NotFound(f"user {name!r} not found")
        return User(*row)

    def get_user_by_id(self, user_id: int) -> User:
        with self._tx(write=False) as db:
            row = db.execute(_USER_COLUMNS + " WHERE id = ?", [as_id(user_id, "user")]).fetchone()
        if row is None:
            raise NotFound(f"user {user_id!r} not found")
        return User(*row)

    def list_users(self) -> list[User]:
        with self._tx(write=False) as db:
            return [User(*r) for r in db.execute(_USER_COLUMNS + " ORDER BY name")]

    def remove_user(self, name: str) -> int:
        """Delete a user with their conversations, messages and keys; their request metrics
        stay, unlinked. Returns how many conversations went with them. (The last admin may
        go: the next account made is then an admin, `create_user`.)"""
        with self._tx(write=True) as db:
            row = db.execute("SELECT id, cache_key FROM users WHERE name = ?", [name]).fetchone()
            if row is None:
                raise NotFound(f"user {name!r} not found")
            n = db["conversations"].count_where("owner = ?", row[:1])
            db["users"].delete(row[0])
            if row[1] is not None:  # for the running server (another process) to drop their cache entries
                db["removed_users"].insert({"cache_key": row[1], "removed": time.time()})
        return n

    def change_own_password(self, name: str, current: str, new: str, *, keep: str | None = None) -> bool:
        """A user's own change: AuthFailed unless `current` is their password; then as
        `set_password` (every page session of theirs ends but the one `keep` names, the one
        asking). Whether that one was kept."""
        check_password(new)  # before the slow check of the current one
        self.authenticate(name, current)
        return self.set_password(name, new, keep=keep)

    def is_admin(self, name: str) -> bool:
        """Whether `name` is an enabled admin (False for anyone else, or no such user)."""
        with self._tx(write=False) as db:
            sql = "SELECT 1 FROM users WHERE name = ? AND admin = 1 AND disabled IS NULL"
            return db.execute(sql, [name]).fetchone() is not None

    def set_admin(self, name: str, admin: bool) -> None:
        """Make `name` an admin, or no longer one. Invalid for the last enabled admin (nobody
        would be left to manage the others, in the page or to undo this there)."""
        with self._tx(write=True) as db:
            row = db.execute("SELECT id, admin FROM users WHERE name = ?", [name]).fetchone()
            if row is None:
                raise NotFound(f"user {name!r} not found")
            if not admin and row[1]:
                sql = "SELECT 1 FROM users WHERE admin = 1 AND disabled IS NULL AND id != ? LIMIT 1"
                if db.execute(sql, [row[0]]).fetchone() is None:
                    raise Invalid(f"{name} is the last admin: make another user an admin first")
            db["users"].update(row[0], {"admin": int(bool(admin))})

    def accounts(self) -> list[Account]:
        """Every user with their role, state, limit and usage, by name."""
        sql = (
            "SELECT u.name, u.created, u.admin = 1, u.disabled, u.request_limit, count(r.id),"
            " coalesce(sum(r.prompt_tokens + r.generated_tokens), 0)"
            " FROM users u LEFT JOIN requests r ON r.user = u.id GROUP BY u.id ORDER BY u.name"
        )
        with self._tx(write=False) as db:
            return [Account(*r) for r in db.execute(sql)]

    def set_disabled(self, name: str, disabled: bool) -> None:
        """Disable or re-enable a user. Disabling ends their page sessions at once (a new
        session key, and no session answers while disabled) and their API keys answer
        nothing until they are enabled again; their chats and keys stay."""
        with self._tx(write=True) as db:
            if disabled:
                sql = "UPDATE users SET disabled = coalesce(disabled, ?), session_key = ? WHERE name = ?"
                args = [time.time(), _new_key(), name]
            else:
                sql, args = "UPDATE users SET disabled = NULL WHERE name = ?", [name]
            if not db.execute(sql, args).rowcount:
                raise NotFound(f"user {name!r} not found")

    def cut_off(self, users: set[int], key_hashes: set[str]) -> tuple[set[int], set[str]]:
        """Of these users and API keys (by `auth.api_key_hash`), those that may no longer
        work: users removed or disabled, keys revoked, removed or of such a user (the server
        stops what they have running: webui/live_requests.py)."""
        ok_users, ok_keys = set(), set()
        with self._tx(write=False) as db:
            for chunk in _chunks(sorted(users)):
                sql = f"SELECT id FROM users WHERE disabled IS NULL AND id IN ({','.join('?' * len(chunk))})"
                ok_users |= {r[0] for r in db.execute(sql, chunk)}
            for chunk in _chunks(sorted(key_hashes)):
                sql = (
                    "SELECT k.key_hash FROM api_keys k JOIN users u ON u.id = k.owner WHERE k.revoked IS NULL"
                    f" AND u.disabled IS NULL AND k.key_hash IN ({','.join('?' * len(chunk))})"
                )
                ok_keys |= {r[0] for r in db.execute(sql, chunk)}
        return users - ok_users, key_hashes - ok_keys

    def set_request_limit(self, name: str, limit: int | None) -> None:
        """How many requests `name` may have waiting or running at once (None: the server's
        --max-user-requests)."""
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_REQUEST_LIMIT
        ):
            raise Invalid(f"a request limit is a whole number from 1 to {MAX_REQUEST_LIMIT}")
        with self._tx(write=True) as db:
            if not db.execute("UPDATE users SET request_limit = ? WHERE name = ?", [limit, name]).rowcount:
                raise NotFound(f"user {name!r} not found")

    def request_limit(self, name: str) -> int | None:
        """`name`'s own request limit (None: the server's, or no such user)."""
        with self._tx(write=False) as db:
            row = db.execute("SELECT request_limit FROM users WHERE name = ?", [name]).fetchone()
        return row[0] if row else None

    def removed_cache_keys(self, after: int = 0) -> list[tuple[int, str]]:
        """(row id, cache key) of the users removed since row `after`, oldest first: a server
        polls it with the last id it has seen."""
        with self._tx(write=False) as db:
            sql = "SELECT id, cache_key FROM removed_users WHERE id > ? ORDER BY id"
            return [(r[0], r[1]) for r in db.execute(sql, [after])]

    # ---- API keys ----

    def create_api_key(self, user: User | int, label: str = "", *, front_end: bool = False) -> tuple[ApiKey, str]:
        """A new key for `user`: (its record, the key). The key is returned only this once.
        `front_end`: a trusted front end's key, whose requests may name their end user."""
        uid = user_id(user)
        label = check_text(label, "label", MAX_LABEL_CHARS, allow_empty=True).strip()
        if not label.isprintable():  # a key's listing is a line a key
            raise Invalid("label: one line of printable text")
        key = auth.new_api_key()
        now = time.time()
        with self._tx(write=True) as db:
            owner = db.execute("SELECT name FROM users WHERE id = ?", [uid]).fetchone()
            if owner is None:
                raise NotFound(f"user {uid} not found")
            live = db.execute("SELECT count(*) FROM api_keys WHERE owner = ? AND revoked IS NULL", [uid]).fetchone()[0]
            if live >= MAX_LIVE_KEYS:
                raise Invalid(f"a user holds at most {MAX_LIVE_KEYS} API keys: revoke one first")
            row = {
                "owner": uid,
                "key_hash": auth.api_key_hash(key),
                "visible": auth.api_key_visible(key),
                "label": label,
                "created": now,
                "front_end": int(front_end),
            }
            kid = db["api_keys"].insert(row).last_pk
        return ApiKey(kid, uid, owner[0], row["visible"], label, now, None, None, front_end), key

    def list_api_keys(self, user: User | int | None = None) -> list[ApiKey]:
        """One user's keys, or everyone's with user=None (for the admin command)."""
        with self._tx(write=False) as db:
            if user is None:
                rows = db.execute(_KEY_COLUMNS + " ORDER BY u.name, k.id")
            else:
                rows = db.execute(_KEY_COLUMNS + " WHERE k.owner = ? ORDER BY k.id", [user_id(user)])
            return [ApiKey(*r) for r in rows]

    def revoke_api_key(self, key: str, *, user: User | int | None = None) -> ApiKey:
        """Revoke by the whole key or by its visible start (as listed). With `user`, only that
        user's keys are candidates. Revoking a revoked key changes nothing."""
        if not isinstance(key, str) or not auth.looks_like_api_key(key):
            raise Invalid(
                f"{key!r} is not an API key or the start of one (keys begin with "
                f"{auth.KEY_PREFIX!r} and are listed by their first {auth.KEY_VISIBLE_CHARS} characters)"
            )
        if len(key) > auth.KEY_VISIBLE_CHARS:
            where, arg = "k.key_hash = ?", auth.api_key_hash(key)
        else:
            where, arg = "k.visible = ?", key
        args = [arg]
        if user is not None:
            where += " AND k.owner = ?"
            args.append(user_id(user))
        with self._tx(write=True) as db:
            rows = db.execute(f"{_KEY_COLUMNS} WHERE {where}", args).fetchall()
            if not rows:
                raise NotFound(f"API key {auth.api_key_visible(key)}... not found")
            if len(rows) > 1:
                raise Invalid(f"{len(rows)} keys start with {key!r}; give the whole key")
            k = ApiKey(*rows[0])
            if k.revoked is None:
                k = replace(k, revoked=time.time())
                db["api_keys"].update(k.id, {"revoked": k.revoked})
        return k

    def verify_api_key(self, key: str) -> User:
        """The key's owner, or AuthFailed (see `api_key_holder`)."""
        return self.api_key_holder(key)[0]

    def api_key_holder(self, key: str) -> tuple[User, bool]:
        """(The key's owner, whether it is a front end's key), or AuthFailed. Notes the use
        (at most once a minute per key) through the writer thread, so checking a key never
        waits for the write lock."""
        if not isinstance(key, str) or not auth.looks_like_api_key(key) or len(key) > 200:
            raise AuthFailed("invalid API key")
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT k.id, k.revoked, k.last_used, k.front_end = 1, u.disabled, u.id, u.name, u.created, "
                "coalesce(u.cache_key, ''), u.request_limit FROM api_keys k JOIN users u ON u.id = k.owner WHERE k.key_hash = ?",
                [auth.api_key_hash(key)],
            ).fetchone()
        if row is None:
            raise AuthFailed("invalid API key")
        kid, revoked, last_used, front_end, disabled, *owner = row
        if revoked is not None:
            raise AuthFailed(f"API key {auth.api_key_visible(key)}... was revoked")
        if disabled is not None:  # its keys stay listed, and work again once re-enabled
            raise AuthFailed(f"API key {auth.api_key_visible(key)}... belongs to a disabled user")
        now = time.time()
        if last_used is None or now - last_used > _TOUCH_EVERY_S:
            self._touch_api_key(kid, now)
        return User(*owner), bool(front_end)

    def end_user(self, front: User, name: str) -> User:
        """The user FRONT/NAME that a front end's request names, made on first sight with a
        password nobody knows (they never sign in here: the front end vouches for them).
        Invalid for a name that is not one part of ASCII letters, digits, '.', '_', '-', and for
        an end user an admin disabled (the front end vouches for them, but not past that)."""
        if "/" in front.name:
            raise Invalid("an end user cannot vouch for others")
        if not is_valid_part(name):
            raise Invalid(f"bad end user name {name[:80]!r}: use {NAME_RULE}")
        full = f"{front.name}/{name}"
        with self._tx(write=False) as db:
            found = db.execute("SELECT disabled FROM users WHERE name = ?", [full]).fetchone()
        if found is not None and found[0] is not None:
            raise Invalid(f"user {full!r} is disabled")
        try:
            return self.get_user(full)
        except NotFound:
            pass
        try:
            return self.create_user(full, secrets.token_urlsafe(24), account=False)
        except AlreadyExists:  # another request of theirs made it first
            return self.get_user(full)


def new_password() -> str:
    """A password made for someone (an admin's new user, a reset): 96 random bits, typeable."""
    return secrets.token_urlsafe(12)


def _new_key() -> str:
    """128 random bits as hex: a cache or session key (never derived from anything reused)."""
    return secrets.token_hex(16)


def _chunks(items: list, size: int = 500) -> list[list]:
    """SQLite's bound-parameter limit: an IN list a few hundred at a time."""
    return [items[i : i + size] for i in range(0, len(items), size)]
