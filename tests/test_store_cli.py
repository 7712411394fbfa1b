"""The admin commands (`radixchat users|keys|export`) as an admin runs them: real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from radixchat.core.store import AuthFailed, Store
from tests.support.cheap import cheap_scrypt

RADIXCHAT = shutil.which("radixchat", path=os.path.dirname(sys.executable)) or "radixchat"
CHEAP = cheap_scrypt()


def run(*args, env=None, **kw):
    return subprocess.run(
        [RADIXCHAT, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}, **kw
    )


def refused(out, text):
    """Exit code 1 and one line naming the problem, no traceback."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert len(lines) == 1 and text in lines[0] and lines[0].startswith("radixchat: "), out.stderr
    return True


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "admin.db")


@pytest.fixture
def pwfile(tmp_path):
    f = tmp_path / "pw"
    f.write_text("correct horse battery\n")
    return str(f)


@pytest.mark.slow
def test_users_keys_lifecycle(db, pwfile):
    out = run("users", "add", "alice", "--password-file", pwfile, "--db", db)
    assert out.returncode == 0 and out.stdout.strip() == "added user alice (admin)", out.stderr  # the first
    assert refused(run("users", "add", "alice", "--password-file", pwfile, "--db", db), "already exists")
    out = run("users", "list", "--db", db)
    assert out.returncode == 0 and out.stdout.split()[0] == "alice"
    with Store(db, scrypt=CHEAP) as store:  # the password file's first line, without its newline
        alice = store.authenticate("alice", "correct horse battery")

    out = run("keys", "create", "alice", "--label", "laptop", "--db", db)
    assert out.returncode == 0, out.stderr
    key = out.stdout.strip()
    assert key.startswith("rc-") and "\n" not in key and "shown this once" in out.stderr
    with Store(db, scrypt=CHEAP) as store:
        assert store.verify_api_key(key) == alice
    out = run("keys", "list", "--db", db)
    assert out.returncode == 0 and key[:10] in out.stdout and "laptop" in out.stdout
    assert key not in out.stdout

    out = run("keys", "revoke", key[:10], "--db", db)
    assert out.returncode == 0 and "revoked" in out.stdout, out.stderr
    with Store(db, scrypt=CHEAP) as store, pytest.raises(AuthFailed, match="revoked"):
        store.verify_api_key(key)
    again = run("keys", "revoke", key[:10], "--db", db)  # it said "revoked" again
    assert again.returncode == 0 and "was revoked already" in again.stdout, again.stdout
    assert refused(run("keys", "revoke", "rc-nothere", "--db", db), "not found")
    assert refused(run("keys", "create", "nobody", "--db", db), "user 'nobody' not found")

    out = run("users", "remove", "alice", "--db", db)
    assert out.returncode == 0 and "removed user alice" in out.stdout
    assert run("users", "list", "--db", db).stdout.strip() == ""
    assert refused(run("users", "remove", "alice", "--db", db), "user 'alice' not found")


@pytest.mark.slow
def test_users_add_admin_makes_an_admin(db, pwfile):
    assert run("users", "add", "alice", "--password-file", pwfile, "--db", db).returncode == 0
    out = run("users", "add", "bob", "--password-file", pwfile, "--db", db)
    assert out.returncode == 0 and out.stdout.strip() == "added user bob", out.stderr
    out = run("users", "add", "carol", "--admin", "--password-file", pwfile, "--db", db)
    assert out.returncode == 0 and out.stdout.strip() == "added user carol (admin)", out.stderr
    with Store(db, scrypt=CHEAP) as store:
        assert [(a.name, a.admin) for a in store.accounts()] == [("alice", True), ("bob", False), ("carol", True)]
    listed = {line.split()[0]: line for line in run("users", "list", "--db", db).stdout.splitlines()}
    assert "admin" in listed["carol"] and "admin" not in listed["bob"]


