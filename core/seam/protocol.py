"""The seam between the web layer and an engine: what webui/ may know of one.

`EngineClient` is a small protocol: `submit`/`asubmit` a request and get a `RequestHandle`
that streams events, `cancel` one, `forget` a removed user's cache entries (or a deleted
conversation's: `forget_conversation`), `tokenize` text, read `stats()` (a typed snapshot)
and `info` (a plain `ModelInfo`). webui/ imports this module, core.seam.requests (the
requests and events) and core.seam.handle (the handle), nothing else of core/engine: it
never sees an nn.Module, a tokenizer, the batch or the prefix tree, so another
implementation (a second model's engine, an engine on another machine) can stand behind the
same routes and page. core.engine.engine.Engine is the in-process one;
tests/support/fake_engine.py is one with no model at all, for the web layer's unit tests.
`Engines` is the served models, by name, each an EngineClient (core.engine.models.ModelSet
is the one there is): the routes pick a request's engine by its `model`. `Lifecycle` (halt,
stop, fatal) is what only the composition root calls, on each of them.

Value types only here (no MLX, no threads): `stats()` is safe from any thread and is a
copy, so a reader may keep it. Counts mean one thing everywhere they are shown (/health,
/metrics, the page's Server tab): `running` requests are in the engine's batch (prefilling
or decoding), `waiting` ones were accepted and are not in the batch yet (queued, waiting for
their turn in the fair queue or for their prefix to come back from disk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from radixchat.core.models.catalog import Card
    from radixchat.core.seam.handle import RequestHandle
    from radixchat.core.seam.requests import ChatRequest, PromptRequest


@dataclass(frozen=True)
class ModelInfo:
    """The served model, as a client or a page may describe it."""

    model_id: str
    num_params: int
    dtype: str
    context_length: int
    vocab_size: int
    card: Card | None = None  # name, size, license, note, recommended sampling
    tool_format: str | None = None  # the chat template's tool-call format (None: it has none)
    thinking_switch: bool = False  # its chat template turns thinking on and off (enable_thinking)
    notice: str = ""  # said once at start-up, e.g. that the default model fell back to the tiny one
    created: int = 0  # when it started serving (Unix seconds): OpenAI's `created` of the model
    sharded: str = ""  # under mlx.launch: one line on the group (size, backend, ranks); else ""
    weights_bytes: int = 0  # what its weights take in memory here
    kv_bits: int = 16  # the precision its K/V is attended over and cached at (--kv-bits; 16: its dtype's)
    kv_batch_codes: bool = False  # its decoding batch holds K/V at that precision too (--kv-batch)
    kv_group: int = 0  # numbers per scale at that precision (--kv-group-size at 8 bits; 0 at 16)

    @property
    def sampling_defaults(self) -> dict[str, float]:
        """What the model's card recommends (temperature, top_p) for requests that leave them out."""
        return dict(self.card.sampling) if self.card else {}


@dataclass(frozen=True)
class PrefixCacheStats:
    """The radix tree's figures (core.cache.radix.RadixTree.summary)."""

    nodes: int = 0
    cached_tokens: int = 0
    bytes: int = 0
    disk_nodes: int = 0
    disk_tokens: int = 0
    spills: int = 0
    budget: int = 0
    reserved: int = 0
    locks: int = 0
    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    lookup_tokens: int = 0
    evictions: int = 0
    evicted_tokens: int = 0
    restore_ms: float = 0.0


@dataclass(frozen=True)
class DiskCacheStats:
    """The disk tier's figures (core.cache.disk.tier.DiskTier.summary)."""

    bytes: int = 0
    budget: int = 0
    folder: str = ""
    backlog_bytes: int = 0
    deleting: int = 0
    waiting: int = 0
    reading: int = 0
    files: int = 0
    adopted: int = 0  # entries found at start-up and placed in the tree
    writes: int = 0
    write_bytes: int = 0
    write_s: float = 0.0
    serialize_s: float = 0.0
    loads: int = 0  # entries read back for requests: hits from disk
    load_tokens: int = 0
    snapshot_loads: int = 0
    read_s: float = 0.0
    load_s: float = 0.0
    dropped: int = 0  # corrupt, unreadable, or a failed write
    unwritten: int = 0  # nodes the memory tier evicted without a file: stored once, never reused
    evicted: int = 0
    refused: int = 0  # entries not written: larger than the limit or their owner's share, or no room
    open_s: float = 0.0
    fingerprint_s: float = 0.0


@dataclass(frozen=True)
class ShardStats:
    """Under mlx.launch: the group and whether its ranks agree (no hosts or pids)."""

    size: int
    backend: str
    sharding: str
    in_step: bool | None
    messages: int
    message_bytes: int


@dataclass(frozen=True)
class SpeculationStats:
    """Prompt-lookup speculation's counters (core.engine.step.speculate.Speculator.summary)."""

    max_draft: int
    steps: int
    waits: int
    rows_verified: int
    rows_drafting: int
    drafted: int
    accepted: int
    acceptance: float | None
    tokens_per_draft: float | None


@dataclass(frozen=True)
class MlxMemoryStats:
    """MLX's allocator as the engine thread last read it, after a step (its counters are the
    process's: the engines of several models read the same ones). Bytes."""

    active: int  # arrays alive: weights, K/V, the step under way
    cache: int  # freed buffers MLX keeps for reuse, at most `cache_limit`
    peak: int  # the most `active` since start
    step_peak: int  # the largest rise within one step over what stayed alive after it: activations, logits
    step_bound: int  # what one step's logits may take, from the model and the settings
    cache_limit: int  # --mlx-cache-bytes, set at start
    # what MLX's arrays may take beyond the weights and the K/V budget (the decoding batch's
    # spare rows and columns, a step's activations: core.platform.memory.arrays_beyond)
    beyond: int = 0


