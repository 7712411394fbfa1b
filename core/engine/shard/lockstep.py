"""One server over several processes started by `mlx.launch`: the group, its messages, its tokens.

Under `mlx.launch` (ring over TCP or Thunderbolt, JACCL, MPI) every rank runs the same
`radixchat serve`. The model is sharded over the group: tensor parallel (mlx-lm's
`model.shard`: each rank holds a slice of every layer's heads and MLP, and two `all_sum`s a
layer put the halves together). Rank 0 runs the page, the API, the store and the engine's
decisions; the others run `core.engine.shard.follower`, which applies them. They stay in step
because every rank runs the same BatchGenerator on the same inputs, in the same order:

- Each engine turn rank 0 sends what it changed since the last (admissions with their tokens,
  finished and failed requests, the byte count the prefix cache keeps free) as one message,
  then all ranks step (`Link.send` / `Link.recv`). Messages go through the group's own
  `all_sum` (rank 0 contributes the bytes, the others zeros): no transport of our own.
- Sampling happens on rank 0 only (its seeds, grammars, logit_bias); the tokens every rank
  feeds back are rank 0's, summed into the step's graph the same way (`share_tokens`). The
  logits are the same on every rank, but a sampler's state need not be.
- The prefix cache's tree gets the same inserts, matches, locks and evictions in the same
  order on every rank, and its byte counts agree (each rank holds the same share of every
  layer's K/V), so its shape agrees: each message carries the tree's counters and a follower
  that finds its own different stops at once; `Link.digests` compares full shapes.
- Every collective of the engine runs on the engine's one MLX stream: the ring backend
  matches collectives by their order, and two streams could interleave them differently on
  two ranks.

Faults: a peer that is gone makes the next collective raise on every other rank (the ring
backend: "connection to a peer was lost"); one that hangs is caught by rank 0's `Watchdog`.
Either way rank 0 fails the requests in flight with a clear error and the server stops; a
follower that loses rank 0 exits non-zero.

Module level imports no MLX (the CLI asks `launched()` before anything loads); the rest
runs in the engine thread of each rank, except the watchdog's thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    import mlx.core as mx
    from mlx_lm.generate import GenerationBatch

    from radixchat.core.cache.radix import RadixCache
    from radixchat.core.config import Settings

log = logging.getLogger("radixchat.lockstep")
_T = TypeVar("_T")
FRAME = 2048  # bytes of the first collective of a message; a longer one takes a second
# An idle rank 0 sends a message this often, and the others sleep this long after one before
# they wait for the next: a rank waiting in a ring collective spins on its sockets (a core's
# worth of CPU), so an idle follower should mostly sleep. The cost: a request that arrives
# at an idle server may wait up to this long for the others to wake.
IDLE_TICK_S = 0.05
LOST = "a shard of this server (another rank of the mlx.launch group) stopped answering: the server stops"


def launched() -> tuple[int, int] | None:
    """(rank, size) when this process is one of several started by mlx.launch or mpirun."""
    env = os.environ
    if "MLX_RANK" in env and (
        env.get("MLX_HOSTFILE") or env.get("MLX_JACCL_COORDINATOR") or env.get("MLX_IBV_DEVICES")
    ):
        rank = int(env["MLX_RANK"])
        size = _hostfile_size(env.get("MLX_HOSTFILE"), env.get("MLX_IBV_DEVICES"))
        return (rank, size) if size > 1 else None
    for r, s in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if r in env and int(env.get(s, "1")) > 1:
            return int(env[r]), int(env[s])
    return None


def _hostfile_size(hostfile: str | None, devices: str | None) -> int:
    """The group's size as mlx.launch wrote it (a JSON list per rank), before MLX loads."""
    try:
        if hostfile:
            with open(hostfile) as f:
                return len(json.load(f))
        if devices:
            return len(json.loads(devices))
    except (OSError, ValueError):
        pass
    return 2  # a launcher set a rank: at least two


def backend_name() -> str:
    env = os.environ
    if env.get("MLX_JACCL_COORDINATOR") or env.get("MLX_IBV_DEVICES"):
        return "jaccl"
    if env.get("MLX_HOSTFILE"):
        return "ring"
    return "mpi"


@dataclass
class Rank:
    rank: int
    host: str
    pid: int


