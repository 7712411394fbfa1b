"""The `radixchat` command: serve, ask, doctor, and the admin commands users, keys, export.

Flags for `serve` and `ask` are made from the fields of core.config.Settings, so every
setting has a flag (`--max-batch 8`) and a variable (`RADIXCHAT_MAX_BATCH=8`); flags win.
A bad value stops start-up with one line naming the setting. On Linux the process
re-executes itself once with Debian's OpenBLAS preloaded (core.platform.blas). The commands only
glue parts together: the engine is core.engine.engine, the HTTP app is webui.server, the admin
commands (no MLX, no re-exec) are webui.cli.admin.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import ValidationError

from radixchat.core.config import DISK_AUTO, Settings, address_rule, settings_error_line
from radixchat.core.engine.output import SWITCH_INTERVAL_S
from radixchat.webui.cli.admin import add_admin_commands, run_admin
from radixchat.webui.log_lines import log_to_stderr

if TYPE_CHECKING:  # each is imported where it is used, so that `radixchat users ...` starts at once
    import uvicorn
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from radixchat.core.engine.engine import Engine
    from radixchat.core.engine.models import ModelSet
    from radixchat.core.engine.sched.owners import OwnerCounts
    from radixchat.core.seam.protocol import Lifecycle, ModelInfo
    from radixchat.webui.remote.remote_engines import RemoteEngines


def _add_settings_flags(p: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if name in ("extra_models", "sampling_defaults"):  # the later --model; a --models file's
            continue
        if name == "engines":  # --engine URL, again for another model's worker
            p.add_argument("--engine", dest=name, action="append", default=argparse.SUPPRESS, help=field.description)
        elif name == "model":
            p.add_argument(flag, dest=name, action="append", default=argparse.SUPPRESS, help=field.description)
        elif field.annotation is bool and name.startswith("no_"):  # argparse reads --no-x as x=False
            p.add_argument(flag, dest=name, action="store_true", default=argparse.SUPPRESS, help=field.description)
        elif field.annotation is bool:
            p.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=field.description,
            )
        else:
            p.add_argument(flag, dest=name, default=argparse.SUPPRESS, help=field.description)


def load_settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    if overrides.get("service_key"):
        print(
            "radixchat: --service-key on the command line shows in every process list (ps); "
            "RADIXCHAT_SERVICE_KEY or --service-key-file FILE keeps it out of sight",
            file=sys.stderr,
        )
    if "model" in overrides:  # --model again and again: the first is the default, all are served
        if overrides.get("models"):
            _refuse("--models names the models to serve: give it or --model, not both")
        overrides["model"], *more = overrides["model"]
        if more:
            overrides["extra_models"] = more
    try:
        return Settings(**overrides)
    except ValidationError as e:
        _refuse(settings_error_line(e, spell=lambda n: f"--{n.replace('_', '-')} (RADIXCHAT_{n.upper()})"))


def _refuse(line: str) -> NoReturn:
    """A start-up refusal: one line on stderr and argparse's exit status for a usage error."""
    print(f"radixchat: {line}", file=sys.stderr)
    sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixchat", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the engine and serve HTTP")
    _add_settings_flags(serve)
    ask = sub.add_parser("ask", help="one prompt from the terminal, streamed, with timings")
    ask.add_argument("prompt")
    ask.add_argument("--system", default=None, help="system prompt")
    ask.add_argument("--temperature", type=float, default=0.0)
    ask.add_argument("--seed", type=int, default=None)
    ask.add_argument("--max-new-tokens", type=int, default=None, help="reply length (default: --max-tokens)")
    ask.add_argument(
        "--api-key",
        default=os.environ.get("RADIXCHAT_API_KEY"),
        help="a key for the server already running at --port, which answers instead of a model loaded here "
        "(default: RADIXCHAT_API_KEY)",
    )
    ask.add_argument("--local", action="store_true", help="load the model here even if a server is running")
    _add_settings_flags(ask)
    _add_settings_flags(sub.add_parser("worker", help="serve one engine over HTTP to a front end (serve --engine)"))
    doctor = sub.add_parser("doctor", help="platform, MLX device, BLAS speed, model info")
    doctor.add_argument("--no-model", action="store_true", help="skip loading the model")
    _add_settings_flags(doctor)
    add_admin_commands(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if hasattr(args, "admin"):  # store-only commands: no settings flags, MLX or OpenBLAS re-exec
        sys.exit(run_admin(args))
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    settings = load_settings(args)
    from radixchat.core.platform.blas import reexec_with_openblas

    if argv is None:  # only a real command line can be re-executed
        reexec_with_openblas(settings.blas)
    {"serve": cmd_serve, "ask": cmd_ask, "doctor": cmd_doctor, "worker": cmd_worker}[args.command](args, settings)


def _make_engine(
    settings: Settings,
    on_fatal: Callable[[str], None] | None = None,
    cache_owners: Callable[[str], bool] | None = None,
    owners: OwnerCounts | None = None,
) -> Engine:
    """A started engine serving `settings.model`; raises what stopped it loading."""
    from radixchat.core.engine.engine import Engine

    engine = Engine(settings, owners)
    engine.on_fatal = on_fatal
    engine.cache_owners = cache_owners  # whose files the disk tier adopts (None: anyone's)
    return engine.start()


def _start_engine(
    settings: Settings,
    on_fatal: Callable[[str], None] | None = None,
    cache_owners: Callable[[str], bool] | None = None,
) -> Engine:
    try:
        return _make_engine(settings, on_fatal, cache_owners)
    except Exception as e:
        sys.exit(f"radixchat: could not load model {settings.model!r}: {type(e).__name__}: {e}")


def _start_models(settings: Settings, on_fatal: Callable[[str], None], cache_owners: Callable[[str], bool]) -> ModelSet:
    """The served models (core.engine.models): the first loaded now, the others when asked."""
    from radixchat.core.engine.models import ModelSet

    try:
        models = ModelSet.of(settings, lambda s, owners: _make_engine(s, on_fatal, cache_owners, owners))
    except (ValueError, OSError) as e:
        sys.exit(f"radixchat: {e}")
    try:
        return models.start()
    except Exception as e:
        sys.exit(f"radixchat: could not load model {settings.model!r}: {type(e).__name__}: {e}")


def _remote(settings: Settings) -> RemoteEngines:
    from radixchat.webui.remote.remote_engine import StartError
    from radixchat.webui.remote.remote_engines import connect_engines

    try:
        key = settings.service_key.get_secret_value() if settings.service_key else None
        return connect_engines(settings.engines, key)
    except StartError as e:
        _refuse(str(e))


def freeze_start_up() -> None:
    """Put what start-up made (the model's modules, the app, the tokenizer, Gradio: ~230,000
    objects on the bundled model) out of the cyclic garbage collector's reach, as vLLM does once
    its engine is up. A full collection walks every object it tracks with the GIL held, so
    every thread waits, the engine's steps too: under a flood on two busy cores each took
    140-215 ms (2026-12-07). Frozen, it walks only what serving made since. Called once the
    server listens; what start-up left as garbage is collected first."""
    import gc

    gc.collect()
    gc.freeze()


def cmd_worker(args: argparse.Namespace, settings: Settings) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as `serve`: the engine thread wants the GIL back at once
    log_to_stderr()
    from radixchat.webui.remote.worker import serve_worker

    settings = serve_disk(settings, sharded=False)
    serve_worker(settings, lambda s: _start_engine(s, _stop_serving), uvicorn_options(settings), freeze_start_up)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # the engine thread wants the GIL back at once
    log_to_stderr()
    from radixchat.core.engine.shard.lockstep import launched

    place = launched()
    settings = serve_disk(settings, sharded=place is not None)
    if place is not None and (settings.cache_disk_bytes or settings.warm_prompts or settings.speculate):
        sys.exit(
            "radixchat: --cache-disk-bytes, --warm-prompts and --speculate do not run sharded (under mlx.launch) yet"
        )
    if place is not None and place[0] != 0:  # mlx.launch: rank 0 serves, the others follow it
        from radixchat.core.engine.shard.follower import follow

        sys.exit(follow(settings))

    from radixchat.core.seam.requests import owner_of
    from radixchat.core.store import Store
    from radixchat.webui.removals import RemovalWatch
    from radixchat.webui.request_end import settle
    from radixchat.webui.server import build_app

    settings.db.parent.mkdir(parents=True, exist_ok=True)
    store = Store(settings.db)
    # the disk tier keeps the cached entries of today's users only: a removed user's go
    users = {owner_of(u.cache_key) for u in store.list_users() if u.cache_key}
    models = _remote(settings) if settings.engines else _start_models(settings, _stop_serving, users.__contains__)
    engine = models.default
    removals = RemovalWatch(store, models).start()  # `users remove` runs in another process
    m = engine.info
    lines = [f"radixchat: {model_line(m)} on http://{settings.host}:{settings.port}"]
    more = [s.model_id for s in models.served()[1:]]
    lines += [f"radixchat: also serving {', '.join(more)} (each loaded when first asked for)"] if more else []
    lines += [f"radixchat: {m.sharded}"] if m.sharded else []
    lines += [f"radixchat: note: {m.notice}"] if m.notice else []
    lines += serve_banner(settings, len(store.list_users()))
    app = None
    try:
        app = build_app(models, settings, store)
        server = _serving(app, models, uvicorn_options(settings), lines)
        # uvicorn catches both while it serves and puts these back when it is done, then raises
        # what it caught again: ignored, so that the stop goes on here (each wait of it bounded)
        # and a second Ctrl-C cannot cut the store's close short
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        server.run()
    finally:
        removals.stop()
        if app is not None and app.state.live is not None:
            app.state.live.stop()
        settle(STOP_GRACE_S)  # replies cut short by the stop are written before the store closes
        models.stop()
        store.close()
    if models.fatal:
        sys.exit(f"radixchat: {models.fatal}")


def serve_disk(settings: Settings, sharded: bool) -> Settings:
    """`serve`'s disk tier: on (auto: core/cache/disk/budget.py) unless --cache-disk-bytes
    or its variable says otherwise. Under mlx.launch, where it is not built yet, auto is
    off; a number stays, for `cmd_serve` to refuse."""
    if "cache_disk_bytes" not in settings.model_fields_set:
        settings = settings.model_copy(update={"cache_disk_bytes": DISK_AUTO})
    if sharded and settings.cache_disk_bytes == DISK_AUTO:
        settings = settings.model_copy(update={"cache_disk_bytes": 0})
    return settings


STOP_GRACE_S = 5  # a stop's waits (s, whole: uvicorn's timeout_graceful_shutdown is an int): for the engines,
# the replies' writes, then open connections


def model_line(m: ModelInfo) -> str:
    """The served model in a few words: its size, dtype, context and, where it is not its
    dtype's, the precision its K/V is cached at (a memory figure a reader would otherwise
    look for in the Server tab)."""
    kv = ""
    if m.kv_bits != 16:
        kv = f", K/V at {m.kv_bits} bits" + (f" (a scale per {m.kv_group} numbers)" if m.kv_group else "")
    return f"{m.model_id} ({m.num_params / 1e6:.1f}M params, {m.dtype}, context {m.context_length}{kv})"


def _serving(app: FastAPI, models: Lifecycle, options: dict[str, Any], lines: list[str]) -> uvicorn.Server:
    """uvicorn's Server for `app`, printing the start-up lines once its socket listens (not
    before: a person or script that reads "open http://..." may connect at once), and stopping
    in a few seconds with pages and streams open.

    uvicorn alone waits, on SIGTERM or the first Ctrl-C, for every open connection to close, and
    an open page holds one for as long as it is open (Gradio's heartbeat stream), an API stream
    until its reply ends; a second Ctrl-C then cancels them all, each cancelled task logged with
    its traceback. So a stop first ends what those connections wait for (`_wind_down`), then
    gives them STOP_GRACE_S to close; what is still open then is cut (`_Quiet`)."""
    import uvicorn

    quiet = _Quiet(app)

    class Serving(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                freeze_start_up()
                for line in lines:
                    print(line, flush=True)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            from radixchat.webui.server import close_page_queue

            quiet.stopping = True
            for server in self.servers:  # no new connections while the requests end
                server.close()
            await _wind_down(self, models, app)
            await super().shutdown(sockets)
            if self.force_exit:  # a second Ctrl-C: uvicorn skips the app's shutdown, whose task,
                # cancelled as the loop closes, would print its traceback; it takes no time
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.lifespan.shutdown(), 1.0)
            close_page_queue(app)  # its loops end now that no page waits on them

    return Serving(uvicorn.Config(quiet, **options, timeout_graceful_shutdown=STOP_GRACE_S))


async def _wind_down(server: uvicorn.Server, models: Lifecycle, app: FastAPI) -> None:
    """What a stop does before uvicorn waits for the open connections: the engines stop, every
    request in flight ending as cancelled (a page's reply is stored as stopped, an API stream
    gets its last event); the page's replies are written (their readers run on this loop);
    then the pages' heartbeat streams end. Each wait is bounded, and a second Ctrl-C ends it."""
    from radixchat.webui.request_end import settle
    from radixchat.webui.server import end_page_streams

    # in a thread of its own, never the loop's executor: asyncio.run would wait at exit for an
    # engine thread that does not end (a sharded one whose peer hangs)
    halted = threading.Event()

    def halt() -> None:
        try:
            models.halt()
        finally:
            halted.set()

    threading.Thread(target=halt, name="radixchat-stop", daemon=True).start()
    deadline = time.monotonic() + STOP_GRACE_S
    while not (halted.is_set() and settle(0)) and time.monotonic() < deadline and not server.force_exit:
        await asyncio.sleep(0.05)
    end_page_streams(app)


class _Quiet:
    """The app, whose requests a stop cuts short (past STOP_GRACE_S, or on a second Ctrl-C) end
    without a traceback each, their responses closed: their engine requests ended and were
    stored already, and uvicorn logs every cancelled request as an error of the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.stopping = app, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._cut(scope, receive, send)
            return
        state = {"started": False, "done": False}

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            await send(message)

        if await self._cut(scope, receive, noted) and state["started"] and not state["done"]:
            with contextlib.suppress(Exception):  # the client may be gone too
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _cut(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """The app on this request; True when a stop cut it short."""
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            return True
        return False


def _stop_serving(reason: str) -> None:
    """A sharded engine cannot go on: stop serving as on Ctrl-C (the requests in flight have
    failed with `reason` and are stored), once their API streams have sent it (a stop cuts a
    stream still sending), and exit anyway if that takes too long."""
    from radixchat.webui.api.generation import OPEN_STREAMS

    print(f"radixchat: {reason}", file=sys.stderr, flush=True)
    OPEN_STREAMS.wait_ended(STOP_GRACE_S)
    os.kill(os.getpid(), signal.SIGTERM)
    timer = threading.Timer(20.0, os._exit, args=(1,))
    timer.daemon = True
    timer.start()


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How uvicorn serves: time limits and a connection cap for slow or idle clients
    (webui/http_limits.py); no WebSockets, which nothing here uses; X-Forwarded-For and
    -Proto believed only from --forwarded-allow-ips (uvicorn's own default believes any
    process on this machine, which could then pose as any address to the sign-in lockout
    and /metrics, both of which read the address uvicorn settles on)."""
    from radixchat.webui.http_limits import Limits, limited_protocol

    proxies = address_rule(settings.forwarded_allow_ips)

    _room_for_connections(settings.max_connections)
    limits = Limits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_connections=settings.max_connections,
    )
    return {
        "host": settings.host,
        "port": settings.port,
        "log_level": "warning",
        "ws": "none",
        "http": limited_protocol(limits),
        "timeout_keep_alive": settings.keep_alive_s,
        "proxy_headers": proxies is None or bool(proxies),
        "forwarded_allow_ips": "*" if proxies is None else [str(n) for n in proxies],
    }


