"""Structured output: a request's JSON schema enforced token by token with llguidance.

llguidance (Microsoft's Low-level Guidance, the engine behind Guidance and used by vLLM,
SGLang and llama.cpp) compiles a JSON schema to a grammar and, at every step, gives the
set of tokens that keep the output a valid prefix; everything else is masked out before
sampling, so the finished reply parses and validates whatever the model is. Measured here
on SmolLM2 (49k tokens), the same schema, greedy: llguidance 0.57 ms a token including the
mask's conversion (0.58 s once per model for its tokenizer), lm-format-enforcer 0.11.3 2.08
ms a token (0.93 s once); a 32-row decode step takes ~300 ms. outlines was not measured: its
vocabulary index needs the Hub or a hand conversion of the tokenizer.

`grammar_for` turns a schema into a grammar and checks it; `Constraint` is one request's
matcher, which computes its first mask once as it is built (a grammar with no first token is
refused there). Both are built in the preparation pool (core.engine.prepare), so a bad schema is
refused before the request is queued and compiling a large one never stalls the engine
thread. The engine thread only drives the matchers: each first consumes the token chosen at
the last step (mlx-lm samples the next token before the engine sees the last one), then
masks the step's log-probabilities; the batch sampler masks all of a step's grammar rows in
one call (`masks`, on llguidance's threads), `Constrained` one row alone. A matcher
that cannot go on (a limit of llguidance's parser, a token refused) raises
`ConstraintFailed`, and the engine fails that request with its sentence
(core/engine/emit.py). The tokenizer llguidance needs is built once per model.

Whitespace is compact (no free newlines or indentation): small models otherwise fill a
reply with blank lines that the grammar allows.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from radixchat.core.seam.requests import GRAMMAR_LIMIT
from radixchat.core.seam.schema_finite import finite

if TYPE_CHECKING:
    import mlx.core as mx
    from llguidance import LLExecutor, LLTokenizer
    from llguidance._lib import JsonCompileOptions
    from mlx_lm.sample_utils import Sampler

    class _Request(Protocol):
        """What `Constrained` notes a failure on: the engine's Active (core.engine.active, which
        imports this module)."""

        error: BaseException | None


_COMPACT: JsonCompileOptions = {"whitespace_flexible": False}
_tokenizers: dict[int, LLTokenizer] = {}
_lock = threading.Lock()


class SchemaError(ValueError):
    pass


EMPTY = "no reply can satisfy this grammar (it admits no text, or is too deep for the constraint engine)"


class ConstraintFailed(RuntimeError):
    """The grammar could not go on mid-reply (a limit of llguidance's parser, a token it
    refused): the request fails with this fixed sentence, and `detail` (llguidance's words)
    goes to the log. Without it llguidance's mask, once its matcher is in error, allows only
    the end of the text, and the reply ended as a "stop" with broken JSON."""

    MESSAGE = GRAMMAR_LIMIT

    def __init__(self, detail: str):
        super().__init__(self.MESSAGE)
        self.detail = " ".join(detail.split())[:500]  # on one line, cut short


def grammar_for(schema: dict[str, Any] | str) -> str:
    """The llguidance grammar of a JSON schema (or of its JSON text, where the caller has
    it already); raises SchemaError with the reason."""
    import llguidance

    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=_COMPACT)
    except (ValueError, TypeError) as e:
        raise SchemaError(f"not a usable JSON schema: {e}") from None
    grammar = _checked(grammar, "JSON schema")
    # after llguidance's own checks, whose refusals say more; it ran into the depth mid-reply
    if not finite(json.loads(text) if isinstance(schema, str) else schema):
        raise SchemaError(EMPTY)
    return grammar


def grammar_of_lark(lark: str) -> str:
    """An llguidance Lark grammar (tool calls: core/seam/tools.py), checked."""
    import llguidance

    return _checked(llguidance.LLMatcher.grammar_from_lark(lark), "grammar")


def _checked(grammar: str, what: str) -> str:
    """`grammar` if llguidance accepts it (warnings pass); SchemaError with its reason if not."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise SchemaError(f"not a usable {what}: {error}")
    return grammar


def _tokenizer(tokenizer: Any, vocab_size: int) -> LLTokenizer:  # (mlx-lm's TokenizerWrapper)
    """llguidance's view of the model's tokenizer (~0.5 s to build: once per model)."""
    import llguidance.hf

    key = id(tokenizer)
    with _lock:
        if key not in _tokenizers:
            _tokenizers[key] = llguidance.hf.from_tokenizer(
                tokenizer._tokenizer, n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_token_ids)
            )
        return _tokenizers[key]


