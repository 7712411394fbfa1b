"""Which model each chat chats with, when the server serves several (`--model`, repeatable).

A part of `ChatPage` (webui/page/logic/chat_page.py), over the state every part shares
(webui/page/logic/state.py): its engines (the seam's `Engines`,
core.seam.protocol) and its store. A conversation names its model in the store (None: the
server's first); one the server no longer serves (restarted without it) chats with the first
model meanwhile, and keeps its name, so it goes back to it once that model is served again.
Changing a chat's model (`set_model`) changes what its next reply is written by: every
message so far is the new model's prompt. A new chat takes the model picked for it when its
first message makes its conversation (webui/page/logic/replies.py). A reply's engine comes from
`engine_for`, which loads the model if it is not loaded; one that cannot load now (no
memory for it, its files gone) is a PageError, counted like any other refusal. What the
page says of a model is webui/page/logic/model_card.py's; the picker itself is
webui/page/ui/chat_settings.py's.

Threads: `engine_for` runs on the event loop (a model loading waits in a worker thread); the
others where the page calls them (Gradio's worker threads), and none of them loads a model.
No MLX, no Gradio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixchat.core.seam.requests import RequestError
from radixchat.core.store import Conversation, User
from radixchat.webui.page.logic.errors import PageError, guard, refusal
from radixchat.webui.page.logic.state import PageState

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import EngineClient, ModelInfo


class ModelPick(PageState):
    """ChatPage's models: which one each chat chats with, and its engine for a reply."""

    def model_ids(self) -> list[str]:
        """The served models' ids, the first first: the picker's choices."""
        return [m.model_id for m in self.engines.served()]

    def first_model(self) -> str:
        return self.engines.served()[0].model_id

    def served_name(self, name: str | None) -> str | None:
        """The id of the served model `name` names (its id or an alias); None for no name or
        a model this server does not serve."""
        if not name:
            return None
        try:
            return self.engines.find(name).model_id
        except RequestError:
            return None

    def model_of(self, conv: Conversation | None) -> str:
        """The model a chat chats with: its own while it is served, else the first."""
        return (self.served_name(conv.model) if conv is not None else None) or self.first_model()

    def picked(self, name: str | None) -> str:
        """The id of the served model a pick names; a PageError for a name not served (a
        scripted client's, or a page from before a restart with other models)."""
        model = self.served_name(name)
        if model is None:
            raise PageError(f"This server does not serve a model named {name!r}: pick one of the list.")
        return model

    def set_model(self, user: User, conv_id: int, name: str) -> str:
        """The chat's next replies are written by the model `name` names; its id."""
        model = self.picked(name)
        guard(self.store.set_conversation_model, user, conv_id, model)
        return model

    def loaded_info(self, model: str) -> ModelInfo | None:
        """What the engine of `model` says of it while it is loaded; None while it is not
        (nothing loads here)."""
        served = self.engines.find(model)
        names = (served.model_id, *served.aliases)
        return next((e.info for e in self.engines.serving() if e.info.model_id in names), None)

    async def engine_for(self, model: str) -> EngineClient:
        """The engine of the served model `model`, loaded now if it is not (the reply waits,
        the other models go on serving). A model that cannot be loaded is a PageError."""
        try:
            return await self.engines.aengine(model)
        except RequestError as e:
            if self.metrics is not None:
                self.metrics.rejected()
            raise PageError(refusal(e)) from None

    @staticmethod
    def top_p_of(engine: EngineClient) -> float:
        """The top-p recommended for its model (its card's, or the server's word over it), for
        the page's requests; 1.0 (none) without one."""
        return float(engine.info.sampling_defaults.get("top_p", 1.0))

    @staticmethod
    def penalties_of(engine: EngineClient) -> dict[str, float]:
        """The penalties its model's card recommends (a small model loops without one)."""
        keys = ("presence_penalty", "frequency_penalty", "repetition_penalty")
        return {k: v for k, v in engine.info.sampling_defaults.items() if k in keys}