class Link:
    """The group and rank 0's messages to the others (engine thread of every rank)."""

    def __init__(self, group: mx.distributed.Group, stream: mx.Stream):
        self.group = group
        self.rank = group.rank()
        self.size = group.size()
        self.stream = stream
        self.backend = backend_name()
        self.sharding = ""  # "tensor": set when the model is sharded
        self.sent_bytes = 0  # message bytes rank 0 has sent (each to every other rank)
        self.messages = 0
        self.ranks: list[Rank] = []

    def _sum(self, data: mx.array) -> mx.array:
        import mlx.core as mx

        out = mx.distributed.all_sum(data, group=self.group, stream=self.stream)
        mx.eval(out)
        return out

    def send(self, message: dict[str, Any]) -> None:
        """Rank 0: one message to every other rank."""
        import mlx.core as mx

        body = json.dumps(message, separators=(",", ":")).encode()
        frame = bytearray(FRAME)
        frame[:4] = len(body).to_bytes(4, "little")
        first = body[: FRAME - 4]
        frame[4 : 4 + len(first)] = first
        # (an MLX array is made from a buffer and is one; its stub declares neither)
        self._sum(mx.array(memoryview(frame), dtype=mx.uint8))  # type: ignore[arg-type]
        rest = body[FRAME - 4 :]
        if rest:
            self._sum(mx.array(memoryview(bytearray(rest)), dtype=mx.uint8))  # type: ignore[arg-type]
        self.sent_bytes += len(body)
        self.messages += 1

    def recv(self) -> dict[str, Any]:
        """Any other rank: the next message of rank 0 (blocks until rank 0 sends it)."""
        import mlx.core as mx

        frame = bytes(memoryview(self._sum(mx.zeros((FRAME,), dtype=mx.uint8))))  # type: ignore[arg-type]  # (as in send)
        n = int.from_bytes(frame[:4], "little")
        body = frame[4 : 4 + n]
        if n > FRAME - 4:
            body += bytes(memoryview(self._sum(mx.zeros((n - (FRAME - 4),), dtype=mx.uint8))))  # type: ignore[arg-type]
        self.messages += 1
        return cast("dict[str, Any]", json.loads(body))  # (rank 0 sends an object)

    def gather(self, text: str, width: int = 512) -> list[str]:
        """Every rank's `text` (at most `width` bytes), on every rank."""
        import mlx.core as mx

        rows = bytearray(width * self.size)
        mine = text.encode()[:width]
        rows[self.rank * width : self.rank * width + len(mine)] = mine
        out = bytes(memoryview(self._sum(mx.array(memoryview(rows), dtype=mx.uint8))))  # type: ignore[arg-type]  # (as in send)
        return [out[r * width : (r + 1) * width].rstrip(b"\0").decode() for r in range(self.size)]

    def hello(self) -> None:
        """Learn every rank's host and process id (for /health, doctor and the tests)."""
        me = json.dumps([socket.gethostname(), os.getpid()])
        self.ranks = [Rank(r, *json.loads(t)) for r, t in enumerate(self.gather(me))]

    def share(self, value: _T) -> _T:
        """Rank 0's `value` (JSON) on every rank."""
        if self.rank == 0:
            self.send({"value": value})
            return value
        return cast("_T", self.recv()["value"])  # (rank 0's own: a JSON value comes back as it went)

    def settings(self, settings: Settings) -> Settings:
        """Rank 0's settings on every rank: the ranks must batch, cache and sample alike, and
        a variable set on one machine only must not make them differ."""
        from radixchat.core.config import Settings

        data = self.share(settings.model_dump(mode="json"))
        return settings if self.rank == 0 else Settings(**data)

    def same_model(self, path: str) -> None:
        """Refuse to start when a rank has other weights, another config or other versions of
        MLX, mlx-lm or radixchat than rank 0 (their answers would not be rank 0's)."""
        mine = model_digest(path)
        theirs = self.gather(mine, width=64)
        odd = [r for r, d in enumerate(theirs) if d != theirs[0]]
        if odd:
            raise ValueError(
                f"rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} "
                f"{'have' if len(odd) > 1 else 'has'} another model at {path} or other "
                "versions of MLX, mlx-lm or radixchat than rank 0: install the same everywhere"
            )

    def digests(self, digest: str) -> list[str]:
        return self.gather(digest, width=64)

    def summary(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "backend": self.backend,
            "sharding": self.sharding,
            "ranks": [{"rank": r.rank, "host": r.host, "pid": r.pid} for r in self.ranks],
            "messages": self.messages,
            "message_bytes": self.sent_bytes,
        }


