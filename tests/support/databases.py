"""Databases as an older radixchat left them: the schema up to a version, with users in it,
for the tests of what a migration makes of them."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def database_at(path: Path, version: int, users: dict[str, float]) -> Path:
    """A store at schema `version` holding these users (name: created), password hash 'x'."""
    from radixchat.core.store import schema

    c = sqlite3.connect(path, isolation_level=None)
    try:
        schema.migrate(c, target=version)
        for name, created in users.items():
            c.execute("INSERT INTO users(name, password_hash, created) VALUES (?, 'x', ?)", [name, created])
    finally:
        c.close()
    return path
