"""Accounts: users, their passwords and API keys, and signing in with either.

Owns the `users` and `api_keys` rows: creating users, setting passwords, listing, removing a
user (their conversations, messages and keys go with them through ON DELETE CASCADE; their
request metrics stay, unlinked), making, listing and revoking keys, and checking a password or
a key. Hashing itself is core.store.auth; sign-in throttling, sessions and
reading keys from HTTP headers are webui's. A key's "last used" is noted through the metrics
writer thread (`_touch_api_key`, core.store.metrics), so checking a key never waits for the
write lock. Called from HTTP handlers, the page's workers and the admin command, each thread on
its own connection.
"""

from __future__ import annotations

import time
from dataclasses import replace

from radixchat.core.store import auth
from radixchat.core.store.connection import StoreBase
from radixchat.core.store.types import (
    MAX_LABEL_CHARS,
    MAX_PASSWORD_CHARS,
    AlreadyExists,
    ApiKey,
    AuthFailed,
    Invalid,
    NotFound,
    User,
    as_id,
    check_name,
    check_password,
    check_text,
    is_valid_name,
    user_id,
)

_TOUCH_EVERY_S = 60.0  # how stale a key's last_used may get: saves a write per API call

_USER_COLUMNS = "SELECT id, name, created FROM users"
_KEY_COLUMNS = (
    "SELECT k.id, k.owner, u.name, k.visible, k.label, k.created, k.last_used, k.revoked "
    "FROM api_keys k JOIN users u ON u.id = k.owner"
)


class AccountsMixin(StoreBase):
    """Users, passwords and API keys (see the module docstring)."""

    _scrypt: auth.ScryptCost

    # ---- users ----

    def create_user(self, name: str, password: str) -> User:
        check_name(name)
        check_password(password)
        taken = "SELECT 1 FROM users WHERE name = ?"
        with self._tx(write=False) as db:  # a quick refusal, before the slow hash
            if db.execute(taken, [name]).fetchone():
                raise AlreadyExists(f"user {name!r} already exists")
        hashed = auth.hash_password(password, self._scrypt)  # slow: not while holding the lock
        now = time.time()
        with self._tx(write=True) as db:
            if db.execute(taken, [name]).fetchone():  # again: someone may have been quicker
                raise AlreadyExists(f"user {name!r} already exists")
            uid = db["users"].insert({"name": name, "password_hash": hashed, "created": now}).last_pk
        return User(uid, name, now)

    def authenticate(self, name: str, password: str) -> User:
        """The user if the password is right; otherwise AuthFailed, the same for an unknown
        name as for a wrong password, and taking as long."""
        row = None
        if is_valid_name(name):
            with self._tx(write=False) as db:
                row = db.execute("SELECT id, name, created, password_hash FROM users WHERE name = ?", [name]).fetchone()
        if not isinstance(password, str) or len(password) > MAX_PASSWORD_CHARS:
            password = ""
        if row is None:
            auth.burn_password_check(password, self._scrypt)
        elif auth.verify_password(password, row[3]):
            return User(*row[:3])
        raise AuthFailed("wrong user name or password")

    def set_password(self, name: str, password: str) -> None:
        check_password(password)
        hashed = auth.hash_password(password, self._scrypt)
        with self._tx(write=True) as db:
            # by name (case aside, as the column collates), not by id: one statement finds and sets
            if not db.execute("UPDATE users SET password_hash = ? WHERE name = ?", [hashed, name]).rowcount:
                raise NotFound(f"user {name!r} not found")

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
        stay, unlinked. Returns how many conversations went with them."""
        with self._tx(write=True) as db:
            row = db.execute("SELECT id FROM users WHERE name = ?", [name]).fetchone()
            if row is None:
                raise NotFound(f"user {name!r} not found")
            n = db["conversations"].count_where("owner = ?", row)
            db["users"].delete(row[0])
        return n

    # ---- API keys ----

    def create_api_key(self, user: User | int, label: str = "") -> tuple[ApiKey, str]:
        """A new key for `user`: (its record, the key). The key is returned only this once."""
        uid = user_id(user)
        label = check_text(label, "label", MAX_LABEL_CHARS, allow_empty=True).strip()
        key = auth.new_api_key()
        now = time.time()
        with self._tx(write=True) as db:
            owner = db.execute("SELECT name FROM users WHERE id = ?", [uid]).fetchone()
            if owner is None:
                raise NotFound(f"user {uid} not found")
            row = {
                "owner": uid,
                "key_hash": auth.api_key_hash(key),
                "visible": auth.api_key_visible(key),
                "label": label,
                "created": now,
            }
            kid = db["api_keys"].insert(row).last_pk
        return ApiKey(kid, uid, owner[0], row["visible"], label, now, None, None), key

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
        """The key's owner, or AuthFailed. Notes the use (at most once a minute per key)
        through the writer thread, so checking a key never waits for the write lock."""
        if not isinstance(key, str) or not auth.looks_like_api_key(key) or len(key) > 200:
            raise AuthFailed("invalid API key")
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT k.id, k.revoked, k.last_used, u.id, u.name, u.created "
                "FROM api_keys k JOIN users u ON u.id = k.owner WHERE k.key_hash = ?",
                [auth.api_key_hash(key)],
            ).fetchone()
        if row is None:
            raise AuthFailed("invalid API key")
        kid, revoked, last_used, *owner = row
        if revoked is not None:
            raise AuthFailed(f"API key {auth.api_key_visible(key)}... was revoked")
        now = time.time()
        if last_used is None or now - last_used > _TOUCH_EVERY_S:
            self._touch_api_key(kid, now)
        return User(*owner)