def model_digest(path: str) -> str:
    """Versions, and each weight and config file's name, size, first and last MiB (no mtime:
    copies on other machines have their own), as a short hex digest."""
    from importlib.metadata import version
    from pathlib import Path

    from radixchat.core.cache.disk.identity import model_files

    h = hashlib.sha256(repr([version(p) for p in ("mlx", "mlx-lm", "radixchat")]).encode())
    p = Path(path).expanduser()
    for f in model_files(p) if p.is_dir() else [p] if p.is_file() else []:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:32]


def start_here(settings: Settings) -> tuple[Link | None, Settings]:
    """Join the mlx.launch group as an engine (tensor parallel) and agree with rank 0 on the
    settings and the model; (None, settings) when this process runs alone."""
    link = join("tensor")
    if link is None:
        return None, settings
    link.hello()
    settings = link.settings(settings)
    from radixchat.core.models.catalog import resolve

    link.same_model(resolve(settings.model).path)
    install()
    share_tokens_here(link)
    return link, settings


def join(sharding: str) -> Link | None:
    """This process's place in the mlx.launch group, or None when it runs alone."""
    import mlx.core as mx

    if launched() is None:
        return None
    group = mx.distributed.init(strict=True)
    if group.size() < 2:
        return None
    link = Link(group, mx.new_stream(mx.default_device()))
    link.sharding = sharding
    return link


# ---- the sampled tokens: rank 0's, on every rank --------------------------------------------

_here = threading.local()


def share_tokens_here(link: Link | None) -> None:
    """In this thread, every batched step feeds back rank 0's tokens (after `install`)."""
    _here.link = link


def install() -> None:
    """Wrap mlx-lm's GenerationBatch._step once per process (a no-op outside a sharded engine thread)."""
    from mlx_lm.generate import GenerationBatch

    step = GenerationBatch._step
    if getattr(step, "_lockstep", False):
        return

    def _step(self: GenerationBatch) -> tuple[list[int], list[mx.array]]:
        out = step(self)
        link = getattr(_here, "link", None)
        if link is not None and self._next_tokens is not None:
            self._next_tokens = share_tokens(self._next_tokens, link)
            import mlx.core as mx

            mx.async_eval(self._next_tokens)  # type: ignore[no-untyped-call]  # (MLX's stub leaves it unannotated)
        return out

    _step._lockstep = True  # type: ignore[attr-defined]  # (a function's attribute: wrapped once)
    GenerationBatch._step = _step  # type: ignore[method-assign]  # (the point: every batch's step)


def share_tokens(tokens: mx.array, link: Link) -> mx.array:
    """Rank 0's tokens on every rank, inside the step's graph. The others' contribution is
    their own tokens times zero, not a fresh zero array: the sum then comes after the
    forward (and its collectives) in every rank's evaluation order."""
    import mlx.core as mx

    mine = tokens if link.rank == 0 else tokens * 0
    return mx.distributed.all_sum(mine, group=link.group)


# ---- the tree's shape ---------------------------------------------------------------------


def counters(tree: RadixCache | None, running: int) -> list[int]:
    """What each message carries of a rank's state (the prefix cache's counters and the
    requests in the batch): cheap to compare every step."""
    return ([tree.nodes, tree.tokens, tree.bytes, tree.locks, tree.reserved] if tree is not None else []) + [running]


def shape_digest(tree: RadixCache | None, running: int) -> str:
    """A hash of the tree's whole shape (every edge's tokens, children, locks and snapshots)
    and of how many requests the rank's batch holds."""
    h = hashlib.sha256(str(running).encode())
    stack = [tree.root] if tree is not None else []
    while stack:
        node = stack.pop()
        h.update(
            repr(
                (node.key, node.lock_ref, node.snapshot is not None, node.seg is not None, sorted(node.children))
            ).encode()
        )
        stack.extend(node.children[k] for k in sorted(node.children, reverse=True))
    return h.hexdigest()[:32]


class Watchdog:
    """Rank 0: ends the server when a step or a message has waited on the group too long
    (a rank that hangs rather than dies: its sockets stay open and nothing raises)."""

    def __init__(self, timeout_s: float, busy_since: Callable[[], float], fatal: Callable[[str], None]):
        self.timeout_s = timeout_s
        self.busy_since = busy_since
        self.fatal = fatal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixchat-lockstep-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            since = self.busy_since()
            if since and time.monotonic() - since > self.timeout_s:
                self.fatal(f"{LOST} (no answer within {self.timeout_s:g} s)")
                return

    def stop(self) -> None:
        self._stop.set()
