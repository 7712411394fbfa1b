"""Tool calls in API replies: the request side (tools to the template, the grammar that
forces a call) and the reply side (calls parsed out of the text, streamed or not).

The formats and the parsing are core/seam/tools.py's; this module applies them to one
OpenAI request. A streamed reply shows its text as it comes except from where a call
starts (or may start: a prefix of the family's marker at the end is held back); at the
end the calls go out as one `tool_calls` delta and the finish reason is "tool_calls".
Runs on the server's event loop; no MLX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from radixchat.core.seam import tools as formats

if TYPE_CHECKING:
    from radixchat.webui.api.shapes.schema import ChatCompletionRequest, NamedToolChoice


class ToolsUnsupported(ValueError):
    pass


def request_side(body: ChatCompletionRequest, family: str | None) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(the tools for the chat template, the Lark grammar a forced call needs) of `body`."""
    if not body.calls_tools():
        return None, None
    if family is None:
        raise ToolsUnsupported("tools: this model's chat template has no tool-call format")
    assert body.tools is not None  # calls_tools() says there are some
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    choice = body.tool_choice
    if choice == "required":
        return tools, formats.grammar(family, tools)
    if choice not in (None, "auto"):  # a named function
        # a named function: None, "auto" and "required" are handled above, "none" keeps calls_tools() false
        return tools, formats.grammar(family, tools, only=cast("NamedToolChoice", choice).function.name)
    return tools, None


def reply(family: str | None, text: str, forced: bool = False) -> tuple[str | None, list[dict[str, Any]] | None, bool]:
    """(content, tool_calls, called) of a whole reply. A `forced` call (its grammar made the
    whole reply a call) that does not parse was cut short (max_tokens): no content, rather than
    the call's raw markup as if it were the answer."""
    if family is None:
        return text, None, False
    content, calls = formats.parse(family, text)
    if not calls:
        return (None if forced else text), None, False
    return (content or None), calls, True


class Stream:
    """One streamed choice's text, with what may be a call held back."""

    def __init__(self, family: str, forced: bool = False) -> None:
        self.family, self.forced, self.text, self.shown = family, forced, "", 0

    def feed(self, delta: str) -> str:
        """The text to send now."""
        self.text += delta
        cut = formats.held_back(self.family, self.text)
        if cut <= self.shown:
            return ""
        out, self.shown = self.text[self.shown : cut], cut
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]] | None]:
        """(text still to send, the calls as a streamed delta's tool_calls, or None)."""
        _, calls = formats.parse(self.family, self.text)
        if not calls:  # a forced call cut short: nothing (see `reply`)
            return ("" if self.forced else self.text[self.shown :]), None
        return "", [{"index": k, **call} for k, call in enumerate(calls)]
