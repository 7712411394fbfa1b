"""The SQLite store (sqlite-utils): users, API keys, conversations, messages, request metrics.

The one import callers use: `from core.store import Store, RequestRecord, NotFound, ...`.
Inside: `store.py` (the Store, put together from one mixin per topic), `connection.py`
(per-thread connections, transactions, writers' turns), `accounts.py` (users, passwords, API
keys), `conversations.py` (conversations, messages, branches, links, search, deletion),
`metrics.py` (request rows, the metrics writer thread, the dashboard's reads),
`response_ids.py` (the Responses API's random ids of kept turns), `schema.py`
(tables and migrations), `types.py` (record types, limits, validation, errors), `report.py`
(exports and dashboard buckets), `branches.py` (the SQL of a conversation's branches),
`auth.py` (scrypt passwords, API key hashes).
Imports go one way: store -> accounts, conversations, response_ids, metrics -> connection ->
schema, and each of them -> report, auth, branches -> types. No MLX, no HTTP.
"""

from radixchat.core.store.store import Store
from radixchat.core.store.types import (
    DEFAULT_TITLE,
    MAX_ERROR_CHARS,
    MAX_LABEL_CHARS,
    MAX_LIST,
    MAX_MESSAGE_CHARS,
    MAX_MODEL_CHARS,
    MAX_NAME_CHARS,
    MAX_PASSWORD_CHARS,
    MAX_SYSTEM_PROMPT_CHARS,
    MAX_TITLE_CHARS,
    MIN_PASSWORD_CHARS,
    NAME_RULE,
    ROLES,
    AccountDisabled,
    AlreadyExists,
    ApiKey,
    AuthFailed,
    Branch,
    Conversation,
    Invalid,
    Message,
    NotFound,
    RequestFigures,
    RequestRecord,
    SearchHit,
    StoreError,
    User,
    as_id,
    check_account_name,
    check_name,
    check_password,
    check_text,
    clean_model,
    clean_title,
    is_valid_name,
    user_id,
)

__all__ = [
    "DEFAULT_TITLE",
    "MAX_ERROR_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_LIST",
    "MAX_MESSAGE_CHARS",
    "MAX_MODEL_CHARS",
    "MAX_NAME_CHARS",
    "MAX_PASSWORD_CHARS",
    "MAX_SYSTEM_PROMPT_CHARS",
    "MAX_TITLE_CHARS",
    "MIN_PASSWORD_CHARS",
    "NAME_RULE",
    "ROLES",
    "AccountDisabled",
    "AlreadyExists",
    "ApiKey",
    "AuthFailed",
    "Branch",
    "Conversation",
    "Invalid",
    "Message",
    "NotFound",
    "RequestFigures",
    "RequestRecord",
    "SearchHit",
    "Store",
    "StoreError",
    "User",
    "as_id",
    "check_account_name",
    "check_name",
    "check_password",
    "check_text",
    "clean_model",
    "clean_title",
    "is_valid_name",
    "user_id",
]
