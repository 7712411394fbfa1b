"""What the chat area shows: a branch of messages as the Chatbot's rows.

Every message goes through one function (`row`: its text as Markdown of text, code and links
only, webui/page/logic/markup.py), stored turns and a reply being written alike; under an answer,
its request's figures; under each message, its versions and "Edit" (webui/page/logic/versions.py).
Which branch, and what is being written, is the caller's (webui/page/logic/chats.py,
webui/page/logic/replies.py). Runs wherever it is called; no MLX, no Gradio.
"""

from __future__ import annotations

import html
from typing import Any

from radixchat.core.store import Branch, Message, RequestFigures
from radixchat.webui.page.logic import markup, versions


def stats_line(f: RequestFigures) -> str:
    """What is shown under an answer: which model wrote it first, then its figures."""
    parts = [f.model] if f.model else []
    if f.ttft_ms is not None:
        parts.append(f"first token {f.ttft_ms:,.0f} ms")
    if f.decode_tps:
        parts.append(f"{f.decode_tps:.1f} tok/s")
    parts.append(f"{f.cached_tokens} of {f.prompt_tokens} prompt tokens from cache")
    if f.finish_reason == "cancelled":
        parts.append("stopped")
    elif f.finish_reason == "length":
        parts.append("length limit")
    if f.error:
        parts.append(f"failed: {f.error}")
    return " · ".join(parts)


def figures_of(message: Message, figures: dict[int, RequestFigures]) -> RequestFigures | None:
    """The figures of the request that wrote an answer (None for a user's message)."""
    return figures.get(message.request) if message.request is not None else None


def visible_turns(history: list[Message] | tuple[Message, ...]) -> list[Message]:
    """The branch in view as shown and as the model sees it: its user and assistant messages
    (the store's history is one branch: other versions of a message are not in it)."""
    return [m for m in history if m.role != "system"]


def row(
    role: str, text: str, figures: RequestFigures | None = None, streaming: bool = False, controls: str = ""
) -> dict[str, Any]:
    """One message as the chat area shows it. Its text goes through `markup.shown` here and
    nowhere else, for stored turns and a reply being written alike, so HTML in a message or
    a reply shows as typed and nothing in it is fetched. Under an answer: its figures, or a
    cursor while it is being written; under a stored message, its `controls` (versions.py:
    made here, never from a message's text) and its text as typed, for its copy button."""
    body = markup.shown(text)
    if role == "user":
        return {"role": "user", "content": body + controls + versions.source(text)}
    if not text.strip():
        body = "…" if streaming else "*(no text)*"
    if streaming:
        return {"role": "assistant", "content": body + " ▍" + controls}
    if figures is not None:
        body += f'\n\n<span class="rc-stats">{html.escape(stats_line(figures))}</span>'
    return {"role": "assistant", "content": body + controls + versions.source(text)}


def chat_rows(
    branch: Branch | list[Message], figures: dict[int, RequestFigures], streaming: str | None = None
) -> list[dict[str, Any]]:
    """What the chat area shows: the visible turns of the branch in view, each answer with its
    figures, each message with its versions (‹ i/n ›) and the user's with "Edit"; and, while a
    reply is being written (`streaming`: its text so far), that reply in place of the one it
    replaces, and no controls (nothing can be switched or edited until it ends)."""
    if not isinstance(branch, Branch):
        branch = Branch(tuple(branch))
    turns = visible_turns(branch.messages)
    if streaming is not None:
        while turns and turns[-1].role == "assistant":  # being regenerated
            turns.pop()
    idle = streaming is None
    out = [
        row(
            m.role,
            m.content,
            figures_of(m, figures),
            controls=versions.controls(m.id, m.role, branch.versions.get(m.id, (m.id,)), editable=True) if idle else "",
        )
        for m in turns
    ]
    if streaming is not None:
        out.append(row("assistant", streaming, streaming=True))
    return out