@pytest.mark.slow
def test_users_admin_makes_an_admin_and_off_ends_it_but_never_the_last(db, pwfile):
    for name in ("alice", "bob"):
        assert run("users", "add", name, "--password-file", pwfile, "--db", db).returncode == 0
    out = run("users", "admin", "bob", "--db", db)
    assert out.returncode == 0 and out.stdout.strip() == "bob is now an admin", out.stderr
    out = run("users", "admin", "alice", "--off", "--db", db)
    assert out.returncode == 0 and out.stdout.strip() == "alice is no longer an admin", out.stderr
    assert refused(run("users", "admin", "bob", "--off", "--db", db), "bob is the last admin")
    assert refused(run("users", "admin", "nobody", "--db", db), "user 'nobody' not found")
    assert run("users", "admin", "bob", "--db", db).stdout.strip() == "bob is already an admin"
    with Store(db, scrypt=CHEAP) as store:
        assert [(a.name, a.admin) for a in store.accounts()] == [("alice", False), ("bob", True)]
    # the last admin may go (the next account made is one), and the command says so
    out = run("users", "remove", "bob", "--db", db)
    assert out.returncode == 0 and "no admin is left: the next account added will be one" in out.stdout, out.stdout
    # a front end's end user's name is not an account's, refused before the password is asked
    assert refused(run("users", "add", "webui/dave", "--db", db), "'/' is kept for a front end's end users")


@pytest.mark.slow
def test_export_json_and_markdown(db):
    with Store(db, scrypt=CHEAP) as store:
        alice = store.create_user("alice", "alice-password")
        store.create_user("bob", "bob-password")
        conv = store.create_conversation(alice, "Lists", system_prompt="Be brief.")
        store.append_message(alice, conv.id, "user", "What is a list? ünïcode")
        store.append_message(alice, conv.id, "assistant", "A sequence.")

    out = run("export", "alice", str(conv.id), "--db", db)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["title"] == "Lists" and [m["content"] for m in doc["messages"]] == [
        "What is a list? ünïcode",
        "A sequence.",
    ]
    out = run("export", "alice", str(conv.id), "--format", "md", "--db", db)
    assert out.returncode == 0 and out.stdout.startswith("# Lists\n")
    assert "## Assistant\n\nA sequence." in out.stdout
    assert refused(run("export", "bob", str(conv.id), "--db", db), f"conversation {conv.id} not found")
    assert refused(run("export", "carol", str(conv.id), "--db", db), "user 'carol' not found")
    # without an id, the ids there are (nothing listed them: USERS.md's `export alice 12` was a guess)
    listed = run("export", "alice", "--db", db)
    assert listed.returncode == 0 and listed.stdout.split()[0] == str(conv.id) and "Lists" in listed.stdout
    none = run("export", "bob", "--db", db)
    assert none.returncode == 0 and none.stdout == "" and "bob has no conversations" in none.stderr


@pytest.mark.slow
def test_bad_input_is_one_line(db, pwfile, tmp_path):
    assert refused(run("users", "add", "bad name", "--password-file", pwfile, "--db", db), "bad user name")
    short = tmp_path / "short"
    short.write_text("abc\n")
    assert refused(run("users", "add", "carol", "--password-file", str(short), "--db", db), "too short")
    assert refused(
        run("users", "add", "carol", "--password-file", str(tmp_path / "none"), "--db", db), "cannot read password file"
    )
    # no terminal to ask on (own session, stdin closed): told to use --password-file
    out = run("users", "add", "carol", "--db", db, stdin=subprocess.DEVNULL, start_new_session=True)
    assert refused(out, "--password-file")
    # nothing was made by the refusals, not even the database; a command that only reads
    # makes none (a mistyped --db made an empty one and said there were no users)
    assert refused(run("users", "list", "--db", db), "no database at")
    assert refused(run("keys", "list", "--db", str(tmp_path / "typo" / "x.db")), "no database at")
    assert not (tmp_path / "typo").exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    assert refused(run("users", "list", "--db", str(junk)), "cannot open")


@pytest.mark.slow
def test_default_db_is_in_the_user_data_folder(tmp_path, pwfile):
    env = {k: v for k, v in os.environ.items() if k != "RADIXCHAT_DB"}
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "data"))
    out = subprocess.run(
        [RADIXCHAT, "users", "add", "dora", "--password-file", pwfile],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "home" / "Library" / "Application Support" if sys.platform == "darwin" else tmp_path / "data"
    assert (folder / "radixchat" / "radixchat.db").exists()
