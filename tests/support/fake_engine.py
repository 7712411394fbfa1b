"""An engine with no model, behind the same seam as the real one (core.seam.protocol).

For the web layer's unit tests: the routes, the page's logic and the metrics run against
it in-process, so a request-shape refusal or a page rule is tested without a server
process, a model or MLX (as vLLM's cpu_test files build a scheduler from a fake config).
Each request's reply is `reply`, one word a delta, ended at once (finish reason "length"
when the request's max_tokens cut it short, else "stop"); or the submit raises `refuse`; or,
with `fail`, the reply fails with that message after its first word (mid-reply, as a grammar
that runs into the constraint engine's limits does).
It counts running and waiting requests as the seam says: what it was given and has not
ended yet is running (none wait), unless `hold` keeps them all waiting until `release()`.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

from radixchat.core.seam.handle import Outbox, RequestHandle
from radixchat.core.seam.protocol import EngineStats, ModelInfo
from radixchat.core.seam.requests import ChatRequest, Failed, Finished, PromptRequest, RequestError, TextDelta, Usage

INFO = ModelInfo(model_id="fake-model", num_params=1_000_000, dtype="float32", context_length=512, vocab_size=256)


class FakeEngine:
    def __init__(
        self,
        reply: str = "a fake reply",
        *,
        info: ModelInfo = INFO,
        refuse: Exception | None = None,
        fail: str | None = None,
    ):
        self.reply, self._info, self.refuse, self.fail = reply, info, refuse, fail
        self.requests: list[ChatRequest | PromptRequest] = []  # every request it accepted, in order
        self.cancelled: list[str] = []
        self.forgotten: list[str] = []  # owners whose cache entries it was told to drop, in order
        self.forgotten_conversations: list[tuple] = []  # (owner, first messages) of deleted ones
        self.hold = False  # True: accepted requests wait, unanswered, until release()
        self._held: list[tuple[RequestHandle, ChatRequest | PromptRequest]] = []
        self._open: dict[str, RequestHandle] = {}
        self._ids = itertools.count(1)
        self._outbox = Outbox()
        self._lock = threading.Lock()

    @property
    def info(self) -> ModelInfo:
        return self._info

    def tokenize(self, text: str) -> list[int]:
        return [b % self._info.vocab_size for b in text.encode()]

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        return self._accept(request, None)

    async def asubmit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        return self._accept(request, asyncio.get_running_loop())

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self.cancelled.append(request_id)
            handle = self._open.pop(request_id, None)
            self._held = [(h, r) for h, r in self._held if h.id != request_id]
        if handle is not None:
            handle.push(Finished("", "cancelled"))
            self._outbox.flush()

    def forget(self, owner: str) -> None:
        with self._lock:
            self.forgotten.append(owner)

    async def count_tokens(self, request) -> int:
        return sum(len(m.content.split()) + 4 for m in request.messages)  # words, and a template's few

    def forget_conversation(self, owner: str | None, messages: list[dict]) -> None:
        with self._lock:
            self.forgotten_conversations.append((owner, messages))

    def stats(self) -> EngineStats:
        with self._lock:
            waiting = len(self._held)
            return EngineStats(alive=not self.stopped, running=len(self._open) - waiting, waiting=waiting, max_batch=8)

    # its lifecycle (core.seam.protocol.Lifecycle), as a server or a model set
    # (core.engine.models.ServedEngine) drives it
    fatal: str | None = None
    stopped = released = False

    def halt(self) -> None:
        """End every open request as cancelled."""
        with self._lock:
            open_ids = list(self._open)
        for rid in open_ids:
            self.cancel(rid)

    def stop(self, release: bool = False) -> None:
        """`release`: an idle model unloaded (its memory back), as a model set stops one."""
        self.halt()
        self.stopped, self.released = True, release

    def release(self) -> None:
        """Answer every held request now."""
        with self._lock:
            held, self._held = self._held, []
        for handle, request in held:
            self._answer(handle, request)

    def _accept(self, request, loop) -> RequestHandle:
        if not isinstance(request, (ChatRequest, PromptRequest)):
            raise TypeError("submit takes a ChatRequest or a PromptRequest")
        if self.refuse is not None:
            raise self.refuse
        text = request.prompt if isinstance(request, PromptRequest) else str(request.messages[-1].content)
        prompt = self.tokenize(text)
        if len(prompt) >= self._info.context_length:
            raise RequestError("the prompt is too long for the fake model", 413, "context_length_exceeded")
        handle = RequestHandle(f"fake-{next(self._ids)}", len(prompt), self.cancel, loop, self._outbox)
        with self._lock:
            self.requests.append(request)
            self._open[handle.id] = handle
            if self.hold:
                self._held.append((handle, request))
                return handle
        self._answer(handle, request)
        return handle

    def _answer(self, handle: RequestHandle, request) -> None:
        words = self.reply.split(" ")
        limit = request.sampling.max_tokens
        cut = limit is not None and limit < len(words)
        words = words[:limit] if cut else words
        for i, w in enumerate(words[:1] if self.fail is not None else words):
            handle.push(TextDelta(w if i == 0 else " " + w))
        usage = Usage(prompt_tokens=handle.prompt_tokens, generated_tokens=len(words), ttft_ms=1.0, total_ms=2.0)
        with self._lock:
            self._open.pop(handle.id, None)
        if self.fail is not None:
            handle.push(Failed(self.fail, usage))
        else:
            handle.push(Finished(" ".join(words), "length" if cut else "stop", usage))
        self._outbox.flush()