def _room_for_connections(max_connections: int, spare: int = 256) -> None:
    """Raise this process's open-file limit (soft, up to the hard one) so that the capped
    connections, the store and the model's files all fit; without room accept() fails and
    new clients wait unanswered whatever the cap."""
    try:
        import resource
    except ImportError:  # not on this platform: its own limits apply
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + spare
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            new = soft
        if new < want:
            print(
                f"radixchat: only {new} open files allowed here; --max-connections {max_connections} may not fit",
                file=sys.stderr,
                flush=True,
            )


def lan_addresses() -> list[str]:
    """This machine's IPv4 addresses that other machines may reach (no packet is sent)."""
    found: set[str] = set()
    try:
        found.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.254.254.254", 9))  # UDP connect only picks the outgoing address
            found.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith(("127.", "0.")))


def serve_banner(settings: Settings, n_users: int, addresses: list[str] | None = None) -> list[str]:
    """Where to open the page, and who may sign in."""
    port = settings.port
    if settings.host in ("0.0.0.0", "::", ""):
        lan = lan_addresses() if addresses is None else addresses
        lines = [f"radixchat: open http://127.0.0.1:{port} here"]
        lines += [f"radixchat: or, from the LAN, http://{a}:{port}" for a in lan]
        if not lan:
            lines.append(f"radixchat: no LAN address found; use this machine's address and port {port}")
    else:
        lines = [f"radixchat: open http://{settings.host}:{port}"]
    if settings.no_auth:
        lines.append("radixchat: no sign-in (--no-auth): everyone uses the page as the user 'local'")
    elif n_users == 0:
        lines.append(
            "radixchat: no users yet, so nobody can sign in: add one with "
            "`radixchat users add NAME` (it works while the server runs)"
        )
    else:
        lines.append(
            f"radixchat: {n_users} user{'s' if n_users != 1 else ''} can sign in (`radixchat users add NAME` adds one)"
        )
    return lines


