"""What a client asks the engine for, and what the engine sends back.

Requests are pydantic models validated in the caller's thread, so a bad request is
refused before it reaches the engine. Events are plain dataclasses pushed by the engine
thread: `TextDelta`s while generating, then exactly one `Finished` or `Failed`.

Seeds: a request with a seed samples from its own PRNG stream, so the same seed, prompt,
parameters and model give the same tokens whether the request ran alone or batched,
unless batching changes a logit by a rounding error at a near-tie (the batched matmul
may sum in another order). Greedy decoding (temperature 0) ignores the seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class RequestError(ValueError):
    """A request the engine refuses; `status` is the HTTP status a server should use."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class UserLimit(RequestError):
    """A user who already has `mine` requests in flight, the most they may have at once."""

    def __init__(self, mine: int):
        super().__init__(
            f"you already have {mine} request{'s' * (mine != 1)} waiting or running, the most one "
            "user may have at once: retry when one has finished",
            429,
            "user_limit",
        )


class QueueFull(RequestError):
    def __init__(self, depth: int):
        super().__init__(f"server busy: {depth} requests already queued, retry shortly", 429, "queue_full")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    # tool calling (core/seam/tools.py): an assistant's calls, and which call a tool answers
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # signed or unsigned 64-bit, as clients send them
MAX_STOP_CHARS = 1000
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class Sampling(BaseModel):
    """How to pick tokens. Every field is checked here, and `top_k` against the model's
    vocabulary at submit: a value that passes can't fail inside a batched step."""

    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(0.0, ge=0.0, le=5.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)  # 0: off
    max_tokens: int | None = Field(None, gt=0)
    stop: list[str] = Field(default_factory=list, max_length=8)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks)
    # penalties on the tokens of the sequence's last PENALTY_CONTEXT (core/engine/sample/sampling.py):
    # OpenAI's additive ones (0: off) and the multiplicative one of vLLM and mlx-lm (1: off)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0, allow_inf_nan=False)
    # token id -> added to its log-probability before sampling (OpenAI's range); token ids
    # are checked against the vocabulary at submit, like top_k
    logit_bias: dict[int, float] = Field(default_factory=dict, max_length=300)
    # report each generated token's log-probability and this many alternatives (None: off)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # the reply is JSON valid against this schema ({"type": "object"}: any JSON object),
    # enforced while sampling (core/engine/sample/constrain.py)
    json_schema: dict[str, Any] | None = None
    # or this llguidance Lark grammar (tool_choice "required" or a named function)
    lark: str | None = None

    @property
    def constrained(self) -> bool:
        """Does the reply follow a grammar (a JSON schema or a forced tool call)?"""
        return self.json_schema is not None or self.lark is not None

    @model_validator(mode="after")
    def _schema_ends(self) -> Sampling:
        if self.constrained and self.ignore_eos:
            raise ValueError("ignore_eos cannot be used with a JSON schema: the reply ends where the JSON does")
        if self.json_schema is not None and self.lark is not None:
            raise ValueError("a reply follows one grammar: a JSON schema or a tool call, not both")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[int, float]) -> dict[int, float]:
        if any(not -100 <= b <= 100 for b in v.values()):
            raise ValueError("logit_bias values must be between -100 and 100")
        if any(t < 0 for t in v):
            raise ValueError("logit_bias keys must be token ids (non-negative integers)")
        return v

    @field_validator("stop")
    @classmethod
    def _nonempty_stops(cls, v: list[str]) -> list[str]:
        if any(s == "" for s in v):
            raise ValueError("stop strings must not be empty")
        if any(len(s) > MAX_STOP_CHARS for s in v):
            raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters")
        return v

    @property
    def key_seed(self) -> int | None:
        """The seed as the unsigned 64-bit value a PRNG key takes (a negative one wraps)."""
        return None if self.seed is None else self.seed % 2**64


OWNER_PREFIX = "key:"