@dataclass(frozen=True)
class EngineStats:
    """One snapshot of an engine, for /health, /metrics and the Server tab."""

    alive: bool
    running: int  # in the batch: prefilling or decoding
    waiting: int  # accepted, not in the batch yet
    steps: int = 0
    max_batch: int = 0
    kv_budget: int = 0  # bytes of K/V the running batch and the prefix cache share
    kv_bytes_per_token: int = 0
    batch_tokens: int = 0  # tokens of running sequences the K/V budget has room for
    preemptions: int = 0  # running requests sent back to wait to make room (they resume)
    preempted_tokens: int = 0  # tokens those held when they left: restored or recomputed on resuming
    # `preemptions` by the policy that chose them (core.engine.sched.plan.Why): "room", "masks", "owed"
    preemptions_by: dict[str, int] = field(default_factory=dict)
    prefix_cache: PrefixCacheStats | None = None
    disk_cache: DiskCacheStats | None = None
    shards: ShardStats | None = None
    speculation: SpeculationStats | None = None
    memory: MlxMemoryStats | None = None  # once the engine thread has started

    @property
    def inflight(self) -> int:
        """Accepted and not ended: running or waiting."""
        return self.running + self.waiting


@runtime_checkable
class EngineClient(Protocol):
    """What the web layer asks of an engine. Every method is safe from any thread."""

    @property
    def info(self) -> ModelInfo:
        """The model it serves (fixed once it serves)."""
        ...

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        """Check, template (or tokenize) and queue a request; raises RequestError (or its
        QueueFull) when refused. The caller's thread waits while the request is templated:
        from an event loop use `asubmit`."""
        ...

    async def asubmit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        """`submit` for asyncio callers: templating and grammar compiling run off the event
        loop, and the handle delivers its events to the calling loop."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a queued or running request; its handle ends with finish reason `cancelled`."""
        ...

    def forget(self, owner: str) -> None:
        """Drop every prefix-cache entry of `owner`'s namespace, in memory and on disk, and
        never cache anything of theirs again: a removed user's private text must not outlive
        them. Returns at once; entries a running request holds go as well (it ends as usual)."""
        ...

    def forget_conversation(self, owner: str | None, messages: list[dict[str, Any]]) -> None:
        """Drop `owner`'s prefix-cache entries of a deleted conversation, in memory and on
        disk: `messages` is how its prompts begin (its system message, if any, and one
        version of its first user message). What other prompts share (a system message, a
        beginning another conversation has too) stays. Blocking while they are templated:
        not on an event loop."""
        ...

    async def count_tokens(self, request: ChatRequest) -> int:
        """The prompt tokens `request` would take once templated (its tools too); nothing is
        queued, but it counts against its owner's limit while it runs. RequestError as
        `submit` refuses what it cannot template, or an owner at their limit."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for plain text (no chat template). Blocking: not on an event loop."""
        ...

    def stats(self) -> EngineStats:
        """A snapshot of what runs and waits, and the caches' figures."""
        ...


@dataclass(frozen=True)
class ServedModel:
    """One model a server serves: its id, the other names a request may give it, whether
    it is loaded now, and whether it stays loaded."""

    model_id: str
    aliases: tuple[str, ...] = ()
    is_loaded: bool = False
    pinned: bool = False


@runtime_checkable
class Engines(Protocol):
    """What the web layer asks of the models a server serves (core.engine.models.ModelSet):
    one engine per model, behind the EngineClient above."""

    @property
    def default(self) -> EngineClient:
        """The first model's engine, always loaded: the page's, and `default`'s."""
        ...

    def served(self) -> list[ServedModel]:
        """Every served model, the first first."""
        ...

    def find(self, name: str) -> ServedModel:
        """The model `name` names (its id or an alias), loaded or not; nothing loads.
        RequestError 404 `model_not_found` naming the served ids."""
        ...

    def serving(self) -> Sequence[EngineClient]:
        """The engines loaded now."""
        ...

    def engine(self, name: str) -> EngineClient:
        """The engine of the model `name` names, loaded now if it is not (blocking: not on
        an event loop). RequestError 404 `model_not_found` naming the served ids, or 503
        `model_unavailable` when it could not be loaded."""
        ...

    async def aengine(self, name: str) -> EngineClient:
        """`engine` for asyncio callers."""
        ...

    def forget(self, owner: str) -> None:
        """EngineClient's `forget` on every model, also those loaded later."""
        ...

    def forget_conversation(self, owner: str | None, messages: list[dict[str, Any]]) -> None:
        """EngineClient's `forget_conversation` on every loaded model."""
        ...

    def memory_bound(self) -> list[tuple[str, int]] | None:
        """What the process running these engines will take at most, part by part (bytes;
        named, the total last), as the engines reckon it now: every loaded model's weights
        and K/V budget, MLX's arrays beyond them, its buffer cache and the rest. None where
        that process is not this one (engines elsewhere)."""
        ...


@runtime_checkable
class Lifecycle(Protocol):
    """What the composition root (radixchat.webui.cli.main) does with the engines it built, beside
    what the web layer asks of them: an engine, a remote one and a set of them alike. The
    routes and the page never call it."""

    @property
    def fatal(self) -> str | None:
        """Why it stopped on its own (a sharded server's lost rank), or None: the server
        reports it and exits with an error."""
        ...

    def halt(self) -> None:
        """The server is stopping: it takes no more work, and what it has in flight ends as
        cancelled (a reply's text so far kept). Bounded; `stop` follows."""
        ...

    def stop(self) -> None:
        """Let go of everything (threads, connections, the model); what is left in flight fails."""
        ...
