"""The store's vocabulary: limits, errors, and the records it hands out, with the checks
that keep bad input out of the database.

Everything here is plain data and validation; reading and writing is core.store, which
re-exports all of it (core/store/__init__.py), so callers import from core.store only.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

MAX_NAME_CHARS = 64
NAME_RULE = "1-64 characters: ASCII letters, digits, '.', '_' and '-'"
_PART = rf"[A-Za-z0-9._-]{{1,{MAX_NAME_CHARS}}}"
# one '/' at most: a front end's end user (webui/api/deps.py), never an ordinary user's name
_NAME_RE = re.compile(rf"{_PART}(?:/{_PART})?", re.ASCII)
_PART_RE = re.compile(_PART, re.ASCII)
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024
MAX_TITLE_CHARS = 200
MAX_SYSTEM_PROMPT_CHARS = 20_000
MAX_MESSAGE_CHARS = 100_000
MAX_LABEL_CHARS = 64
MAX_MODEL_CHARS = 256
MAX_ERROR_CHARS = 2_000  # longer error texts are cut, not refused: they are diagnostics
MAX_FIELD_CHARS = 200  # a refusal's route, reason or field: cut, like an error text
MAX_LIST = 1_000
ROLES = ("system", "user", "assistant")
DEFAULT_TITLE = "New chat"


class StoreError(Exception):
    """Base of the store's errors; `status` is the HTTP status a server should answer with."""

    status = 500


class NotFound(StoreError):
    status = 404


class Invalid(StoreError):
    status = 400


class AlreadyExists(Invalid):
    status = 409


class AuthFailed(StoreError):
    status = 401


class AccountDisabled(AuthFailed):
    """The right password of a disabled user: told so, where a wrong one is only wrong."""


@dataclass(frozen=True)
class User:
    id: int
    name: str
    created: float
    # names the user's namespace in the engine's prefix cache (core.seam.requests.owner_of):
    # random and never reused, unlike `id`; for the server's own use, never shown to a client
    cache_key: str = field(default="", repr=False)
    # how many requests the user may have waiting or running at once (None: the server's
    # --max-user-requests); an admin sets it in the page (core.store.accounts)
    request_limit: int | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ApiKey:
    id: int
    owner: int
    owner_name: str
    visible: str  # the key's first characters; the key itself is never stored
    label: str
    created: float
    last_used: float | None
    revoked: float | None
    front_end: bool = False  # a trusted front end's: its requests may name their end user


@dataclass(frozen=True)
class Conversation:
    id: int
    owner: int
    title: str
    system_prompt: str
    created: float
    updated: float
    archived: float | None  # when it was archived; None while active
    model: str | None = None  # the served model it chats with; None: the server's first


@dataclass(frozen=True)
class SearchHit:
    """A conversation that matches a search, with a short piece of the text that matched
    (plain user text: escape it wherever it is shown as HTML)."""

    conversation: Conversation
    snippet: str


@dataclass(frozen=True)
class Message:
    id: int
    conversation: int
    role: str
    content: str
    created: float
    request: int | None  # the request that produced an assistant message
    parent: int | None = None  # the message it follows; None for a first message


@dataclass(frozen=True)
class Branch:
    """The branch of a conversation in view: its messages, first to last, and for each the ids
    of its versions (itself and its siblings: the other children of its parent, each an edit
    of the same message or another answer to it), oldest first."""

    messages: tuple[Message, ...] = ()
    versions: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def grow(self, message: Message) -> Branch:
        """The branch once `message` is written as a child of its parent (on this branch): what
        followed that parent here is left for another branch, and `message` is its newest version."""
        ids = [m.id for m in self.messages]
        if message.parent is not None and message.parent not in ids:
            raise ValueError(f"message {message.id} follows {message.parent}, which is not on this branch")
        cut = 0 if message.parent is None else 1 + ids.index(message.parent)
        old = self.messages[cut].id if cut < len(self.messages) else None
        kept = self.messages[:cut]
        versions = {m.id: self.versions.get(m.id, (m.id,)) for m in kept}
        versions[message.id] = (*self.versions.get(old, ()), message.id)
        return Branch((*kept, message), versions)


