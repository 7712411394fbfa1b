"""What the Account and Admin tabs do: one's own password and API keys; an admin's users.

`AccountHandlers` holds every handler of both tabs (webui/page/ui/account_tab.py and
admin_tab.py make the components and hook these to them). Each takes the signed-in user from
the request (`request.username`, which Gradio read from the sign-in cookie through the gate's
`SessionTokens`, webui/auth/gate.py), never from a value the browser sent: an admin handler asks the
store whether that user is an admin before it reads or changes anything, refuses everyone else
with a notice, and logs every action it takes (who did what to whom) on `radixchat.admin`;
with no sign-in (--no-auth) every admin handler refuses and the Admin tab stays hidden.
What is stored is core.store's (accounts.py); a refusal is a notice (webui/page/events/view.py's
`notices`), never a traceback or the store's internal text. A secret made here (an API key, a
generated password) is returned once, to the one output that shows it, and kept nowhere. A
password change keeps the sign-in it was made from: its cookie's token (named as
webui/auth/gate.py names it) goes to the store, which binds that one to the new session key.

Runs in Gradio's worker threads (password hashing too: a change is rare, and a signed-in
user's failures are limited here). No MLX.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import gradio as gr

from radixchat.core.store import AlreadyExists, AuthFailed, Invalid, NotFound, Store, StoreError, User
from radixchat.core.store.accounts import new_password
from radixchat.webui.auth.gate import page_cookie_id, sign_in_token
from radixchat.webui.page.events.view import notices
from radixchat.webui.page.logic.errors import PageError, check_text

log = logging.getLogger("radixchat.admin")

KEY_HEADERS = ["Name", "Key", "State", "Created", "Last used"]  # what matters most first, for a phone
USER_HEADERS = ["User", "Role", "State", "Created", "Requests", "Tokens", "Request limit"]
NOT_ADMIN = "Only an admin can do this."
NO_ACCOUNTS = "There are no accounts to manage without sign-in."
# wrong current passwords before a user must wait: the page is no way round sign-in's lockout
MAX_WRONG, WRONG_WAIT_S = 5, 300.0

V = TypeVar("V")
# the admin table's rows: names and words, and counts
UserRows = list[list[str | int]]


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _sentence(e: StoreError) -> str:
    """The store's refusal of what the person typed, as a sentence (its text names only that)."""
    text = str(e)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _whole(limit: float | str | None) -> int | None:
    """A request limit as typed: None for empty or 0 (the server's), else a whole number."""
    if limit is None or limit == "":
        return None
    try:
        number = float(limit)
    except (TypeError, ValueError, OverflowError):
        number = 0.5
    if not number.is_integer():
        raise PageError("A request limit is a whole number (empty or 0: the server's limit).")
    return int(number) or None


