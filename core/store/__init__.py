"""The SQLite store (sqlite-utils): users, API keys, conversations, messages, request metrics.

The one import callers use: `from core.store import Store, RequestRecord, NotFound, ...`.
Inside: `store.py` (the Store: connections, transactions, the metrics writer thread),
`schema.py` (tables and migrations), `types.py` (record types, limits, validation, errors),
`report.py` (exports and dashboard buckets),
`branches.py` (the SQL of a conversation's branches), `auth.py` (scrypt passwords, API key hashes).
Imports go one way: store -> schema, report, auth, branches -> types. No MLX, no HTTP.
"""

from core.store.store import Store
from core.store.types import (
    DEFAULT_TITLE, MAX_ERROR_CHARS, MAX_LABEL_CHARS, MAX_LIST, MAX_MESSAGE_CHARS, MAX_MODEL_CHARS,
    MAX_NAME_CHARS, MAX_PASSWORD_CHARS, MAX_SYSTEM_PROMPT_CHARS, MAX_TITLE_CHARS, MIN_PASSWORD_CHARS,
    NAME_RULE, ROLES, AlreadyExists, ApiKey, AuthFailed, Branch, Conversation, Invalid, Message, NotFound,
    RequestFigures, RequestRecord, SearchHit, StoreError, User, as_id, check_name, check_password, check_text,
    clean_title, is_valid_name, user_id)

__all__ = [
    "Store", "DEFAULT_TITLE", "MAX_ERROR_CHARS", "MAX_LABEL_CHARS", "MAX_LIST", "MAX_MESSAGE_CHARS",
    "MAX_MODEL_CHARS", "MAX_NAME_CHARS", "MAX_PASSWORD_CHARS", "MAX_SYSTEM_PROMPT_CHARS",
    "MAX_TITLE_CHARS", "MIN_PASSWORD_CHARS", "NAME_RULE", "ROLES", "AlreadyExists", "ApiKey",
    "AuthFailed", "Branch", "Conversation", "Invalid", "Message", "NotFound", "RequestFigures", "RequestRecord",
    "SearchHit", "StoreError", "User", "as_id", "check_name", "check_password", "check_text", "clean_title",
    "is_valid_name", "user_id"]
