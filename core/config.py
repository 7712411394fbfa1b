"""Settings: one pydantic-settings model, read from RADIXCHAT_* variables and CLI flags.

This module only describes and validates settings. Parsing flags is the CLI's job
(webui/cli/main.py), which passes them here as keyword overrides; turning a validation
error into a one-line message is `settings_error_line`. The settings that list client
addresses (--metrics-allow, --forwarded-allow-ips) are read by `address_rule`, and a
client's address is judged by `address_allowed`, wherever the server asks (webui/).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """Per-user data folder (XDG on Linux, Application Support on macOS), never the repo."""
    if os.uname().sysname == "Darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "radixchat"


# --cache-disk-bytes auto: no fixed number, the tier follows the disk's free space
# (core/cache/disk/budget.py). An int larger than any real budget, so that "on" stays
# `cache_disk_bytes > 0` wherever it is asked. `radixchat serve` defaults to it
# (webui/cli/main.py); the model's default stays 0, so that an engine built in-process (tests,
# benchmarks) writes nothing into the user's data folder unless asked.
DISK_AUTO = (1 << 63) - 1


# Units of a size: K, M, G, T (and KB, MB...) are powers of ten as disks are sold; Ki, Mi,
# Gi, Ti (and KiB...) powers of two as memory is. Case does not matter: "2gb" is 2 GB.
_UNITS = {"": 1, "b": 1}
for _i, _u in enumerate("kmgt", start=1):
    _UNITS |= {_u: 1000**_i, _u + "b": 1000**_i, _u + "i": 1024**_i, _u + "ib": 1024**_i}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)
SIZE_FORMS = "2e9, 2G or 2GB (G = 10^9), 2GiB or 2Gi (Gi = 2^30), 512M, 512MiB, 64K, 64KiB"


def parse_size(value):
    """A number of bytes from what a flag, a variable or a TOML file gives: an int as it is
    (the field's own bounds judge it), a whole float (TOML reads 2e9 as one), or text in
    SIZE_FORMS. Anything else raises pydantic's own error, which names the setting."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = None
    if isinstance(value, float) and math.isfinite(value):
        number = Decimal(value)
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)) and m[2].lower() in _UNITS:
        number = Decimal(m[1]) * _UNITS[m[2].lower()]
    if number is None:
        negative = isinstance(value, str) and value.strip().startswith("-")
        why = "cannot be negative" if negative else "should look like " + SIZE_FORMS
        raise PydanticCustomError("byte_size", "a size in bytes {why}, got {value}", {"why": why, "value": repr(value)})
    if number != number.to_integral_value():
        raise PydanticCustomError("byte_size", "a whole number of bytes, got {value}", {"value": repr(value)})
    return int(number)


# every setting named *_bytes has this type, so each takes the same forms
ByteSize = Annotated[int, BeforeValidator(parse_size)]
SIZES_HELP = f"; sizes: {SIZE_FORMS}, any case"


# what a server may set for requests that leave it out (sampling_defaults)
SAMPLING_DEFAULTS = {"temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"}


KVBatch = Literal["auto", "codes", "values"]  # what the decoding batch holds at --kv-bits 8 or 4
# --kv-group-size: numbers per scale at 8 bits (what MLX's affine matmul, which reads a batch
# that holds codes, takes); at 4 bits nvfp4's groups are 16 by the format's definition
KV_GROUP_SIZES = (32, 64, 128)