@dataclass(frozen=True)
class RequestRecord:
    """Metrics of one engine request. Checked when built, so a bad record fails in the
    caller's code and never inside the writer thread."""

    user: int | None = None
    conversation: int | None = None
    model: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    queue_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    decode_tps: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    route: str | None = None  # which API or the page ("chat", "messages", "page"...)
    status: int | None = None  # the HTTP status it was answered with (200 when served)
    reason: str | None = None  # a refusal's code ("invalid_value", "invalid_api_key"...)
    param: str | None = None  # the request field at fault, when one is

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "cached_tokens", "generated_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise Invalid(f"{name} must be a whole number >= 0, not {v!r}")
        for name in ("queue_ms", "ttft_ms", "total_ms", "decode_tps"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0):
                raise Invalid(f"{name} must be a number >= 0 or None, not {v!r}")
        check_text(self.model, "model", MAX_MODEL_CHARS, allow_empty=True)
        if self.finish_reason is not None:
            check_text(self.finish_reason, "finish_reason", 32)
        if self.error is not None:
            object.__setattr__(self, "error", str(self.error)[:MAX_ERROR_CHARS])
        for name in ("route", "reason", "param"):  # a client's field name can be anything
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, str(v)[:MAX_FIELD_CHARS])
        if self.status is not None and not (isinstance(self.status, int) and 100 <= self.status <= 599):
            raise Invalid(f"status must be an HTTP status, not {self.status!r}")

    @classmethod
    def from_usage(cls, usage: Any, **fields: Any) -> RequestRecord:
        """From core.seam.requests.Usage (or anything with its attributes) plus the other fields."""
        names = ("prompt_tokens", "cached_tokens", "generated_tokens", "queue_ms", "ttft_ms", "total_ms", "decode_tps")
        return cls(**{n: getattr(usage, n) for n in names if hasattr(usage, n)}, **fields)

    def figures(self) -> RequestFigures:
        """What `Store.request_metrics` will read back for this record once it is stored."""
        return RequestFigures(
            self.prompt_tokens,
            self.cached_tokens,
            self.ttft_ms,
            self.decode_tps,
            self.finish_reason,
            self.error,
            self.model or "",
        )


@dataclass(frozen=True)
class RequestFigures:
    """A request's figures as shown under a reply (`Store.request_metrics`): aggregates and
    the outcome, never the prompt or the text."""

    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float | None
    decode_tps: float | None
    finish_reason: str | None
    error: str | None
    model: str = ""  # which model answered (the page says so under the answer)


def check_text(value: Any, what: str, max_chars: int, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise Invalid(f"{what} must be text, not {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise Invalid(f"{what} is empty")
    if len(value) > max_chars:
        raise Invalid(f"{what} is too long: {len(value):,} characters, the limit is {max_chars:,}")
    return value


def is_valid_name(name: Any) -> bool:
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


def is_valid_part(name: Any) -> bool:
    """A name without a '/': an end user's part of FRONT/USER."""
    return isinstance(name, str) and _PART_RE.fullmatch(name) is not None


def check_name(name: Any) -> str:
    if isinstance(name, str) and not name:
        raise Invalid("user name is empty")
    if not is_valid_name(name):
        raise Invalid(f"bad user name {name!r}: use {NAME_RULE} (a front end's users: FRONT/USER)")
    return name


def check_account_name(name: Any) -> str:
    """`check_name`, for an account someone signs in as: no '/', which is kept for a front
    end's end users (FRONT/USER), whom only that front end's requests make."""
    if isinstance(name, str) and name and not is_valid_part(name):
        why = "'/' is kept for a front end's end users (FRONT/USER)" if is_valid_name(name) else f"use {NAME_RULE}"
        raise Invalid(f"bad user name {name!r}: {why}")
    return check_name(name)  # (an empty name, or not text)


def check_password(password: Any) -> str:
    check_text(password, "password", MAX_PASSWORD_CHARS, allow_empty=True)
    if len(password) < MIN_PASSWORD_CHARS:
        raise Invalid(f"password is too short: use at least {MIN_PASSWORD_CHARS} characters")
    return password


def clean_model(model: Any) -> str | None:
    """A conversation's model: a served model's name, or None (the server's first). Which names
    a server serves is the web layer's to check: the store keeps one it no longer serves."""
    return None if model is None else check_text(model, "model", MAX_MODEL_CHARS).strip()


def clean_title(title: Any) -> str:
    # one line, single spaces: titles end up in a sidebar and a Markdown heading
    return " ".join(check_text(title, "title", MAX_TITLE_CHARS).split())


def as_id(value: Any, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise NotFound(f"{what} {value!r} not found")


def user_id(user: User | int) -> int:
    return user.id if isinstance(user, User) else as_id(user, "user")
