"""Who may reuse what in the shared prefix cache: the tree key of a request's tokens.

The tree matches token ids; a scope decides which ids a request's tokens become there, so
that what one user sends is found again only by requests allowed to see it:

- `all`: the tokens as they are. Everyone shares everything (one trusted user; today's
  figures for benchmarks).
- `system` (the default): the system message, with the chat template's fixed text around
  it, is shared by everyone who sends the same one; every later token is tagged with the
  sender's namespace, so it matches only that sender's own requests. A match that ends
  inside the system message is a miss: a probe learns nothing short of guessing the whole
  system prompt, which it then shares legitimately.
- `user`: every token is tagged: nothing is shared between users.

Tagging keeps ids plain ints (`token + ns << 32`, token ids stay far below 2**32), so the
tree compares them as fast as untagged ones. Pure Python, no MLX; the engine thread calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

Sharing = Literal["system", "all", "user"]
_TAG_SHIFT = 32


class CacheScope:
    def __init__(self, sharing: Sharing = "system"):
        if sharing not in ("system", "all", "user"):
            raise ValueError(f"unknown cache sharing {sharing!r}")
        self.sharing = sharing
        self._ns: dict[str, int] = {}  # owner -> namespace number (1, 2, ...); 0 is untagged

    def key(self, tokens: list[int], shared_len: int, owner: str | None) -> list[int]:
        """The tree key of `tokens`, whose first `shared_len` are the system message."""
        if self.sharing == "all":
            return list(tokens)
        start = shared_len if self.sharing == "system" else 0
        tag = self._namespace(owner) << _TAG_SHIFT
        return list(tokens[:start]) + [t + tag for t in tokens[start:]]

    def tag(self, owner: str | None) -> int:
        """The bits `owner`'s own tokens carry in tree keys (0 when everything is shared)."""
        return 0 if self.sharing == "all" else self._namespace(owner) << _TAG_SHIFT

    def owns(self, owner: str | None) -> Callable[[int], bool] | None:
        """Tells which tree tokens are `owner`'s own (tagged with their namespace); None when
        nothing is: the owner was never seen here, or everything is shared (`all`)."""
        ns = self._ns.get(owner or "")
        if self.sharing == "all" or ns is None:
            return None
        return lambda token: token >> _TAG_SHIFT == ns

    def min_match(self, shared_len: int) -> int:
        """Shortest match a request may use: all of the shared system message, or nothing."""
        return shared_len if self.sharing == "system" else 0

    def _namespace(self, owner: str | None) -> int:
        # requests without an owner (--no-auth) are one user: they share one namespace
        name = owner or ""
        ns = self._ns.get(name)
        if ns is None:
            ns = self._ns[name] = len(self._ns) + 1
        return ns
