"""A request's generated tokens on their way out: text deltas, log-probabilities, the end.

`Emit` is a part of `Engine` (a mixin) that runs in the engine thread: each token of a
decode step goes through the request's TextStream (detokenizing, stop strings held back
until known) and becomes a `TextDelta` on its handle, with the token's log-probabilities
when asked; a finish reason or a stop string ends the request (`Engine._finish`). A
request whose sampler failed ends there: a grammar that could not go on
(core.engine.constrain.ConstraintFailed) fails with its own message, logged; anything else
is raised for the step to fail the request with its fixed sentence.

Uses of the engine's fields: `loaded` (the tokenizer), `_fair` (charging the owner's
share), `_token_texts`, `_finish`, `_fail`.
"""

from __future__ import annotations

import logging

from radixchat.core.engine.active import Active
from radixchat.core.engine.constrain import ConstraintFailed
from radixchat.core.engine.requests import TextDelta, TokenLogprob

log = logging.getLogger("radixchat.engine")


class Emit:
    def _on_token(self, a: Active, r, now: float) -> None:
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
        is_eos = finish_reason == "stop" and token in self.loaded.tokenizer.eos_token_ids
        if not is_eos:
            if a.sampling.logprobs is not None:
                entry = self._token_logprob(token, r.logprobs, a.sampling.logprobs)
                a.logprobs.append(entry)
                a.unsent.append(entry)
            delta = a.stream.add(token)
            if delta:
                a.handle._push(self._delta(a, delta))
        if finish_reason is not None:  # the generator has already dropped it
            self._finish(
                a,
                "stop" if a.stream.stopped or finish_reason == "stop" else "length",
                final=(r.prompt_cache, r.all_tokens),
            )
        elif a.stream.stopped:
            self._finish(a, "stop")

    @staticmethod
    def _delta(a: Active, text: str) -> TextDelta:
        """Text released by the stream, with the log-probabilities of the tokens behind it."""
        if a.sampling.logprobs is None:
            return TextDelta(text)
        sent, a.unsent = a.unsent, []
        return TextDelta(text, logprobs=sent)

    def _token_logprob(self, token: int, logprobs, top: int) -> TokenLogprob:
        """The chosen token's log-probability and the `top` most likely, from the row's
        logits of this step (core.engine.unnormalized: the step leaves them unnormalized)."""
        import mlx.core as mx

        from radixchat.core.engine.unnormalized import normalized

        logprobs = normalized(logprobs)
        chosen = logprobs[token]
        if top:
            ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
            values = logprobs[ids]
            mx.eval(chosen, ids, values)
            alts = sorted(zip(ids.tolist(), values.tolist()), key=lambda p: -p[1])
        else:
            alts = []
        return TokenLogprob(self._token_text(token), chosen.item(), [(self._token_text(i), v) for i, v in alts])

    def _token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.loaded.tokenizer.decode([token])
        return text
