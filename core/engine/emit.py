"""A request's generated tokens on their way out: text deltas, log-probabilities, the end.

`Emit` is a part of `Engine` (a mixin). `_on_tokens` runs in the engine thread once a decode
step, `_on_token` for each of its tokens: it counts the token, charges the owner's share and
ends the request on a finish reason; the text and the events are made in the output thread
(core.engine.output), beside the next step: `_text_out` detokenizes (the request's
TextStream) and sends the delta, `_end_out` sends the last text and `Finished`. A request
with stop strings or log-probabilities keeps its stream on the engine thread
(`_stream_here`): a stop string ends the request at the step that wrote it, and a token's
log-probabilities need MLX; only its events go through the output thread. A request whose
sampler failed ends there: a grammar that could not go on
(core.engine.sample.constrain.ConstraintFailed) fails with its own message, logged; anything else
is raised for the step to fail the request with its fixed sentence.

Uses of the engine's fields: `loaded` (the tokenizer), `_fair` (charging the owner's
share), `_by_uid`, `_token_texts`, `_output`, `_finish`, `_fail`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, cast

from radixchat.core.engine.active import Active, FinishReason
from radixchat.core.engine.parts import EngineParts
from radixchat.core.engine.sample.constrain import ConstraintFailed
from radixchat.core.engine.textstream import TextStream
from radixchat.core.seam.requests import Failed, Finished, TextDelta, TokenLogprob, Usage

if TYPE_CHECKING:
    import mlx.core as mx

    from radixchat.core.models.model import LoadedModel

log = logging.getLogger("radixchat.engine")
# What a client reads when its request failed inside the engine: the details (library
# messages, tracebacks) go to the server's log, never to a client
INTERNAL_ERROR = "internal error while generating this reply (the server's log has the details)"


class TokenResponse(Protocol):
    """A row of a decode step, as the generator gives it: mlx-lm's `GenerationBatch.Response`,
    or core.engine.step.decode_batch's `Running` (a row that goes on, its logits read when asked)."""

    @property
    def uid(self) -> int: ...
    @property
    def token(self) -> int: ...
    @property
    def logprobs(self) -> mx.array: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def prompt_cache(self) -> list[Any] | None: ...  # set with a finish_reason
    @property
    def all_tokens(self) -> list[int] | None: ...  # set with a finish_reason


def _stream_here(a: Active) -> bool:
    """Must the engine thread run this request's stream? Its stop strings decide when it
    ends, and its log-probabilities need MLX."""
    return bool(a.sampling.stop) or a.sampling.logprobs is not None