@overload
def owner_of(cache_key: str) -> str: ...
@overload
def owner_of(cache_key: None) -> None: ...
def owner_of(cache_key: str | None) -> str | None:
    """The `owner` of a signed-in user's requests, one for the page and the API alike, so the
    same person has one namespace in the prefix cache and one share of the engine (None: the
    one trusted user of --no-auth). It comes from the user's random cache key (the store's
    `User.cache_key`), never from their id: an id is reused once its user is removed, and the
    next user must not find the removed one's cached text (in memory, on disk, after a restart)."""
    if cache_key is None:
        return None
    if not isinstance(cache_key, str) or len(cache_key) < 16:
        raise ValueError("a user's cache key is missing")  # never one namespace for several users
    return OWNER_PREFIX + cache_key


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[ChatMessage] = Field(min_length=1)
    sampling: Sampling = Field(default_factory=Sampling)
    # functions the model may call, given to its chat template (OpenAI's `tools` shape)
    tools: list[dict[str, Any]] | None = None
    # the chat template's thinking switch (enable_thinking), for a model whose template has
    # one (ModelInfo.thinking_switch); None: mlx-lm's default (on where the tokenizer has
    # thinking tokens)
    thinking: bool | None = None
    # who sends it: after the system message, the prefix cache keeps this request's tokens
    # where only the same owner's requests find them (None: the one user of --no-auth)
    owner: str | None = None
    # how many requests the owner may have waiting or running at once, their own limit where an
    # admin set one (None: the server's --max-user-requests)
    owner_limit: int | None = Field(default=None, ge=1)
    # the last message is an answer of the assistant's cut short (by max_tokens, or a client's
    # prefill): the reply goes on from its text, in the same turn, rather than answering it
    continue_final: bool = False

    @model_validator(mode="after")
    def _last_turn(self) -> ChatRequest:
        last = self.messages[-1]
        if not self.continue_final:
            if last.role == "assistant":
                raise ValueError("messages: the last message must come from the user or system, not the assistant")
        elif last.role != "assistant" or last.tool_calls or len(self.messages) < 2:
            raise ValueError("messages: continuing needs an assistant's text after another message to go on from")
        return self


class PromptRequest(BaseModel):
    """A plain completion: text the engine tokenizes as it is (no chat template, no system
    message, so all of it is cached in `owner`'s part of the prefix cache)."""

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)
    sampling: Sampling = Field(default_factory=Sampling)
    owner: str | None = None
    owner_limit: int | None = Field(default=None, ge=1)  # (as ChatRequest's)


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    queue_ms: float = 0.0
    ttft_ms: float | None = None
    total_ms: float = 0.0
    decode_tps: float = 0.0


@dataclass
class TokenLogprob:
    """One generated token as a request with `logprobs` sees it: its text, its
    log-probability under the model, and the most likely alternatives (text, logprob)."""

    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class TextDelta:
    text: str
    logprobs: list[TokenLogprob] | None = None  # the tokens since the last delta (with `logprobs`)


@dataclass
class Finished:
    text: str
    finish_reason: Literal["stop", "length", "cancelled"]
    usage: Usage = field(default_factory=Usage)
    logprobs: list[TokenLogprob] | None = None  # every generated token's (with `logprobs`)
    stop_sequence: str | None = None  # the stop string that ended it, if one did


# A request whose grammar (its JSON schema or forced tool call) ran into a limit of the
# constraint engine mid-reply fails with this sentence: its own input's fault, which the API
# answers as a 400 (webui/api/generation.py), or streamed as a client's error, not the server's
GRAMMAR_LIMIT = (
    "structured output could not go on: the reply's grammar ran into a limit of the "
    "constraint engine (a simpler schema may work)"
)


@dataclass
class Failed:
    message: str
    usage: Usage = field(default_factory=Usage)

    @property
    def theirs(self) -> bool:
        """The request's own input failed it (GRAMMAR_LIMIT), not the server."""
        return self.message == GRAMMAR_LIMIT


Event = TextDelta | Finished | Failed
