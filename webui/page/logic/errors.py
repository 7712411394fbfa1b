"""Refusals as sentences for the person at the page: `PageError`, `refusal` for what the
engine or the store said, and `check_text` for text that is not valid Unicode.

The page's logic (webui/page/logic/chats.py, webui/page/logic/replies.py) raises PageError; the layout's
handlers show it as a notice (webui/page/events/handlers.py, sending.py). Runs wherever it is called; no MLX, no
Gradio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from pydantic import ValidationError

from radixchat.core.seam.requests import RequestError
from radixchat.core.store import NotFound, StoreError
from radixchat.webui.api.shapes.fields import lone_surrogate


class PageError(Exception):
    """Something the person at the page should read (shown as a notice, never a traceback)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def refusal(e: Exception) -> str:
    """A readable sentence for why the engine or the store refused a request."""
    if isinstance(e, RequestError):
        said = e.message.rstrip(". ")  # the engine's sentence, inside one of the page's
        if e.code == "user_limit":  # this user's own limit, not a busy server
            return said[:1].upper() + said[1:] + "."
        if e.status == 429:
            return f"The server is busy ({said}). Try again in a moment."
        if e.status == 413:
            return f"This is too long for the model: {said}. Start a new chat or send a shorter message."
        if e.status == 503:
            return f"The model is not available right now: {said}."
        return f"The engine refused this request: {said}."
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"Invalid setting {where}: {first['msg']}."
    if isinstance(e, NotFound):
        return "This chat no longer exists (deleted in another window?). Reload the page."
    if isinstance(e, StoreError):
        return str(e)[:1].upper() + str(e)[1:] + "."
    return f"Something went wrong: {type(e).__name__}: {e}."


def check_text(text: str | None, what: str) -> None:
    """Refuse text that holds a lone surrogate (half of a UTF-16 pair, which a browser may
    send): it can be neither tokenized nor stored, and what the tokenizer would say about it
    is no sentence for the page."""
    if text and lone_surrogate(text) is not None:
        raise PageError(
            f"This {what} holds a character that is not valid text (half of a UTF-16 surrogate pair): "
            "remove it and try again."
        )


P = ParamSpec("P")
T = TypeVar("T")


def guard(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`, a store's refusal raised as a PageError."""
    try:
        return fn(*args, **kwargs)
    except StoreError as e:
        raise PageError(refusal(e)) from None