class Emit(EngineParts):
    def _on_tokens(self, responses: list[TokenResponse], now: float) -> None:
        """A decode step's tokens; a request whose token fails here fails alone."""
        for r in responses:
            a = self._by_uid.get(r.uid)
            if a is None or a.done:
                continue
            try:
                self._on_token(a, r, now)
            except Exception:
                log.exception("request %s failed", a.handle.id)
                self._fail(a, INTERNAL_ERROR)

    def _on_token(self, a: Active, r: TokenResponse, now: float) -> None:
        token, finish_reason = r.token, r.finish_reason
        if isinstance(a.error, ConstraintFailed):  # the client's grammar, not a fault here
            log.warning("request %s failed: %s (%s)", a.handle.id, a.error, a.error.detail)
            self._fail(a, str(a.error))
            return
        if a.error is not None:
            raise a.error
        if a.t_admitted is None:
            a.t_admitted = now
        a.t_first = a.t_first or now
        a.t_last = now
        a.generated += 1
        a.out.append(token)
        self._fair.charge(a.owner, generated_tokens=1)
        # (the model is loaded while the engine steps)
        is_eos = finish_reason == "stop" and token in cast("LoadedModel", self.loaded).tokenizer.eos_token_ids
        here = _stream_here(a)
        if not is_eos:  # an end of sequence has no text
            if here:
                self._text_here(a, token, r.logprobs)
            else:
                self._output.add(self._text_out, a, token)
        stopped = here and cast(TextStream, a.stream).stopped  # (an admitted request has its stream)
        if finish_reason is not None:  # the generator has already dropped it
            reason: FinishReason = "stop" if stopped or finish_reason == "stop" else "length"
            # a finished row's response carries its tokens (the generator sets them with its reason)
            self._finish(a, reason, final=(r.prompt_cache, cast("list[int]", r.all_tokens)))
        elif stopped:
            self._finish(a, "stop")

    def _text_here(self, a: Active, token: int, logprobs: mx.array) -> None:
        """A token of a request whose stream is the engine's (`_stream_here`): its
        log-probabilities and text made now, its delta sent through the output thread."""
        if a.sampling.logprobs is not None:
            entry = self._token_logprob(token, logprobs, a.sampling.logprobs)
            a.logprobs.append(entry)
            a.unsent.append(entry)
        delta = cast(TextStream, a.stream).add(token)  # (an admitted request has its stream)
        if delta:
            self._output.add(a.handle.push, self._delta(a, delta))

    # ---- the output thread (core.engine.output) -----------------------------------------

    def _text_out(self, a: Active, token: int) -> None:
        """A token of a request whose stream is not the engine's: its text, if any, out."""
        if a.handle.final is not None:  # failed here before: nothing more to say
            return
        try:
            delta = cast(TextStream, a.stream).add(token)  # (an admitted request has its stream)
        except Exception:
            log.exception("request %s: its text failed", a.handle.id)
            a.handle.cancel()  # the engine stops computing it; its end is not sent again (above)
            a.handle.push(Failed(message=INTERNAL_ERROR))
            return
        if delta:
            a.handle.push(TextDelta(delta))

    def _end_out(self, a: Active, reason: FinishReason, usage: Usage) -> None:
        """The request's last text and its end; the engine has let go of it."""
        if a.handle.final is not None:
            return
        final: Finished | Failed
        try:
            stream = cast(TextStream, a.stream)  # (it was admitted: a cancel before that ends elsewhere)
            tail = stream.finish()
            if tail or a.unsent:
                a.handle.push(self._delta(a, tail))
            final = Finished(
                text=stream.text,
                finish_reason=reason,
                usage=usage,
                logprobs=a.logprobs if a.sampling.logprobs is not None else None,
                stop_sequence=stream.stop_found,
            )
        except Exception:
            log.exception("request %s: its last text failed", a.handle.id)
            final = Failed(message=INTERNAL_ERROR, usage=usage)
        a.handle.push(final)

    @staticmethod
    def _delta(a: Active, text: str) -> TextDelta:
        """Text released by the stream, with the log-probabilities of the tokens behind it."""
        if a.sampling.logprobs is None:
            return TextDelta(text)
        sent, a.unsent = a.unsent, []
        return TextDelta(text, logprobs=sent)

    def _token_logprob(self, token: int, logprobs: mx.array, top: int) -> TokenLogprob:
        """The chosen token's log-probability and the `top` most likely, from the row's
        logits of this step (core.engine.step.unnormalized: the step leaves them unnormalized)."""
        import mlx.core as mx

        from radixchat.core.engine.step.unnormalized import normalized

        logprobs = normalized(logprobs)
        chosen = logprobs[token]
        if top:
            ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
            values = logprobs[ids]
            mx.eval(chosen, ids, values)
            # a 1-d array's tolist is a list (mlx's stub says list_or_scalar, for any shape)
            pairs = zip(cast("list[int]", ids.tolist()), cast("list[float]", values.tolist()))
            alts = sorted(pairs, key=lambda p: -p[1])
        else:
            alts = []
        logprob = cast(float, chosen.item())  # a float array's item is a float (mlx's stub: any scalar)
        return TokenLogprob(self._token_text(token), logprob, [(self._token_text(i), v) for i, v in alts])

    def _token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            decoded: str = cast("LoadedModel", self.loaded).tokenizer.decode([token])  # (the tokenizer is untyped)
            text = self._token_texts[token] = decoded
        return text