def kv_group_refusal(bits: int, group: int | None) -> str | None:
    """Why --kv-group-size `group` cannot go with --kv-bits `bits` (None: it can)."""
    if group is None:
        return None
    why = f"kv_group_size {group}: at kv_bits 8, one of {', '.join(map(str, KV_GROUP_SIZES))}"
    if bits == 16:
        return f"{why}; at kv_bits 16 K/V keeps the model's dtype, without groups"
    if bits != 8:
        return f"{why}; at kv_bits {bits} the format's groups are fixed by its definition"
    return None if group in KV_GROUP_SIZES else why


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RADIXCHAT_", extra="forbid", validate_default=True)

    model: str = Field(
        "default",
        description="An mlx-lm model folder, a .gguf file, a hub id, or "
        "default (SmolLM2-135M-Instruct where installed, else tiny), smollm2, tiny",
    )
    extra_models: list[str] = Field(
        default_factory=list,
        description="More models to serve beside --model (on the command line: --model again), "
        "each loaded on the first request that names it",
    )
    models: Path | None = Field(
        None,
        description="A TOML file of the models to serve ([[model]] tables: path, id, aliases, "
        "pinned, context_length, temperature, top_p), the first the default; instead of --model",
    )
    served_model_name: str | None = Field(
        None, min_length=1, description="The id the model is served under (default: its card's or folder's name)"
    )
    sampling_defaults: dict[str, float] | None = Field(
        None,
        description="Sampling for requests that leave it out (temperature, top_p, the penalties), "
        "over the model card's (a --models file sets it per model)",
    )
    model_idle_s: float = Field(
        600.0,
        ge=0,
        description="Unload a model other than the first after this many seconds without requests (0: never)",
    )
    memory_bytes: ByteSize | None = Field(
        None,
        ge=0,
        description="Memory for every loaded model's weights and K/V budget together (default: "
        "three quarters of this machine's): a model loads only if it fits, idle ones "
        "unloaded first (0: no limit)" + SIZES_HELP,
    )
    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 serves the LAN")
    port: int = Field(8000, ge=1, le=65535, description="TCP port")
    db: Path = Field(default_factory=lambda: default_data_dir() / "radixchat.db", description="SQLite file")
    cache_bytes: ByteSize | None = Field(
        None,
        ge=0,
        description="K/V byte budget shared by the running batch "
        "and the prefix cache (default: a fifth of this machine's memory, less where the "
        "process could then take more than three quarters of it)" + SIZES_HELP,
    )
    mlx_cache_bytes: ByteSize | None = Field(
        None,
        ge=0,
        description="Freed buffers MLX may keep for reuse (default: an eighth of the K/V budget, "
        "between 32 MiB and 256 MiB; 0: none kept)" + SIZES_HELP,
    )
    prefix_cache: bool = Field(True, description="Share a radix prefix KV cache across requests")
    kv_bits: Literal[16, 8, 4] = Field(
        16,
        description="Precision of the K/V every cache attends over: 16 = the model's own dtype; 8 = signed "
        "bytes with a bfloat16 scale per 32 numbers (--kv-group-size); 4 = MLX's nvfp4 format. The prefix cache and its disk "
        "tier hold K/V at that size (about 0.53x or 0.28x of 16-bit K/V: more conversations stay cached in the "
        "same budget), the decoding batch as --kv-batch says (a --models file sets it per model)",
    )
    kv_group_size: int | None = Field(
        None,
        description="Numbers per scale at --kv-bits 8: 32 (the default), 64 or 128 (a coarser scale, in "
        "fewer bytes: about 0.52x or 0.51x of 16-bit K/V against 0.53x). Refused at 16 and at 4 bits "
        "(nvfp4's groups are 16 by its definition)",
    )
    kv_batch: KVBatch = Field(
        "auto",
        description="What the decoding batch holds at --kv-bits 8 or 4: codes = the format's codes, "
        "read by MLX's quantized attention (the batch's K/V at about the prefix cache's size); values = their "
        "round trip at the model's dtype; auto = codes on a GPU, values on a CPU (where quantized "
        "attention is the slower)",
    )
    cache_sharing: Literal["system", "all", "user"] = Field(
        "system",
        description="What the prefix cache shares between users: the system message "
        "(default), everything (one trusted user) or nothing",
    )
    cache_disk_bytes: ByteSize = Field(
        0,
        ge=0,
        description="Byte budget of the prefix cache's disk tier, whose entries "
        "survive restarts (least recently used dropped first): auto = a quarter of "
        "what the disk could give it, re-read every few seconds; a number = at most "
        "that many bytes; either way a tenth of the disk (at least 1 GiB) is left "
        "free, and one user's entries hold at most a share; 0 = no disk tier. "
        "Default: auto for `radixchat serve` (off under mlx.launch), 0 for `ask` and "
        "engines built in-process" + SIZES_HELP,
    )
    cache_disk_writes: Literal["reused", "all"] = Field(
        "reused",
        description="What the disk tier writes: `reused` = a node once another request's "
        "sequence has gone through it (a conversation from its second turn on, a shared "
        "system message from its second user on; what was stored once and never reused is "
        "dropped when evicted, and recomputed after a restart); `all` = every stored "
        "sequence as it is stored",
    )
    shard_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Under mlx.launch: how long rank 0 waits "
        "on the other ranks in one step before it fails the requests in "
        "flight and stops (a rank that died is noticed at once)",
    )
    cache_dir: Path | None = Field(
        None,
        description="Folder of the disk tier (default: kv-cache in the "
        "folder of --db); only the server's user may read it",
    )
    warm_prompts: Path | None = Field(
        None,
        description="A file of system prompts (a JSON list of strings, "
        "or paragraphs separated by blank lines) prefilled at start-up, with "
        "the presets; the presets alone are prefilled whenever the disk tier is on",
    )
    warm_presets: bool = Field(
        True, description="With the disk tier on, prefill the system-prompt presets at start-up in the background"
    )
    max_batch: int = Field(
        256,
        ge=1,
        le=1024,
        description="Upper bound on sequences decoding at once; the working limit is what the K/V budget holds",
    )
    # an upper bound, not the working size: the stepper lets prompts join while the step's room
    # gives each a fair chunk (core/engine/step/stepper.py `_joining`). A count of 4 let 32 users who
    # arrive at once start four at a time (BENCHMARKS.md, "How many prompts prefill together":
    # TTFT p95 13.8 s against 7.9 s at 32 users)
    max_prefill_batch: int = Field(
        32, ge=1, le=1024, description="Most prompts prefilled together (at most --max-batch)"
    )
    prefill_step: int = Field(512, ge=16, description="Most prompt tokens of one prompt per prefill step")
    step_tokens: int = Field(
        256,
        ge=0,
        description="Token budget of one engine step: each decoding "
        "stream counts one, new prompts prefill in chunks in the rest (at least a "
        "quarter); 0 = mlx-lm's own order (decode, then a whole prefill step)",
    )
    prefill_s: float = Field(
        0.25,
        ge=0,
        description="Seconds the shared prefill of one engine step may take, about: its chunk is cut to what "
        "fits at the latest chunks' cost per token (never under 64 tokens), so a newcomer's prompt waits for a "
        "short step in flight; 0 = the token budget alone",
    )
    kv_slots: bool = Field(
        True,
        description="Keep the decoding batch's K/V in buffers with spare rows "
        "and columns, so a request joining or leaving copies its own row, not the "
        "whole batch (with --step-tokens > 0); off = mlx-lm's BatchKVCache",
    )
    speculate: int = Field(
        0,
        ge=0,
        le=8,
        description="Speculative decoding: each greedy stream drafts "
        "up to this many tokens by looking up its last words in its own prompt and "
        "reply (prompt lookup), verified in the batched step, so replies that quote "
        "their context come faster, token for token the same (needs --kv-slots); 0 = off",
    )
    cpu_ops: bool = Field(
        True,
        description="On a CPU (Linux), run the model's attention, SwiGLU and RoPE "
        "in forms MLX's CPU backend computes faster (core/engine/step/cpu_ops.py); no "
        "effect on a Mac's GPU; off = mlx-lm's own functions",
    )
    max_queue: int = Field(256, ge=1, description="Most requests waiting or running before new ones are refused")
    max_user_requests: int = Field(
        32,
        ge=1,
        description="Most requests one user may have waiting or "
        "running at once (--no-auth is one trusted user, without this limit)",
    )
    prepare_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Threads that template requests and compile their grammars before "
        "they are queued, shared by user in turn: one user's queued preparations wait "
        "behind other users'",
    )
    max_schema_bytes: ByteSize = Field(
        64 << 10,
        ge=1024,
        description="Largest JSON schema (response_format) or forced tool call's "
        "grammar a request may bring, in bytes (larger ones are refused before compiling)" + SIZES_HELP,
    )
    max_tokens: int = Field(256, ge=1, description="Default reply length in tokens")
    context_length: int | None = Field(None, ge=16, description="Override the model's context length")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weights dtype; auto = float32 on a CPU (no fast half-precision BLAS there), "
        "bfloat16 on a GPU (a float16 or bfloat16 checkpoint keeps its own)",
    )
    blas: Literal["auto", "openblas", "bundled"] = Field(
        "auto", description="Linux CPU BLAS: auto preloads Debian's OpenBLAS when present"
    )

    engines: list[str] = Field(
        default_factory=list,
        description="serve: the URL of a `radixchat worker` (or of a router in front of workers of "
        "one model) to send engine work to instead of loading a model here; repeatable, one model each",
    )
    service_key: SecretStr | None = Field(
        None,
        description="The key a front end and its workers share (at least 16 characters): a worker "
        "serves only requests that carry it, and a front end sends it",
    )
    service_key_file: Path | None = Field(
        None,
        description="A file holding the service key (its first line): unlike --service-key, it shows in "
        "no process list",
    )
    no_auth: bool = Field(False, description="Serve without sign-in or API keys")
    allow_open_lan: bool = Field(False, description="Permit --no-auth on a non-loopback host")
    max_body_bytes: ByteSize = Field(1 << 20, ge=1024, description="Largest accepted API request body" + SIZES_HELP)
    metrics_allow: str = Field(
        "",
        description="Who besides this machine (loopback) may read /metrics: "
        "any, or a comma-separated list of addresses and networks (10.0.0.7,10.1.0.0/16); "
        "default: nobody else (403)",
    )
    forwarded_allow_ips: str = Field(
        "",
        description="Addresses and networks of the proxies whose X-Forwarded-For "
        "and X-Forwarded-Proto are believed (comma-separated, or any); default: none, "
        "the client is the connection's own address",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Seconds a client has to send a "
        "request's line and headers (from connecting or from the request's "
        "first byte) before its connection is closed",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Seconds a client has to send a "
        "request body once its headers are in before its connection is closed",
    )
    keep_alive_s: float = Field(
        5.0, gt=0, le=3600, description="Seconds an idle keep-alive connection stays open between requests"
    )
    max_connections: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Most open connections; at the "
        "limit a new one closes the oldest idle one (no request under way) or, "
        "with none idle, is refused at once",
    )

    @field_validator("kv_bits", "kv_group_size", mode="before")
    @classmethod
    def _bits_as_written(cls, v: object) -> object:
        return int(v) if isinstance(v, str) and v.strip().isdigit() else v  # the command line's "8"

    @field_validator("kv_group_size")
    @classmethod
    def _group_of_its_bits(cls, v: int | None, info: ValidationInfo) -> int | None:
        if "kv_bits" not in info.data:  # refused itself: said once, there
            return v
        if (why := kv_group_refusal(info.data["kv_bits"], v)) is not None:
            raise ValueError(why)
        return v

    @field_validator("cache_disk_bytes", mode="before")
    @classmethod
    def _disk_auto(cls, v):
        if v is None or (isinstance(v, str) and v.strip().lower() == "auto"):
            return DISK_AUTO
        return v  # a size, read by parse_size

    @model_validator(mode="before")
    @classmethod
    def _key_from_file(cls, data):
        if not isinstance(data, dict) or not data.get("service_key_file"):
            return data
        if data.get("service_key"):
            raise ValueError("service_key_file: give the service key or a file that holds it, not both")
        path = Path(str(data["service_key_file"])).expanduser()
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"service_key_file: cannot read {path}: {e.strerror or e}") from None
        return {**data, "service_key": lines[0].strip() if lines else ""}

    @field_validator("service_key")
    @classmethod
    def _long_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError(
                "at least 16 characters (a random one: `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
            )
        return v

    @field_validator("engines")
    @classmethod
    def _engine_urls(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", u)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an http:// or https:// URL")
        return [u.rstrip("/") for u in v]

    @field_validator("sampling_defaults")
    @classmethod
    def _sampling(cls, v: dict | None) -> dict | None:
        if v is not None and not set(v) <= SAMPLING_DEFAULTS:
            raise ValueError(f"only {', '.join(sorted(SAMPLING_DEFAULTS))}")
        return v

    @field_validator("metrics_allow", "forwarded_allow_ips")
    @classmethod
    def _addresses(cls, v: str) -> str:
        address_rule(v)  # refused at start-up, not at the first request
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.max_prefill_batch > self.max_batch and "max_prefill_batch" not in self.model_fields_set:
            self.max_prefill_batch = self.max_batch  # the default follows a smaller --max-batch
        if self.max_prefill_batch > self.max_batch:
            raise ValueError("max_prefill_batch must not exceed max_batch")
        if self.speculate and (not self.kv_slots or not self.step_tokens):
            raise ValueError(
                "speculate needs kv_slots on and step_tokens above 0: drafts are "
                "verified in the budgeted step, their rejected tokens held in the slot cache"
            )
        if self.no_auth and not is_loopback(self.host) and not self.allow_open_lan:
            raise ValueError(
                f"no_auth on host {self.host} would open the server to the whole "
                "network; add --allow-open-lan if that is what you want"
            )
        return self