# what `ask` reads of the settings' flags when a running server answers: where it is, which
# of its models, how long a reply (the rest set up a model loaded here, and are refused)
ASK_SERVER_READS = {"host", "port", "model", "max_tokens"}


def cmd_ask(args: argparse.Namespace, settings: Settings) -> None:
    from radixchat.core.seam.requests import ChatRequest, Failed, Finished, RequestError, TextDelta

    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    try:
        req = ChatRequest(
            messages=messages,
            sampling={"temperature": args.temperature, "seed": args.seed, "max_tokens": args.max_new_tokens},
        )
    except ValidationError as e:
        sys.exit(f"radixchat: {settings_error_line(e).removeprefix('invalid setting: ')}")
    from radixchat.webui.cli.ask import ask_server, running_server

    url = None if args.local else running_server(settings)
    if url is not None:  # its model is loaded already: it answers in a moment
        given = [k for k in vars(args) if k in Settings.model_fields and k not in ASK_SERVER_READS]
        if given:  # they set up a model loaded here, which this server's replaces
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            _refuse(f"the server at {url} answers, and {flags} only sets up a model loaded here: add --local")
        model = getattr(args, "model", None)
        given_length = settings.max_tokens if "max_tokens" in vars(args) else None  # (--max-tokens, read as a number)
        length = args.max_new_tokens if args.max_new_tokens is not None else given_length
        sampling = {"temperature": args.temperature, "seed": args.seed, "max_tokens": length}
        return ask_server(url, args.api_key, model[0] if model else "default", messages, sampling)
    engine = _start_engine(settings)
    try:
        try:
            handle = engine.submit(req)
        except RequestError as e:
            sys.exit(f"radixchat: {e.message}")
        for ev in handle:
            if isinstance(ev, TextDelta):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        print()
        if isinstance(ev, Failed):
            sys.exit(f"radixchat: {ev.message}")
        assert isinstance(ev, Finished)  # iterating a handle ends with its one event that is not a TextDelta
        u = ev.usage
        print(
            f"[{ev.finish_reason}] prompt {u.prompt_tokens} tok (cached {u.cached_tokens}), "
            f"generated {u.generated_tokens} tok, queue {u.queue_ms:.0f} ms, "
            f"first token {u.ttft_ms or 0:.0f} ms, decode {u.decode_tps:.1f} tok/s, "
            f"total {u.total_ms:.0f} ms",
            file=sys.stderr,
        )
    finally:
        engine.stop()


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> None:
    from radixchat.core.engine.shard.lockstep import launched
    from radixchat.core.platform.doctor import report

    quiet = (launched() or (0, 1))[0] != 0  # under mlx.launch every rank runs it, rank 0 prints
    settings = serve_disk(settings, sharded=launched() is not None)  # what `serve` would use
    t0 = time.perf_counter()
    for key, value in report(settings, load=not args.no_model):
        if not quiet:
            print(f"{key:<28} {value}", flush=True)
    if not quiet:
        print(f"{'doctor took':<28} {time.perf_counter() - t0:.1f} s")
