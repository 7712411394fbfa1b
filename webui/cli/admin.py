"""The admin commands of `radixchat`: users, keys and export, straight on the SQLite store.

    radixchat users add NAME [--password-file F] [--admin]  # else asks twice, without echo
    radixchat users list | users remove NAME | users passwd NAME [--password-file F]
    radixchat users admin NAME [--off]              # an admin, or no longer one (never the last)
    radixchat keys create NAME [--label L] [--front-end]  # prints the key, once
    radixchat keys list [NAME] | keys revoke KEY    # KEY: the whole key or its listed start
    radixchat export NAME [ID] [--format json|md] [--output FILE]   (no ID: the ids, listed)

Each takes `--db PATH` (default: the `db` setting, RADIXCHAT_DB or the per-user data folder).
They need neither MLX nor a running server, so webui.cli.main dispatches them before loading
either. `add_admin_commands` registers the subparsers; each handler returns an exit code,
and a refusal is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store loads when a command runs, not when `radixchat` starts
    from radixchat.core.store import Store

ADMIN_COMMANDS = ("users", "keys", "export")


def add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `users`, `keys` and `export` to the `radixchat` subparsers; each sets `admin`
    (the handler) on the parsed arguments."""
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", type=Path, default=None, help="SQLite file (default: the db setting, RADIXCHAT_DB)")
    pw = argparse.ArgumentParser(add_help=False)
    pw.add_argument(
        "--password-file",
        default=None,
        help="read the password from the first line of this file ('-' for stdin) instead of asking",
    )

    users = sub.add_parser(
        "users", help="add, list, remove users; set a password; make or unmake an admin"
    ).add_subparsers(dest="action", required=True)
    p = users.add_parser("add", parents=[db, pw], help="add a user")
    p.add_argument("name")
    p.add_argument(
        "--admin",
        action="store_true",
        dest="make_admin",  # `admin` is the handler's name on the parsed arguments
        help="an admin: manages users in the page's Admin tab (the first account made while none is, is one)",
    )
    p.set_defaults(admin=cmd_users_add)
    users.add_parser("list", parents=[db], help="list users").set_defaults(admin=cmd_users_list)
    p = users.add_parser("remove", parents=[db], help="remove a user with their conversations and keys")
    p.add_argument("name")
    p.set_defaults(admin=cmd_users_remove)
    p = users.add_parser("passwd", parents=[db, pw], help="set a user's password")
    p.add_argument("name")
    p.set_defaults(admin=cmd_users_passwd)
    p = users.add_parser("admin", parents=[db], help="make a user an admin (--off: no longer one)")
    p.add_argument("name")
    p.add_argument("--off", action="store_true", help="no longer an admin (refused for the last admin)")
    p.set_defaults(admin=cmd_users_admin)

    keys = sub.add_parser("keys", help="create, list or revoke API keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("create", parents=[db], help="create an API key for a user; prints it once")
    p.add_argument("name")
    p.add_argument("--label", default="", help="a note to tell keys apart")
    p.add_argument(
        "--front-end",
        action="store_true",
        help="a trusted front end's key (Open WebUI): its requests may name their end user "
        "(X-Radixchat-User or X-OpenWebUI-User-Id), who is then a user of their own, NAME/USER",
    )
    p.set_defaults(admin=cmd_keys_create)
    p = keys.add_parser("list", parents=[db], help="list keys (of one user, or everyone's)")
    p.add_argument("name", nargs="?")
    p.set_defaults(admin=cmd_keys_list)
    p = keys.add_parser("revoke", parents=[db], help="revoke a key: the whole key or its listed start")
    p.add_argument("key")
    p.set_defaults(admin=cmd_keys_revoke)

    p = sub.add_parser("export", parents=[db], help="print one of a user's conversations (without ID: list them)")
    p.add_argument("name", help="the user who owns the conversation")
    p.add_argument("id", nargs="?", default=None, help="conversation id (left out: their conversations, listed)")
    p.add_argument("--format", choices=("json", "md"), default="json")
    p.add_argument("--output", "-o", type=Path, default=None, help="write here instead of stdout")
    p.set_defaults(admin=cmd_export)


def run_admin(args: argparse.Namespace) -> int:
    """Run the handler the parser chose; store errors become one line and exit code 1."""
    from radixchat.core.store import StoreError

    try:
        handler: Callable[[argparse.Namespace], int] = args.admin  # a cmd_* below, set by its subparser
        return handler(args)
    except StoreError as e:
        print(f"radixchat: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _open(args: argparse.Namespace, make: bool = False) -> Store:
    """The store at --db (or the settings' default). Only `make` (a user's adding) may create
    it: any other command on a mistyped path made an empty database and said there were no users."""
    from pydantic import ValidationError

    from radixchat.core.config import Settings, settings_error_line
    from radixchat.core.store import Store

    path = args.db
    if path is None:
        try:
            path = Settings().db
        except ValidationError as e:
            raise SystemExit(f"radixchat: {settings_error_line(e)}") from None
    if not make and not Path(path).exists():
        raise SystemExit(f"radixchat: no database at {path} (adding a user or starting the server makes one)")
    return Store(path)


def _read_password(args: argparse.Namespace) -> str:
    if args.password_file:
        try:
            text = sys.stdin.read() if args.password_file == "-" else Path(args.password_file).read_text()
        except OSError as e:
            raise SystemExit(f"radixchat: cannot read password file: {e.strerror}: {args.password_file}") from None
        return text.splitlines()[0] if text else ""
    if not _can_prompt():
        raise SystemExit("radixchat: no terminal to ask for the password on; use --password-file")
    first = getpass.getpass(f"password for {args.name}: ")
    if getpass.getpass("again: ") != first:
        raise SystemExit("radixchat: the two passwords differ; nothing changed")
    return first


def _can_prompt() -> bool:
    # getpass asks on /dev/tty, not stdin, so a piped stdin alone does not rule it out
    if sys.stdin.isatty():
        return True
    try:
        open("/dev/tty").close()
        return True
    except OSError:
        return False


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def cmd_users_add(args: argparse.Namespace) -> int:
    from radixchat.core.store import check_account_name, check_password

    check_account_name(args.name)  # before asking for a password that would be refused anyway
    password = _read_password(args)
    check_password(password)
    with _open(args, make=True) as store:
        user = store.create_user(args.name, password, admin=args.make_admin)
        admin = store.is_admin(user.name)
    print(f"added user {user.name}{' (admin)' * admin}")
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    with _open(args) as store:
        users = store.accounts()
    for u in users:
        notes = "  admin" * u.admin + f"  disabled {_when(u.disabled)}" * (u.disabled is not None)
        print(f"{u.name:<24} created {_when(u.created)}{notes}")
    if not users:
        print("no users yet: add one with `radixchat users add NAME`", file=sys.stderr)
    return 0


def cmd_users_remove(args: argparse.Namespace) -> int:
    with _open(args) as store:
        was_admin = store.is_admin(args.name)
        n = store.remove_user(args.name)
        admins = was_admin and any(a.admin and a.disabled is None for a in store.accounts())
    print(f"removed user {args.name} and {n} conversation{'s' * (n != 1)}")
    if was_admin and not admins:  # (the store's rule: someone must be, and can then be made one)
        print("no admin is left: the next account added will be one (or: radixchat users admin NAME)")
    print("their page sessions end, and a running server drops their cached prompts within seconds")
    return 0


def cmd_users_passwd(args: argparse.Namespace) -> int:
    from radixchat.core.store import check_password

    password = _read_password(args)
    check_password(password)
    with _open(args) as store:
        store.set_password(args.name, password)
    print(f"password of {args.name} changed; their page sessions are signed out")
    return 0


def cmd_users_admin(args: argparse.Namespace) -> int:
    with _open(args) as store:
        was = store.is_admin(args.name)
        store.set_admin(args.name, not args.off)
    if was == (not args.off):
        print(f"{args.name} {'was not' if args.off else 'is already'} an admin")
    else:
        print(f"{args.name} is {'no longer' if args.off else 'now'} an admin")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    with _open(args) as store:
        key, secret = store.create_api_key(store.get_user(args.name), args.label, front_end=args.front_end)
    print(secret)
    print(f"API key {key.visible}... for {key.owner_name}: shown this once, store it now", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    with _open(args) as store:
        keys = store.list_api_keys(None if args.name is None else store.get_user(args.name))
    for k in keys:
        state = f"revoked {_when(k.revoked)}" if k.revoked else f"last used {_when(k.last_used)}"
        kind = "  front end" if k.front_end else ""
        print(f"{k.visible}...  {k.owner_name:<16} created {_when(k.created)}  {state}{kind}  {k.label}".rstrip())
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    asked = time.time()
    with _open(args) as store:
        k = store.revoke_api_key(args.key)
    if k.revoked is not None and k.revoked < asked:
        print(f"API key {k.visible}... of {k.owner_name} was revoked already, {_when(k.revoked)}")
    else:
        print(f"revoked API key {k.visible}... of {k.owner_name}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from radixchat.core.store import MAX_LIST

    if args.id is None:  # which ids there are: the newest first, archived ones too
        with _open(args) as store:
            convs = store.list_conversations(store.get_user(args.name), archived=None, limit=MAX_LIST)
        for c in convs:
            state = "  archived" if c.archived else ""
            print(f"{c.id:>6}  {_when(c.updated)}  {c.title}{state}")
        if not convs:
            print(f"{args.name} has no conversations", file=sys.stderr)
        return 0
    with _open(args) as store:
        text = store.export_conversation(store.get_user(args.name), args.id, args.format)
    if args.output is None:
        sys.stdout.write(text)
    else:
        try:
            args.output.write_text(text, encoding="utf-8")
        except OSError as e:
            raise SystemExit(f"radixchat: cannot write {args.output}: {e.strerror}") from None
        print(f"wrote {args.output}", file=sys.stderr)
    return 0