MLX_CACHE_MOST = 256 << 20  # MLX's buffer cache by default, at its largest (`mlx_cache_limit`)

# Measured by `python -m loadtests.bench_memory` (SmolLM2-135M float32, 32 users, --cache-bytes
# 512MiB, 2-core Linux). MLX's arrays peaked 0.9-1.15 GB above the weights and the K/V budget in
# three runs, up to 3.1 times the budget: the decoding batch's spare rows and columns (core.cache.
# layout: the rows padded to the longest are within the budget) and a step's activations, which
# rose by up to 0.8 GB. Before the batch was admitted by its padded rows, nine runs peaked at
# 1.8-2.3 GB (4.3 times). Beyond MLX's arrays and buffer cache the process held 0.3-1.2 GB at
# its peak: Python, Gradio, the tokenizer, OpenBLAS, glibc's arenas.
ARRAYS_OVER_KV = 3.5  # times the K/V budget, beyond it
REST_BYTES = 1200 << 20


def fitting_kv_budget(machine: int) -> int:
    """The largest K/V budget whose process bound, weights aside, fits three quarters of a
    machine of `machine` bytes: the budget, what MLX's arrays take beyond it (ARRAYS_OVER_KV),
    the buffer cache and the rest. The weights have their own check (`memory_budget`:
    a model loads only where its weights and budget fit)."""
    return max(0, int((machine * 3 // 4 - REST_BYTES - MLX_CACHE_MOST) / (1 + ARRAYS_OVER_KV)))


def machine_memory() -> int:
    """This machine's physical memory in bytes (8 GiB when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def kv_budget(settings: Settings) -> int:
    """The K/V byte budget: --cache-bytes, else a fifth of physical memory, less where what the
    process may take beyond it would pass three quarters of the machine (at least 256 MiB):
    on a 23 GiB machine a fifth was 4.7 GiB, and the process's bound all of its memory."""
    if settings.cache_bytes is not None:
        return settings.cache_bytes
    machine = machine_memory()
    return max(256 << 20, min(machine // 5, fitting_kv_budget(machine)))


def mlx_cache_limit(settings: Settings, kv_bytes: int) -> int:
    """What MLX's buffer cache may keep: --mlx-cache-bytes, else an eighth of the K/V budget
    `kv_bytes`, between 32 MiB (MLX's own on a CPU) and 256 MiB. Its own default on a Mac is
    the whole memory limit: the process would grow by every size of buffer it ever freed.
    More buys no speed here (python -m loadtests.bench_memory, 32 users: no limit kept 1.4 GB
    of buffers, peak RSS x1.07, output tok/s x0.87 against 64 MiB)."""
    if settings.mlx_cache_bytes is not None:
        return settings.mlx_cache_bytes
    return min(MLX_CACHE_MOST, max(32 << 20, kv_bytes // 8))


def memory_budget(settings: Settings) -> int:
    """What every loaded model's weights and K/V budget may take together: --memory-bytes,
    else three quarters of physical memory (the OS, the server's own Python and the
    tokenizers take the rest); 0: no limit."""
    return settings.memory_bytes if settings.memory_bytes is not None else machine_memory() * 3 // 4


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only: every address it names (a name is
    resolved, as the server will resolve it to bind) is a loopback address. Judged by
    address, never by text: "127.0.0.1.nip.io" is a name like any other."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False  # a name that does not resolve here binds nothing
    addrs = {info[4][0].split("%")[0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)


ANY = "any"


def address_rule(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None:
    """The addresses a setting such as --metrics-allow names: None for everyone ("any" or
    "*"), else the networks listed (a bare address is a network of one); "" lists none.
    Raises ValueError naming an entry that is neither."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if any(e.lower() in (ANY, "*") for e in entries):
        return None
    networks = []
    for e in entries:
        try:
            networks.append(ipaddress.ip_network(e, strict=False))
        except ValueError:
            raise ValueError(
                f"{e!r} is not an address or a network (e.g. 10.0.0.7 or 10.1.0.0/16); any allows all"
            ) from None
    return tuple(networks)


def address_allowed(addr: str | None, rule, *, loopback: bool) -> bool:
    """Whether the client address `addr` passes `rule` (address_rule's answer); `loopback`:
    this machine's addresses pass whatever the rule. Not an address (a Unix socket's empty
    peer, a test client's name) passes only a rule of "any"."""
    if rule is None:
        return True
    try:
        ip = ipaddress.ip_address((addr or "").split("%")[0])
    except ValueError:
        return False
    if loopback and ip.is_loopback:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket's view of an IPv4 client
        if loopback and ip.is_loopback:
            return True
    return any(ip in net for net in rule)


def settings_error_line(err: ValidationError, spell=str) -> str:
    """One line naming each bad setting (as `spell` writes a setting's name: a flag, say), for
    start-up refusals (never a traceback)."""
    parts = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        name = ".".join([spell(loc[0]), *loc[1:]]) if loc else "settings"
        parts.append(f"{name}: {e['msg']}")
    return "invalid setting: " + "; ".join(parts)
