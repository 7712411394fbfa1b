"""What the page says of the models it serves: the first one's facts on the sign-in page and in
the header, its card's note and link, the temperature its card recommends (core.models.catalog),
and, under the model picker, the picked model's facts and whether it is loaded.

Words only; the components that show them are webui/page/ui/layout.py's and
webui/page/ui/chat_settings.py's. Runs when the page is built and when a tab loads it (Gradio's
worker threads). No MLX, no Gradio.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import ModelInfo


def model_facts(model: ModelInfo) -> str:
    """What the model's card says of its size and license, e.g. "135M parameters, Apache-2.0"."""
    card = model.card
    return ", ".join(x for x in (card.size, card.license) if x) if card else ""


def pick_note(model: ModelInfo | None) -> str:
    """The line under the model picker (Markdown): the picked model's card facts and that it
    is loaded, given what its engine says of it; with none (not loaded, so nothing is known
    of it but its name), that it loads on its first message."""
    if model is None:
        return "Not loaded now: it loads on its first message."
    facts = model_facts(model)
    return f"{facts} · loaded" if facts else "Loaded"


def sign_in_message(model: ModelInfo) -> str:
    """The sign-in page's words (HTML, shown by Gradio above the form): the server, the model
    it serves, and how to get a user."""
    facts = model_facts(model)
    served = f"<code>{html.escape(model.model_id)}</code>" + (f" ({html.escape(facts)})" if facts else "")
    return (
        f"This is <strong>radixchat</strong>, serving {served}.<br>"
        "Sign in with your radixchat user. No user yet? Whoever runs the server adds one "
        "with <code>radixchat users add NAME</code>."
    )


def header(model: ModelInfo, who_line: str, served: int = 1) -> str:
    """The line above the chat (Markdown): the server, the model, who is signed in, and the
    card's note and where the card is. With `served` models, no one model: each chat has its
    own (the picker says which) and every answer says which wrote it."""
    if served > 1:
        return f"**radixchat** · {who_line} · {served} models: each chat picks its own"
    card = model.card
    facts = model_facts(model)
    model_line = f"`{model.model_id}`" + (f" ({facts})" if facts else "")
    note_line = (f"  \n*{card.note}*" if card and card.note else "") + (
        f" Its card: `{card.link}` in radixchat's repository." if card and card.link else ""
    )
    # who comes before the model, their name first: on a phone the line is cut short at its end
    # (webui/page/ui/style.py)
    return f"**radixchat** · {who_line} · {model_line}{note_line}"


def recommended(model: ModelInfo) -> dict[str, float]:
    """The sampling the card recommends (temperature, top_p); none for a model without one."""
    return dict(model.card.sampling) if model.card else {}


def temperature_label(model: ModelInfo | None) -> str:
    """The temperature slider's label, with the card's recommendation when there is one (None:
    a model not loaded yet, whose card is not known here)."""
    sampling = recommended(model) if model is not None else {}
    return "Temperature" + (
        f" (model card: {sampling['temperature']:g}"
        + (f"; top-p {sampling['top_p']:g}" if "top_p" in sampling else "")
        + ")"
        if "temperature" in sampling
        else ""
    )