class Constraint:
    """One request's grammar state. Engine thread only."""

    def __init__(self, grammar: str, tokenizer: Any, vocab_size: int):
        import llguidance
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self.matcher = llguidance.LLMatcher(_tokenizer(tokenizer, vocab_size), grammar, log_level=0)
        if self.matcher.is_error():
            raise SchemaError(self.matcher.get_error())
        self.vocab_size = vocab_size
        # The first token's mask, made here (the preparation pool) and thrown away: a grammar
        # that admits no text at all (a schema defined only by itself, `{"$ref": "#"}`) or
        # whose first mask already runs into llguidance's limits (a required child of its own
        # type) failed at the request's first step, a 500 or an error after a 200's first chunk
        fill_next_token_bitmask(self.matcher, allocate_token_bitmask(1, vocab_size), 0)
        if self.matcher.is_error():
            raise SchemaError(EMPTY)  # (llguidance's own words name its internals)
        self._fresh()

    def _fresh(self) -> None:
        self.previous: mx.array | None = None  # the token array the last call returned
        self.consumed = 0  # tokens the matcher has consumed
        self.last_s = self.avg_s = 0.0  # time of the latest mask, and a moving average (core.engine.sched.mask_share)

    def copy(self) -> Constraint:
        """Another request's state of the same grammar, where this one is: a copy of the
        matcher, compiled already (core.engine.sample.grammar_cache copies one never moved on)."""
        twin = object.__new__(Constraint)
        twin.matcher, twin.vocab_size = self.matcher.deep_copy(), self.vocab_size
        twin._fresh()
        return twin

    def mask(self, logprobs: mx.array) -> mx.array:
        """`logprobs` (1, V) with every token the grammar forbids at -inf (one row alone, as
        `masks` does a decoding batch's rows)."""
        import mlx.core as mx

        allowed, failed = masks([self], logprobs.shape[-1])
        if failed[0] is not None:
            raise failed[0]
        return mx.where(mx.array(allowed), logprobs, -mx.inf)

    def _consume(self) -> None:
        """The matcher takes the token the last call chose (evaluated by the caller)."""
        if self.previous is not None:
            # (item() is a token id, an int; MLX's stub says any scalar, complex too)
            if not self.matcher.consume_token(int(self.previous.item())):  # type: ignore[arg-type]
                raise ConstraintFailed(self.matcher.get_error())
            self.consumed += 1
            self.previous = None

    def _timed(self, seconds: float) -> None:
        self.last_s = seconds
        self.avg_s = seconds if not self.avg_s else 0.8 * self.avg_s + 0.2 * seconds

    def chose(self, token: mx.array) -> None:
        self.previous = token

    def rewind(self, delivered: int) -> None:
        """Back to the state after `delivered` tokens: what was sampled beyond them never
        reached the client (a preempted request's pipelined next token), and is sampled again."""
        if self.consumed > delivered:
            self.matcher.rollback(self.consumed - delivered)
            self.consumed = delivered
        self.previous = None


class Constrained:
    """A grammar's row sampler: its mask, then the request's own sampler (`inner`: None for
    the argmax, a `Draw`, a logit_bias's function). The batch sampler masks every such row of
    a step at once (`masks`) and draws each by its `inner` (core.engine.sample.batch_sampler); a call
    masks and draws one row alone (mlx-lm's own step). A failure is noted on `request` (its
    `error`: the engine ends that request, not the batch) and the row takes its argmax."""

    __slots__ = ("constraint", "inner", "request")

    def __init__(self, constraint: Constraint, inner: Sampler | None, request: _Request | None = None):
        self.constraint, self.inner, self.request = constraint, inner, request

    def __call__(self, logprobs: mx.array) -> mx.array:
        import mlx.core as mx

        try:
            masked = self.constraint.mask(logprobs)
            token = mx.argmax(masked, axis=-1) if self.inner is None else self.inner(masked)
        except Exception as e:
            if self.request is None:
                raise
            self.request.error = e
            return mx.argmax(logprobs, axis=-1)
        self.constraint.chose(token)
        return token

    def rewind(self, delivered: int) -> None:
        self.constraint.rewind(delivered)
        rewind = getattr(self.inner, "rewind", None)
        if rewind is not None:
            rewind(delivered)


_pool: LLExecutor | None = None


def _executor() -> LLExecutor:
    """llguidance's thread pool for batched masks, made once."""
    global _pool
    with _lock:
        if _pool is None:
            import llguidance

            _pool = llguidance.LLExecutor()
        return _pool


def masks(rows: list[Constraint], vocab: int) -> tuple[np.ndarray, list[ConstraintFailed | None]]:
    """Every row's next-token mask at once: (len(rows), vocab) booleans, and each row's
    failure (None: masked). Each matcher first takes the token it chose last; then
    llguidance fills all the masks on its own threads, in parallel and with the GIL released
    (a loop of `mask` filled them one after another on the engine thread, holding up the
    server's other threads between them: on the bundled model 32 rows of a regex-heavy schema
    took 4.1 ms a step (median) that way, 2.0 ms at once). Each row is timed at the call's
    share (core.engine.sched.mask_share sums them by owner: a caller masks one owner's rows a call)."""
    import mlx.core as mx
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

    mx.eval([c.previous for c in rows if c.previous is not None])  # the last step's tokens
    tic = time.perf_counter()
    failed: list[ConstraintFailed | None] = []
    for c in rows:
        try:
            c._consume()
            failed.append(None)
        except ConstraintFailed as e:
            failed.append(e)
    bitmask = allocate_token_bitmask(len(rows), vocab)
    live = [(c.matcher, i) for i, (c, f) in enumerate(zip(rows, failed)) if f is None]
    if live:
        fill_next_token_bitmask_par(_executor(), live, bitmask)
    for i, c in enumerate(rows):
        if failed[i] is None and c.matcher.is_error():
            failed[i] = ConstraintFailed(c.matcher.get_error())
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab].astype(bool)
    each = (time.perf_counter() - tic) / len(rows)
    for c in rows:
        c._timed(each)
    return allowed, failed
