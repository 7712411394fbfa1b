"""Turn one request's generated tokens into text deltas, honouring stop strings.

Tokens go through mlx-lm's streaming detokenizer. Text that could be the start of a stop
string is held back until it is known not to be one, so a stop string never reaches the
client. This module knows nothing about batching or MLX; the engine feeds it tokens.
"""

from __future__ import annotations

from typing import Protocol


class Detokenizer(Protocol):
    """What a stream uses of mlx-lm's streaming detokenizer (mlx_lm.tokenizer_utils.StreamingDetokenizer)."""

    @property
    def last_segment(self) -> str: ...

    def add_token(self, token: int) -> None: ...

    def finalize(self) -> None: ...


class TextStream:
    def __init__(self, detokenizer: Detokenizer, stops: list[str]):
        self._detok = detokenizer
        self._stops = stops
        self.text = ""  # everything decoded so far
        self.sent = 0  # chars of `text` already handed to the client
        self.stopped = False  # a stop string was found; `text` is cut before it
        self.stop_found: str | None = None  # which one (the first in the text)

    def add(self, token: int) -> str:
        """Add one token; return the text that is now safe to send (may be empty)."""
        if self.stopped:
            return ""
        self._detok.add_token(token)
        self.text += self._detok.last_segment
        return self._release(final=False)

    def finish(self) -> str:
        """Flush the detokenizer and any held-back text; return what is left to send."""
        if self.stopped:
            return ""
        self._detok.finalize()
        # what finalize forces out ends in U+FFFD where the last token stopped inside a
        # character (a reply cut by max_tokens): that half character is not text to send
        self.text += self._detok.last_segment.rstrip("\ufffd")
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        pending = self.text[self.sent :]
        cut, stop = min(((p, s) for s in self._stops if (p := pending.find(s)) >= 0), default=(-1, None))
        if cut >= 0:
            self.stopped, self.stop_found = True, stop
            self.text = self.text[: self.sent + cut]
            out = pending[:cut]
        elif final:
            out = pending
        else:
            out = pending[: len(pending) - self._held_back(pending)]
        self.sent += len(out)
        return out

    def _held_back(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that begins some stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(pending)), best, -1):
                if s.startswith(pending[-n:]):
                    best = n
                    break
        return best