class AccountHandlers:
    """The Account and Admin tabs' handlers (see the module docstring)."""

    def __init__(self, store: Store, *, sign_in: bool = True):
        self.store = store
        self.sign_in = sign_in  # False with --no-auth: no accounts, so no admin either
        self._cookie_id = page_cookie_id(store.path)
        self._wrong: dict[str, list[float]] = {}  # name -> times of their wrong current passwords
        self._lock = threading.Lock()

    # ---- who is asking ----

    def who(self, request: gr.Request) -> str:
        name = getattr(request, "username", None)
        if not isinstance(name, str) or not name:
            raise PageError("You are signed out: reload the page and sign in again.")
        return name

    def _user(self, name: str) -> User:
        try:
            return self.store.get_user(name)
        except NotFound:  # removed meanwhile: their sign-in ends at its next request
            raise PageError("You are signed out: reload the page and sign in again.") from None

    def admin(self, request: gr.Request, action: str, target: str = "") -> str:
        """The signed-in user if they are an admin; else PageError, the attempt logged. With
        no sign-in (--no-auth) nobody is: there are no accounts to manage."""
        if not self.sign_in:
            log.warning("refused with no sign-in (--no-auth): %s %s", action, target)
            raise PageError(NO_ACCOUNTS)
        name = self.who(request)
        if not self.store.is_admin(name):
            log.warning("%s (not an admin) was refused: %s %s", name, action, target)
            raise PageError(NOT_ADMIN)
        return name

    # ---- one's own account ----

    def keys(self, name: str) -> tuple[list[list[str]], gr.Dropdown]:
        """One's keys as the table shows them, and the revoke picker's choices (active keys)."""
        keys = self.store.list_api_keys(self._user(name))
        rows = [
            [
                k.label or "-",
                f"{k.visible}...",
                "active" if k.revoked is None else f"revoked {_when(k.revoked)}",
                _when(k.created),
                _when(k.last_used),
            ]
            for k in keys
        ]
        active = [(f"{k.label or '(no name)'} · {k.visible}...", k.visible) for k in keys if k.revoked is None]
        return rows, gr.Dropdown(choices=active, value=None)

    @notices(2)
    def account_shown(self, request: gr.Request) -> tuple[list[list[str]], gr.Dropdown]:
        return self.keys(self.who(request))

    @notices(5)
    def change_password(
        self, current: str, new: str, again: str, request: gr.Request
    ) -> tuple[str, str, str, str, gr.Button]:
        """One's own password, the current one first. Every other sign-in of the user ends
        (other tabs, browsers and devices: whoever may have learnt the old password), this one
        goes on; API keys are left as they are, which the page says. Should this sign-in not be
        kept (one the store could not keep), the page says to sign in again, with the button."""
        name = self.who(request)
        for text in (current, new, again):
            check_text(text, "password")
        if (new or "") != (again or ""):
            raise PageError("The two new passwords differ; nothing changed.")
        self._wait_if_wrong(name)
        try:
            kept = self.store.change_own_password(name, current or "", new or "", keep=self._token(request))
        except AuthFailed:
            self._note_wrong(name)
            raise PageError("The current password is wrong; nothing changed.") from None
        except (Invalid, NotFound) as e:
            raise PageError(_sentence(e)) from None
        log.info("%s changed their password; their other sign-ins ended", name)
        if not kept:
            done = "**Password changed.** Every sign-in of yours has ended, this one too: sign in again with the new password."
            return "", "", "", done, gr.Button(visible=True)
        done = (
            "**Password changed.** Your other sign-ins (other tabs, browsers and devices) have ended; this one goes on. "
            "Your API keys still work: revoke below any you no longer trust."
        )
        return "", "", "", done, gr.Button(visible=False)

    def _token(self, request: gr.Request) -> str | None:
        """The token of this tab's sign-in cookie (None: none found)."""
        try:
            cookies = dict(getattr(request, "cookies", None) or {})
        except (TypeError, ValueError):
            return None
        return sign_in_token(cookies, self._cookie_id)

    def _wait_if_wrong(self, name: str) -> None:
        with self._lock:
            now = time.monotonic()
            recent = [t for t in self._wrong.get(name, []) if now - t < WRONG_WAIT_S]
            self._wrong[name] = recent
        if len(recent) >= MAX_WRONG:
            wait = int(WRONG_WAIT_S - (now - recent[0])) // 60 + 1
            raise PageError(f"Too many wrong passwords: try again in {wait} minute{'s' * (wait != 1)}.")

    def _note_wrong(self, name: str) -> None:
        with self._lock:
            self._wrong.setdefault(name, []).append(time.monotonic())

    @notices(4)
    def create_key(self, label: str, request: gr.Request) -> tuple[gr.Textbox, list[list[str]], gr.Dropdown, str]:
        """A new key of one's own: shown this once (the store keeps only its hash)."""
        name = self.who(request)
        check_text(label, "key name")
        user = self._user(name)
        try:
            key, secret = self.store.create_api_key(user, label or "")
        except (Invalid, NotFound) as e:
            raise PageError(_sentence(e)) from None
        log.info("%s created API key %s...", name, key.visible)
        return gr.Textbox(value=secret, visible=True), *self.keys(name), ""

    @notices(3)
    def revoke_key(self, visible: str | None, request: gr.Request) -> tuple[list[list[str]], gr.Dropdown, gr.Textbox]:
        """One of one's own keys revoked: the API refuses it from now on (401)."""
        name = self.who(request)
        if not visible:
            raise PageError("Pick the key to revoke first.")
        user = self._user(name)
        try:
            key = self.store.revoke_api_key(visible, user=user)
        except (Invalid, NotFound) as e:
            raise PageError(_sentence(e)) from None
        log.info("%s revoked API key %s...", name, key.visible)
        return *self.keys(name), gr.Textbox(value="", visible=False)

    # ---- an admin's users ----

    def users(self) -> tuple[UserRows, gr.Dropdown]:
        """Every user as the admin table shows them, and the user picker's choices."""
        accounts = self.store.accounts()
        rows: UserRows = [
            [
                a.name,
                "admin" if a.admin else "user",
                "active" if a.disabled is None else f"disabled {_when(a.disabled)}",
                _when(a.created),
                a.requests,
                a.tokens,
                "server's" if a.request_limit is None else a.request_limit,
            ]
            for a in accounts
        ]
        return rows, gr.Dropdown(choices=[a.name for a in accounts])

    @notices(3)
    def admin_shown(self, request: gr.Request) -> tuple[gr.Tab, UserRows, gr.Dropdown]:
        """The Admin tab, shown to admins only, with its table (nothing for anyone else)."""
        if not self.sign_in or not self.store.is_admin(self.who(request)):
            return gr.Tab(visible=False), [], gr.Dropdown(choices=[])
        return gr.Tab(visible=True), *self.users()

    @notices(5)
    def add_user(
        self, name: str, make_admin: bool, request: gr.Request
    ) -> tuple[gr.Textbox, UserRows, gr.Dropdown, str, bool]:
        """A new user with a generated password, shown to the admin this once."""
        who = self.admin(request, "add user", repr(name))
        check_text(name, "user name")
        name = (name or "").strip()
        password = new_password()
        try:
            self.store.create_user(name, password, admin=bool(make_admin))
        except (Invalid, AlreadyExists) as e:
            raise PageError(_sentence(e)) from None
        log.info("admin %s added user %s%s", who, name, " (admin)" * bool(make_admin))
        shown = f"New user **{name}**: give them this password (shown this once; they can change it under Account)."
        return gr.Textbox(value=password, visible=True, label=shown.replace("**", "")), *self.users(), "", False

    def _flag(
        self,
        request: gr.Request,
        action: str,
        name: str | None,
        setter: Callable[[str, bool], None],
        value: bool,
        done: str,
        not_self: str | None = None,
    ) -> tuple[UserRows, gr.Dropdown, gr.Textbox]:
        """Set one of a user's flags for an admin (refused on oneself with `not_self`), logged
        as `done` with the user's name filled in; the refreshed user list, the password box hidden."""
        who = self.admin(request, action, repr(name))
        if not_self is not None and name == who:
            raise PageError(not_self)
        self._change(name, setter, value)
        log.info("admin %s %s", who, done.format(name=name))
        return *self.users(), gr.Textbox(value="", visible=False)

    @notices(3)
    def disable(self, name: str | None, request: gr.Request) -> tuple[UserRows, gr.Dropdown, gr.Textbox]:
        return self._flag(
            request,
            "disable",
            name,
            self.store.set_disabled,
            True,
            "disabled user {name}",
            "You cannot disable yourself.",
        )

    @notices(3)
    def enable(self, name: str | None, request: gr.Request) -> tuple[UserRows, gr.Dropdown, gr.Textbox]:
        return self._flag(request, "enable", name, self.store.set_disabled, False, "re-enabled user {name}")

    @notices(3)
    def reset_password(self, name: str | None, request: gr.Request) -> tuple[UserRows, gr.Dropdown, gr.Textbox]:
        """A user's password replaced by a generated one, shown to the admin this once; every
        page sign-in of that user ends."""
        who = self.admin(request, "reset password", repr(name))
        if name == who:
            raise PageError("Change your own password under Account.")
        password = new_password()
        self._change(name, self.store.set_password, password)
        log.info("admin %s reset the password of user %s", who, name)
        label = f"New password of {name} (shown this once; their sign-ins have ended)"
        return *self.users(), gr.Textbox(value=password, visible=True, label=label)

    @notices(3)
    def make_admin(self, name: str | None, request: gr.Request) -> tuple[UserRows, gr.Dropdown, gr.Textbox]:
        """The picked user may manage the others from now on."""
        return self._flag(request, "make admin", name, self.store.set_admin, True, "made user {name} an admin")

    @notices(3)
    def remove_admin(self, name: str | None, request: gr.Request) -> tuple[UserRows, gr.Dropdown, gr.Textbox]:
        """The picked user (oneself too) an admin no more; never the last one."""
        done = "made user {name} no longer an admin"
        return self._flag(request, "remove admin", name, self.store.set_admin, False, done)

    @notices(1)
    def user_picked(self, name: str | None, request: gr.Request) -> int:
        """The picked user's own request limit into its box (0: the server's)."""
        self.admin(request, "read the request limit of", repr(name))
        return (self.store.request_limit(name) or 0) if name else 0

    @notices(3)
    def set_limit(
        self, name: str | None, limit: float | str | None, request: gr.Request
    ) -> tuple[UserRows, gr.Dropdown, gr.Textbox]:
        """A user's own request limit; empty (or 0): the server's --max-user-requests."""
        who = self.admin(request, "set request limit", repr(name))
        value = _whole(limit)
        self._change(name, self.store.set_request_limit, value)
        log.info("admin %s set the request limit of user %s to %s", who, name, value or "the server's")
        return *self.users(), gr.Textbox(value="", visible=False)

    def _change(self, name: str | None, change: Callable[[str, V], object], value: V) -> None:
        if not name:
            raise PageError("Pick a user first.")
        try:
            change(name, value)
        except (Invalid, NotFound) as e:
            raise PageError(_sentence(e)) from None
