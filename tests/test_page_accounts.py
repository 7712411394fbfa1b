"""Accounts in the page: one's own password and API keys (the Account tab), an admin's users
(the Admin tab), every admin action refused on the server for a non-admin; the store's roles,
disabled users and request limits underneath; `radixchat users add --admin`.

Handler tests call the tabs' handlers with a request signed in as alice (the first user, an
admin) or bob, against a real store; one browser test drives the Account tab at 1280 and 390 px.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import gradio as gr
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.engine.models import as_engines
from radixchat.core.store import AuthFailed, Store
from radixchat.webui.api.errors import install_error_handlers
from radixchat.webui.api.metrics import Metrics
from radixchat.webui.api.routes import include_api
from radixchat.webui.auth.device_cookie import DeviceCookies
from radixchat.webui.auth.gate import SessionTokens, page_cookie_id
from radixchat.webui.page.events import view as page_view
from radixchat.webui.page.events.accounts_handlers import NOT_ADMIN, AccountHandlers
from tests.support.cheap import cheap_scrypt
from tests.support.databases import database_at
from tests.support.fake_engine import FakeEngine

CHEAP = cheap_scrypt()


def signed_in(name: str, cookies: dict | None = None):
    """What Gradio hands a handler for a request whose cookie signs `name` in."""
    return SimpleNamespace(username=name, headers={}, cookies=cookies or {})


def from_tab(store, name: str, token: str):
    """A request of `name` from the tab whose sign-in cookie holds `token`."""
    return signed_in(name, {f"access-token-{page_cookie_id(store.path)}": token})


@pytest.fixture
def users(store):
    return store.create_user("alice", "alice-password"), store.create_user("bob", "bob-password")


@pytest.fixture
def said(monkeypatch) -> list[str]:
    """The notices the page showed."""
    shown: list[str] = []
    monkeypatch.setattr(page_view, "notice", lambda e: shown.append(e.message))
    return shown


@pytest.fixture
def tabs(store, users) -> AccountHandlers:
    return AccountHandlers(store)


def value(update):
    return update.get("value") if isinstance(update, dict) else getattr(update, "value", update)


def visible(update):
    return update.get("visible") if isinstance(update, dict) else getattr(update, "visible", None)


def api_client(store) -> TestClient:
    app = FastAPI()
    app.state.engines, app.state.settings, app.state.store = as_engines(FakeEngine()), Settings(), store
    app.state.metrics = Metrics(FakeEngine())
    install_error_handlers(app)
    include_api(app)
    return TestClient(app)


def models_status(http: TestClient, key: str) -> int:
    return http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code


# ---- the store ----


def test_the_first_user_is_an_admin_and_others_only_when_asked(store):
    store.create_user("alice", "alice-password")
    store.create_user("bob", "bob-password")
    store.create_user("carol", "carol-password", admin=True)
    assert [(a.name, a.admin) for a in store.accounts()] == [("alice", True), ("bob", False), ("carol", True)]
    assert store.is_admin("alice") and not store.is_admin("bob") and not store.is_admin("nobody")


def test_a_v12_database_makes_its_earliest_user_an_admin(tmp_path):
    path = database_at(tmp_path / "v12.db", 12, {"zed": 100.0, "amy": 200.0})  # zed made first, listed last
    store = Store(path, scrypt=CHEAP)
    try:
        assert store.migrated_from == 12
        assert [(a.name, a.admin, a.disabled, a.request_limit) for a in store.accounts()] == [
            ("amy", False, None, None),
            ("zed", True, None, None),
        ]
    finally:
        store.close()


def test_a_disabled_user_is_kept_out_everywhere_until_re_enabled(store, users):
    key_before = store.session_key("bob")
    _, key = store.create_api_key(users[1], "laptop")
    store.set_disabled("bob", True)
    assert not store.session_current("bob", key_before)  # the open page session ends
    assert store.session_key("bob") is None  # no new one, no device cookie
    with pytest.raises(AuthFailed):
        store.authenticate("bob", "bob-password")
    with pytest.raises(AuthFailed):
        store.api_key_holder(key)
    store.set_disabled("bob", False)
    assert store.authenticate("bob", "bob-password") == users[1]
    assert store.verify_api_key(key) == users[1]
    assert not store.session_current("bob", key_before)  # the old sign-in stays ended


def test_a_front_ends_disabled_end_user_is_refused(store, users):
    http = api_client(store)
    _, front = store.create_api_key(users[1], "Open WebUI", front_end=True)
    as_dave = {"Authorization": f"Bearer {front}", "X-Radixchat-User": "dave"}
    assert http.get("/v1/models", headers=as_dave).status_code == 200
    store.set_disabled("bob/dave", True)
    r = http.get("/v1/models", headers=as_dave)
    assert r.status_code == 400 and "disabled" in r.json()["error"]["message"]
    assert models_status(http, front) == 200  # the front end's own key still works


# ---- one's own password ----


def test_changing_ones_password_ends_the_other_sign_ins_and_keeps_this_one(store, users, tabs, said):
    tokens = SessionTokens(store)  # the server's sign-ins in memory, kept in the store too
    tokens["this-tab"], tokens["another-browser"] = "bob", "bob"
    store.open_page_session("bob", "before-a-restart")  # in the store only
    devices = DeviceCookies(store.session_key)
    device = dict([devices.issue("bob", secure=False).split(";")[0].split("=", 1)])
    _, key = store.create_api_key(users[1], "laptop")
    out = tabs.change_password("bob-password", "a-new-password", "a-new-password", from_tab(store, "bob", "this-tab"))
    assert said == [] and out[:3] == ("", "", "") and visible(out[4]) is False
    assert "other sign-ins" in out[3] and "this one goes on" in out[3] and "API keys still work" in out[3]
    assert tokens.get("this-tab") == "bob" and tokens.get("this-tab") == "bob"  # again: bound to the new key
    assert SessionTokens(store).get("this-tab") == "bob"  # after a restart too
    assert tokens.get("another-browser") is None and SessionTokens(store).get("before-a-restart") is None
    assert SessionTokens(store).get("another-browser") is None
    assert devices.trusted("bob", device) is None  # a browser that signed in before is no longer known
    assert store.verify_api_key(key) == users[1]  # keys stay, as the notice says
    assert store.authenticate("bob", "a-new-password").name == "bob"
    with pytest.raises(AuthFailed):
        store.authenticate("bob", "bob-password")


def test_a_password_changed_from_a_sign_in_the_store_lacks_says_to_sign_in_again(store, tabs, said):
    old_key = store.session_key("bob")
    out = tabs.change_password("bob-password", "a-new-password", "a-new-password", from_tab(store, "bob", "unknown"))
    assert out[:3] == ("", "", "") and "sign in again" in out[3] and visible(out[4]) is True
    assert said == []
    assert store.authenticate("bob", "a-new-password").name == "bob"
    assert not store.session_current("bob", old_key)
    with pytest.raises(AuthFailed):
        store.authenticate("bob", "bob-password")


@pytest.mark.parametrize(
    ("current", "new", "again", "words"),
    [
        ("wrong-password", "a-new-password", "a-new-password", "current password is wrong"),
        ("bob-password", "a-new-password", "another-password", "differ"),
        ("bob-password", "short", "short", "too short"),
        ("bob-password", "bad\ud800text", "bad\ud800text", "not valid text"),
    ],
)
def test_a_refused_password_change_is_a_notice_and_changes_nothing(store, tabs, said, current, new, again, words):
    key = store.session_key("bob")
    tabs.change_password(current, new, again, signed_in("bob"))
    assert len(said) == 1 and words in said[0], said
    assert store.session_current("bob", key) and store.authenticate("bob", "bob-password")


def test_wrong_current_passwords_are_limited(store, tabs, said):
    for _ in range(5):
        tabs.change_password("guess", "a-new-password", "a-new-password", signed_in("bob"))
    tabs.change_password("bob-password", "a-new-password", "a-new-password", signed_in("bob"))
    assert "Too many wrong passwords" in said[-1]
    assert store.authenticate("bob", "bob-password")


# ---- one's own API keys ----


def test_a_key_is_made_named_shown_once_listed_and_revoked_at_once(store, tabs, said):
    http = api_client(store)
    shown, rows, pick, cleared = tabs.create_key("laptop", signed_in("bob"))
    secret = value(shown)
    assert secret.startswith("rc-") and visible(shown) is True and cleared == ""
    assert models_status(http, secret) == 200
    [row] = rows
    assert row[0] == "laptop" and row[1] == secret[:10] + "..." and row[2] == "active"
    again_rows, _ = tabs.account_shown(signed_in("bob"))
    assert secret not in repr(again_rows)  # never shown again
    choices = [c[1] for c in pick.choices]
    assert choices == [secret[:10]]

    rows, pick, hidden = tabs.revoke_key(choices[0], signed_in("bob"))
    assert rows[0][2].startswith("revoked") and pick.choices == [] and visible(hidden) is False
    assert models_status(http, secret) == 401
    assert said == []


def test_nobody_lists_or_revokes_anyone_elses_keys(store, users, tabs, said):
    _, alices = store.create_api_key(users[0], "alice's")
    rows, pick = tabs.account_shown(signed_in("bob"))
    assert rows == [] and pick.choices == []
    tabs.revoke_key(alices[:10], signed_in("bob"))
    assert len(said) == 1 and "not found" in said[0]
    assert store.verify_api_key(alices) == users[0]


def test_revoking_with_nothing_picked_is_a_notice(tabs, said):
    tabs.revoke_key(None, signed_in("bob"))
    assert said == ["Pick the key to revoke first."]


def test_a_removed_users_open_tab_gets_a_notice(store, tabs, said):
    store.remove_user("bob")
    assert tabs.account_shown(signed_in("bob")) == (gr.skip(), gr.skip())
    tabs.create_key("laptop", signed_in("bob"))
    tabs.revoke_key("rc-AbCdEfG", signed_in("bob"))
    assert len(said) == 3 and all("signed out" in s for s in said), said


# ---- an admin's users ----


def test_the_admin_tab_shows_only_to_admins(store, tabs, said):
    tab, rows, pick = tabs.admin_shown(signed_in("alice"))
    assert visible(tab) is True and [r[0] for r in rows] == ["alice", "bob"] and pick.choices
    assert rows[0][1] == "admin" and rows[1][1:3] == ["user", "active"] and rows[1][4:6] == [0, 0]
    tab, rows, pick = tabs.admin_shown(signed_in("bob"))
    assert visible(tab) is False and rows == [] and pick.choices == []


def test_an_admin_adds_a_user_with_a_password_shown_once(store, tabs, said, caplog):
    caplog.set_level(logging.INFO, "radixchat.admin")
    shown, rows, pick, name, admin = tabs.add_user("carol", False, signed_in("alice"))
    assert "carol" in pick.choices[-1]
    assert said == [] and name == "" and admin is False and "carol" in [r[0] for r in rows]
    assert store.authenticate("carol", value(shown)).name == "carol" and not store.is_admin("carol")
    assert "admin alice added user carol" in caplog.text
    tabs.add_user("carol", False, signed_in("alice"))
    assert "already exists" in said[-1]
    tabs.add_user("bad name!", False, signed_in("alice"))
    assert len(said) == 2 and "name" in said[-1].lower(), said


def test_an_admin_disables_and_re_enables_a_user(store, users, tabs, said, caplog):
    caplog.set_level(logging.INFO, "radixchat.admin")
    http = api_client(store)
    _, key = store.create_api_key(users[1], "laptop")
    page_key = store.session_key("bob")
    rows, _, _ = tabs.disable("bob", signed_in("alice"))
    assert rows[1][2].startswith("disabled")
    assert not store.session_current("bob", page_key) and models_status(http, key) == 401
    assert "admin alice disabled user bob" in caplog.text
    rows, _, _ = tabs.enable("bob", signed_in("alice"))
    assert rows[1][2] == "active" and models_status(http, key) == 200
    assert "admin alice re-enabled user bob" in caplog.text
    tabs.disable("alice", signed_in("alice"))
    assert said == ["You cannot disable yourself."] and store.is_admin("alice")


def test_an_admin_resets_a_password_and_sets_a_request_limit(store, tabs, said, caplog):
    caplog.set_level(logging.INFO, "radixchat.admin")
    page_key = store.session_key("bob")
    _, _, shown = tabs.reset_password("bob", signed_in("alice"))
    assert store.authenticate("bob", value(shown)).name == "bob" and not store.session_current("bob", page_key)
    assert "admin alice reset the password of user bob" in caplog.text
    rows, _, _ = tabs.set_limit("bob", 3, signed_in("alice"))
    assert store.request_limit("bob") == 3 and rows[1][6] == 3
    assert tabs.user_picked("bob", signed_in("alice")) == 3 and tabs.user_picked("alice", signed_in("alice")) == 0
    assert "admin alice set the request limit of user bob to 3" in caplog.text
    tabs.set_limit("bob", 0, signed_in("alice"))
    assert store.request_limit("bob") is None
    for bad in (2.5, -1, 10**9):
        tabs.set_limit("bob", bad, signed_in("alice"))
    assert len(said) == 3 and all("whole number" in s for s in said) and store.request_limit("bob") is None
    tabs.disable(None, signed_in("alice"))
    assert said[-1] == "Pick a user first."


def admin_actions(tabs: AccountHandlers, target: str):
    """Every admin handler, called by whoever `request` signs in, aimed at `target`."""
    return {
        "add user": lambda r: tabs.add_user("mallory", True, r),
        "disable": lambda r: tabs.disable(target, r),
        "enable": lambda r: tabs.enable(target, r),
        "reset password": lambda r: tabs.reset_password(target, r),
        "set limit": lambda r: tabs.set_limit(target, 100, r),
        "read limit": lambda r: tabs.user_picked(target, r),
        "make admin": lambda r: tabs.make_admin("bob", r),
        "remove admin": lambda r: tabs.remove_admin(target, r),
    }


@pytest.mark.parametrize("action", list(admin_actions(None, "")))
def test_every_admin_action_is_refused_to_a_non_admin(store, users, tabs, said, caplog, action):
    store.set_disabled("alice", True)  # even "enable" would change something
    before = store.accounts()
    keys = store.session_key("bob")
    out = admin_actions(tabs, "alice")[action](signed_in("bob"))
    assert said == [NOT_ADMIN]
    assert all(o == gr.skip() for o in (out if isinstance(out, tuple) else [out]))  # nothing shown
    assert store.accounts() == before and store.session_key("bob") == keys
    assert "bob (not an admin) was refused" in caplog.text


def test_an_admin_makes_an_admin_and_ends_it_but_never_for_the_last(store, users, tabs, said, caplog):
    caplog.set_level(logging.INFO, "radixchat.admin")
    tabs.remove_admin("alice", signed_in("alice"))  # herself, the only admin
    assert len(said) == 1 and "last admin" in said[0] and store.is_admin("alice"), said
    rows, pick, _ = tabs.make_admin("bob", signed_in("alice"))
    assert store.is_admin("bob") and rows[1][:2] == ["bob", "admin"] and ("bob", "bob") in pick.choices
    assert "admin alice made user bob an admin" in caplog.text
    tabs.remove_admin("alice", signed_in("alice"))  # another admin is left: she may
    assert len(said) == 1 and not store.is_admin("alice") and store.is_admin("bob")
    assert "admin alice made user alice no longer an admin" in caplog.text
    tabs.make_admin("bob", signed_in("alice"))  # no longer an admin: refused
    assert said[-1] == NOT_ADMIN
    store.create_user("carol", "carol-password", admin=True)
    store.set_disabled("carol", True)  # a disabled admin manages nothing: bob is still the last
    tabs.remove_admin("bob", signed_in("bob"))
    assert "last admin" in said[-1] and store.is_admin("bob")
    tabs.make_admin(None, signed_in("bob"))
    assert said[-1] == "Pick a user first."


def test_no_auth_has_no_admin_tab_no_admin_and_refuses_every_admin_action(store, said):
    from radixchat.webui.page.logic.chat_page import ChatPage

    local = ChatPage(FakeEngine(), store, signed_in=False).user(None)  # --no-auth's one user, on a fresh store
    assert not store.is_admin(local.name)
    store.create_user("alice", "alice-password")  # the first real account is the admin
    assert store.is_admin("alice")
    tabs = AccountHandlers(store, sign_in=False)
    tab, rows, pick = tabs.admin_shown(signed_in(None))
    assert visible(tab) is False and rows == [] and pick.choices == []
    before = store.accounts()
    for action in admin_actions(tabs, "alice").values():
        action(signed_in("alice"))  # even a request that names an admin
    assert said == ["There are no accounts to manage without sign-in."] * len(admin_actions(tabs, ""))
    assert store.accounts() == before


def test_the_no_auth_page_has_no_account_or_admin_tab(store):
    from radixchat.webui.page.ui.layout import build_page

    page = build_page(FakeEngine(), Settings(), store, sign_in=False)
    labels = {c.get("props", {}).get("label") for c in page.get_config_file()["components"]}
    assert "Chat" in labels and "Admin" not in labels and "Account" not in labels


def test_a_front_ends_end_users_are_never_admins(store):
    store.create_user("alice", "alice-password")
    front = store.create_user("webui", "webui-password")
    store.remove_user("alice")  # no admin left: the next account made is one
    assert not store.is_admin(store.end_user(front, "dave").name)  # an end user is no account
    store.create_user("carol", "carol-password")
    assert store.is_admin("carol") and not store.is_admin("webui")


def test_a_disabled_admin_is_no_admin(store, users, tabs, said):
    store.create_user("carol", "carol-password", admin=True)
    store.set_disabled("alice", True)
    tabs.disable("bob", signed_in("alice"))
    assert said == [NOT_ADMIN] and store.session_key("bob") is not None


def test_usage_counts_a_users_requests_and_tokens(store, users, tabs):
    from radixchat.core.store import RequestRecord

    store.record_request(RequestRecord(user=users[1].id, prompt_tokens=7, generated_tokens=5))
    _, rows, _ = tabs.admin_shown(signed_in("alice"))
    assert rows[1][:1] + rows[1][4:6] == ["bob", 1, 12]


# ---- in the browser ----

OPEN_TAB = """([name]) => { const tab = [...document.querySelectorAll('button[role=tab]')]
    .find(b => b.innerText.trim() == name); if (tab) { tab.click(); return true; } return false; }"""
# the same, or else Gradio's "More tabs" menu opened, where a tab that did not fit is
OPEN_OR_MORE = """([name]) => { const tab = [...document.querySelectorAll('button[role=tab]')]
    .find(b => b.innerText.trim() == name && b.offsetParent !== null);
  if (tab) { tab.click(); return true; }
  const more = document.querySelector('button[aria-label="More tabs"]');
  if (more && more.offsetParent !== null) more.click();
  return false; }"""


def open_tab(page, name: str) -> None:
    """A tab opened by its name (on a phone Gradio may fold tabs into its "More tabs" menu)."""
    page.wait_for_function(OPEN_OR_MORE, arg=[name], polling=500)


def pick(page, elem_id: str, text: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.locator("[data-testid=dropdown-option]", has_text=text).first.click()


@pytest.fixture(scope="module")
def accounts_server(page_model, tmp_path_factory):
    from tests.support.server import page_server, stop_clean

    srv = page_server(page_model, tmp_path_factory.mktemp("accounts-db"), "--max-tokens", "20")
    yield srv
    stop_clean(srv)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "size"), [("alice", "wide"), ("bob", "phone")])
def test_in_the_browser_a_key_is_made_and_revoked_and_a_password_change_ends_only_other_sign_ins(
    accounts_server, browser, name, size
):
    import httpx

    from tests.support.browser import OUTPUT, PHONE, VIOLATIONS, WIDE, Shots
    from tests.support.page import ready, sign_in

    laptop = {**WIDE, "height": 800}  # where a new key was shown at the bottom edge
    server, viewport = accounts_server, {"wide": laptop, "phone": PHONE}[size]
    shot = Shots(OUTPUT / f"page-accounts-{viewport['width']}")
    ctx, outside = browser.new_context(viewport=viewport), []
    ctx.on("request", lambda r: r.url.startswith((server.url, "data:", "blob:")) or outside.append(r.url))
    ctx.add_init_script(VIOLATIONS)  # what the page's content policy blocked, in window.__csp
    page = ctx.new_page()
    sign_in(page, server.url, name)
    ready(page)
    # alice, the first user, is an admin; bob is not, and has no Admin tab
    has_admin = OPEN_TAB.replace("tab.click(); ", "")
    if name == "alice":
        page.wait_for_function(f"({has_admin})(['Admin'])")
        open_tab(page, "Admin")
        page.wait_for_function("document.querySelector('#user-list').innerText.includes('bob')")
        shot(page, "alice-admin-tab")
        phone = browser.new_context(viewport=PHONE).new_page()  # on a phone: nothing scrolls sideways
        sign_in(phone, server.url, name)
        ready(phone)
        phone.wait_for_function(f"({has_admin})(['Admin'])")
        open_tab(phone, "Admin")
        phone.wait_for_function("document.querySelector('#user-list').innerText.includes('bob')")
        assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        shot(phone, "alice-admin-tab-390")
        phone.context.close()
    else:
        page.wait_for_timeout(1000)  # the page's load has shown what it shows
        assert not page.evaluate(has_admin, ["Admin"])
    open_tab(page, "Account")
    page.locator("#key-name input, #key-name textarea").first.fill("laptop <b>bold</b>")
    page.locator("#create-key").click()
    page.wait_for_function("(document.querySelector('#new-key textarea, #new-key input')?.value || '').length > 10")
    secret = page.locator("#new-key textarea, #new-key input").first.input_value()
    # the key, shown this once, is in view: the box and its copy button
    page.wait_for_function(
        """() => { const r = document.querySelector('#new-key').getBoundingClientRect();
                   return r.top >= 0 && r.bottom <= window.innerHeight; }""",
        timeout=5_000,
    )
    page.wait_for_function("document.querySelector('#key-list').innerText.includes('laptop')")
    table = page.locator("#key-list").inner_text()
    assert secret[:10] in table and "active" in table and secret not in table
    assert "laptop <b>bold</b>" in table and page.locator("#key-list b").count() == 0  # a name is text
    shot(page, f"{name}-key-made")
    models = f"{server.url}/v1/models"
    assert httpx.get(models, headers={"Authorization": f"Bearer {secret}"}).status_code == 200

    pick(page, "key-pick", "laptop")
    page.locator("#revoke-key").click()
    page.wait_for_function("document.querySelector('#key-list').innerText.includes('revoked')")
    assert httpx.get(models, headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    shot(page, f"{name}-key-revoked")
    assert page.evaluate("window.__csp || []") == [] and outside == []

    # another browser signed in as the same user: the change ends it, and keeps this tab's
    other = browser.new_context(viewport=viewport).new_page()
    sign_in(other, server.url, name)
    ready(other)
    page.locator("#current-password input").fill(f"{name}-password")
    page.locator("#new-password input").fill(f"{name}-new-password")
    page.locator("#new-password-again input").fill(f"{name}-new-password")
    page.locator("#change-password").click()
    page.wait_for_function("document.querySelector('#password-changed').innerText.includes('this one goes on')")
    assert not page.locator("#sign-in-again").is_visible()
    shot(page, f"{name}-password-changed")
    page.locator("#key-name input, #key-name textarea").first.fill("after the change")
    page.locator("#create-key").click()  # this tab acts as before
    page.wait_for_function("document.querySelector('#key-list').innerText.includes('after the change')")
    page.reload()
    ready(page)  # and is still signed in after a reload
    other.reload()
    other.wait_for_selector("input[type=password]")  # the other browser is at the sign-in page
    other.locator("input[type=text]").fill(name)
    other.locator("input[type=password]").fill(f"{name}-new-password")
    other.get_by_role("button", name="Login").click()
    ready(other)
    shot(page, f"{name}-still-signed-in")
    other.context.close()
    page.context.close()
