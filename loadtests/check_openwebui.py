"""A manual check that Open WebUI's users arrive at radixchat as radixchat users of their own.

Not a test of the suite: Open WebUI is ~6 GB, installed (once, if missing) into a venv of its
own outside the repository (`--venv`, default /tmp/openwebui-venv) with pip and its configured
index; nothing else is fetched while it runs (Open WebUI offline, no telemetry, no embedding
model).

This process starts two others and runs a thread of its own:
- `radixchat serve` of this environment on a loopback port, its store in a temporary folder,
  with a trusted front end's key (`radixchat users add openwebui`, `radixchat keys create
  openwebui --front-end`);
- a recording proxy (a thread here) between the two: every request Open WebUI makes to
  radixchat passes through it, so what Open WebUI sends with its defaults, and each answer's
  status (a refusal's body whole), is printed at the end;
- `open-webui serve` of that venv, its DATA_DIR in the temporary folder, pointed at the proxy
  with the front-end key and ENABLE_FORWARD_USER_INFO_HEADERS=true.

Then, over Open WebUI's HTTP API: the first signup (its admin) adds a second user and makes
radixchat's model public (a connection's models are the admin's alone until then); each user
sends one chat completion as an API client would (`/api/chat/completions`, model and messages
only) and one as Open WebUI's chat page does (a new chat, a socket session id, the title, tags
and follow-up tasks on, its built-in tools), waited for until Open WebUI has saved the reply
and the background tasks have gone quiet. The checks read radixchat's SQLite store: the
requests are two distinct users, openwebui/<Open WebUI's user id> each. One PASS/FAIL line
per check; the exit status is 1 if any failed.

With `--lean`, Open WebUI runs with the settings for a small model instead of its defaults
(no title, tags or follow-up requests; the model's built-in tools off), and a check says
that only the chats themselves reached radixchat.

    python -m loadtests.check_openwebui [--venv /tmp/openwebui-venv] [--model default] [--lean] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.support.procs import RADIXCHAT, free_port, start_and_wait, stop_process

OPEN_WEBUI = "open-webui==0.12.4"
FRONT = "openwebui"  # the radixchat user whose front-end key Open WebUI holds
# request headers worth showing from what Open WebUI sends (the rest is transport)
SHOWN_HEADERS = ("x-openwebui-user-id", "x-openwebui-user-name", "x-openwebui-user-role", "x-openwebui-chat-id")
# the words Open WebUI's task prompts open with, to tell its background requests apart
TASKS = {
    "title": "Generate a concise title",
    "tags": "Generate 1-3 broad tags",
    "follow-ups": "Predict 3-5 useful messages",
    "task": "### Task:",  # another of its task prompts (queries, autocomplete, ...)
}

results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> bool:
    results.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


# ---------------------------------------------------------------- Open WebUI's own venv


def ensure_open_webui(venv: Path) -> Path:
    """The venv's `open-webui` command, installed first if the venv lacks this release."""
    exe = venv / "bin" / "open-webui"
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    if exe.exists():
        shown = subprocess.run([*pip, "show", "open-webui"], capture_output=True, text=True).stdout
        if f"Version: {OPEN_WEBUI.split('==')[1]}" in shown:
            return exe
    if not (venv / "bin" / "python").exists():
        # the base interpreter, not this venv's: Open WebUI's dependencies stay out of radixchat's
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    print(f"installing {OPEN_WEBUI} into {venv} (about 6 GB; minutes)", flush=True)
    subprocess.run([*pip, "install", "-q", OPEN_WEBUI], check=True)
    return exe


# ---------------------------------------------------------------- the recording proxy


class Proxy:
    """A loopback HTTP server that forwards every request to radixchat and records it: what
    was sent (path, Open WebUI's user headers, the JSON body) and the answer's status and
    body. Answers are read whole before they are passed on (a stream arrives at once), which
    Open WebUI's SSE reader does not mind."""

    def __init__(self, upstream: str):
        self.seen: list[dict] = []
        seen, lock = self.seen, threading.Lock()
        client = httpx.Client(base_url=upstream, timeout=600)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                r = client.request(self.command, self.path, content=body, headers=headers)
                entry = {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items() if k.lower() in SHOWN_HEADERS},
                    "body": _json(body),
                    "status": r.status_code,
                    "answer": r.text,
                    "at": time.time(),
                }
                with lock:
                    seen.append(entry)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    # httpx has already decoded and de-chunked the body
                    if k.lower() not in ("content-length", "content-encoding", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_POST = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def last_at(self) -> float:
        return max((e["at"] for e in self.seen), default=0.0)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _json(body: bytes):
    try:
        return json.loads(body) if body else None
    except ValueError:
        return body.decode(errors="replace")


def answer_of(entry: dict) -> str:
    """What radixchat answered, in short: the reply's text and the tools it called, whole or
    streamed (the SSE chunks joined)."""
    if entry["status"] >= 400 or not entry["path"].endswith("/chat/completions"):
        return ""
    text, calls = "", []
    try:
        if entry["answer"].lstrip().startswith("{"):
            msg = json.loads(entry["answer"])["choices"][0]["message"]
            text = msg.get("content") or ""
            calls = [c["function"]["name"] for c in msg.get("tool_calls") or []]
        else:
            for line in entry["answer"].splitlines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        delta = choice.get("delta", {})
                        text += delta.get("content") or ""
                        calls += [
                            c["function"]["name"]
                            for c in delta.get("tool_calls") or []
                            if c.get("function", {}).get("name")
                        ]
    except (ValueError, KeyError, IndexError) as e:
        return f"(unread: {e})"
    return f"tool calls {calls} " * bool(calls) + repr(text[:160])


def task_of(body) -> str:
    """Which of Open WebUI's requests a chat completion is: a background task or the chat."""
    if not isinstance(body, dict):
        return "-"
    text = json.dumps(body.get("messages", []))
    return next((name for name, words in TASKS.items() if words in text), "chat")


# ---------------------------------------------------------------- Open WebUI's HTTP API


def owui_env(data_dir: Path, base_url: str, key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(
        DATA_DIR=str(data_dir),
        WEBUI_SECRET_KEY=secrets.token_hex(32),
        WEBUI_AUTH="true",
        ENABLE_OLLAMA_API="false",
        OPENAI_API_BASE_URL=base_url + "/v1",
        OPENAI_API_KEY=key,
        ENABLE_FORWARD_USER_INFO_HEADERS="true",
        # offline: no model downloads, no update check, no telemetry
        OFFLINE_MODE="true",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        SCARF_NO_ANALYTICS="true",
        DO_NOT_TRACK="true",
        ANONYMIZED_TELEMETRY="false",
        # no local embedding model is loaded at start-up (an empty name loads none), and
        # files go to the model whole instead of through retrieval
        RAG_EMBEDDING_MODEL="",
        BYPASS_EMBEDDING_AND_RETRIEVAL="true",
    )
    return env


def signed(http: httpx.Client, token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def page_chat(http: httpx.Client, token: str, model: str, text: str) -> str:
    """Send `text` as Open WebUI's page sends a new chat's first message; the chat's id."""
    user_id, reply_id = str(uuid.uuid4()), str(uuid.uuid4())
    user_message = {
        "id": user_id,
        "parentId": None,
        "childrenIds": [reply_id],
        "role": "user",
        "content": text,
        "timestamp": int(time.time()),
        "models": [model],
    }
    body = {
        "stream": True,
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "params": {},
        "tool_ids": [],
        "tool_servers": [],
        "features": {"voice": False, "image_generation": False, "code_interpreter": False, "web_search": False},
        "variables": {},
        # the page's socket session: with it Open WebUI adds its built-in tools and answers
        # over the socket (nobody listens here; the reply is read back from the saved chat)
        "session_id": secrets.token_hex(10),
        "id": reply_id,
        "parent_id": None,
        "user_message": user_message,
        "background_tasks": {"title_generation": True, "tags_generation": True, "follow_up_generation": True},
    }
    r = http.post("/api/chat/completions", json=body, headers=signed(http, token))
    r.raise_for_status()
    return r.json()["chat_id"]


def wait_for_chat(http: httpx.Client, token: str, chat_id: str, proxy: Proxy, timeout: float) -> dict:
    """The saved chat once its reply is done and no request has reached radixchat for a while
    (the title, tags and follow-ups run after the reply)."""
    deadline = time.time() + timeout
    chat: dict = {}
    while time.time() < deadline:
        chat = http.get(f"/api/v1/chats/{chat_id}", headers=signed(http, token)).json()
        replies = [
            m for m in chat.get("chat", {}).get("history", {}).get("messages", {}).values() if m["role"] != "user"
        ]
        if replies and all(m.get("done") for m in replies) and time.time() - proxy.last_at() > 15:
            return chat
        time.sleep(1)
    return chat


# ---------------------------------------------------------------- the run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=Path("/tmp/openwebui-venv"), help="Open WebUI's own venv")
    ap.add_argument("--model", default="default", help="radixchat's --model (default: SmolLM2-135M where installed)")
    ap.add_argument("--max-tokens", default="96", help="radixchat's --max-tokens: Open WebUI sends none")
    ap.add_argument(
        "--lean",
        action="store_true",
        help="the settings for a small model: no title, tags or follow-ups, no built-in tools",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, both stores)")
    args = ap.parse_args()

    exe = ensure_open_webui(args.venv)
    tmp = Path(tempfile.mkdtemp(prefix="owui-check-"))
    print(f"working in {tmp}", flush=True)
    db, rc_log, ow_log = tmp / "radixchat.db", tmp / "radixchat.log", tmp / "openwebui.log"
    procs: list[subprocess.Popen] = []
    proxy = None
    try:
        password = tmp / "front.pw"
        password.write_text(secrets.token_urlsafe(16) + "\n")
        admin = [RADIXCHAT]
        subprocess.run([*admin, "users", "add", FRONT, "--db", str(db), "--password-file", str(password)], check=True)
        key = subprocess.run(
            [*admin, "keys", "create", FRONT, "--front-end", "--db", str(db)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        port = free_port()
        rc = [RADIXCHAT, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(port)]
        rc += ["--db", str(db), "--cache-dir", str(tmp / "kv"), "--max-tokens", args.max_tokens, "--no-warm-presets"]
        procs.append(start_and_wait(rc, f"http://127.0.0.1:{port}/health", rc_log, timeout=300))
        check("radixchat serves with a front-end key", bool(key))
        proxy = Proxy(f"http://127.0.0.1:{port}")

        ow_port = free_port()
        ow = [str(exe), "serve", "--host", "127.0.0.1", "--port", str(ow_port)]
        ow_url = f"http://127.0.0.1:{ow_port}"
        env = owui_env(tmp / "openwebui", proxy.url, key)
        if args.lean:
            env.update(ENABLE_TITLE_GENERATION="false", ENABLE_TAGS_GENERATION="false")
            env.update(ENABLE_FOLLOW_UP_GENERATION="false")
        procs.append(start_and_wait(ow, ow_url + "/health", ow_log, env=env, timeout=600, cwd=tmp))
        check("Open WebUI starts offline", True)
        http = httpx.Client(base_url=ow_url, timeout=600)

        users = {}
        r = http.post("/api/v1/auths/signup", json={"name": "Ada", "email": "ada@example.com", "password": "ada-pw-1"})
        if r.status_code == 200:
            users["ada"] = r.json()
            r = http.post(
                "/api/v1/auths/add",
                headers=signed(http, users["ada"]["token"]),
                json={"name": "Bob", "email": "bob@example.com", "password": "bob-pw-1", "role": "user"},
            )
        if r.status_code == 200:
            r = http.post("/api/v1/auths/signin", json={"email": "bob@example.com", "password": "bob-pw-1"})
        if r.status_code == 200:
            users["bob"] = r.json()
        roles = {name: u["role"] for name, u in users.items()}
        if not check("two Open WebUI users: an admin and a user", roles == {"ada": "admin", "bob": "user"}, str(roles)):
            print(r.status_code, r.text[:2000])
            return 1

        def models(u: dict) -> list[str]:
            return [m["id"] for m in http.get("/api/models", headers=signed(http, u["token"])).json()["data"]]

        model = next(iter(models(users["ada"])), None)
        # a connection's models are the admin's alone until made public (Admin Panel >
        # Settings > Models > the model > Visibility: Public), which the admin does here
        r = http.post(
            "/api/v1/models/model/access/update",
            headers=signed(http, users["ada"]["token"]),
            json={
                "id": model,
                "access_grants": [{"principal_type": "user", "principal_id": "*", "permission": "read"}],
            },
        )
        if args.lean:
            # Admin Panel > Settings > Models > the model > Capabilities > Builtin Tools, off
            lean = {"id": model, "name": model, "meta": {"capabilities": {"builtin_tools": False}}, "params": {}}
            r = http.post("/api/v1/models/model/update", headers=signed(http, users["ada"]["token"]), json=lean)
            check("the model's built-in tools turned off", r.status_code == 200, f"{r.status_code} {r.text[:200]}")
        listed = {name: models(u) for name, u in users.items()}
        if not check(
            "both users see radixchat's model once it is public", model in listed["bob"], f"{r.status_code} {listed}"
        ):
            return 1

        # as an API client of Open WebUI: model and messages only
        started = time.time()
        for name, u in users.items():
            r = http.post(
                "/api/chat/completions",
                headers=signed(http, u["token"]),
                json={"model": model, "messages": [{"role": "user", "content": f"Hello, I am {name}. Say hi."}]},
            )
            text = r.json().get("choices", [{}])[0].get("message", {}).get("content") if r.status_code == 200 else None
            check(
                f"{name}'s API chat completion is answered", bool(text), f"{r.status_code} {(text or r.text)[:120]!r}"
            )

        # as Open WebUI's chat page: a new chat with its background tasks and built-in tools
        for name, u in users.items():
            chat_id = page_chat(http, u["token"], model, f"What is a Python list? ({name})")
            chat = wait_for_chat(http, u["token"], chat_id, proxy, timeout=300)
            history = chat.get("chat", {}).get("history", {}).get("messages", {})
            replies = [m for m in history.values() if m["role"] == "assistant"]
            ok = bool(replies) and all(m.get("done") and not m.get("error") and m.get("content") for m in replies)
            detail = json.dumps([{k: m.get(k) for k in ("content", "error", "followUps")} for m in replies])[:300]
            check(f"{name}'s page chat is answered and saved", ok, f"title {chat.get('title')!r}, {detail}")

        # radixchat's side: the rows its writer thread stores once each request ends
        time.sleep(2)
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            rows = con.execute(
                "SELECT u.name, count(*) FROM requests r JOIN users u ON u.id = r.user "
                "WHERE r.created >= ? GROUP BY u.name",
                (started - 1,),
            ).fetchall()
        by_user = dict(rows)
        want = {f"{FRONT}/{u['id']}" for u in users.values()}
        check(
            "radixchat stored the requests as two users, openwebui/<their Open WebUI id>",
            set(by_user) == want,
            f"rows per user {by_user}, expected {sorted(want)}",
        )
        forwarded = [e for e in proxy.seen if e["method"] == "POST"]
        ids = {e["headers"].get("x-openwebui-user-id") for e in forwarded}
        check(
            "every completion Open WebUI sent named its user",
            ids == {u["id"] for u in users.values()},
            f"{len(forwarded)} POSTs, user ids {sorted(map(str, ids))}",
        )
        if args.lean:
            extra = [(task_of(e["body"]), bool(e["body"].get("tools"))) for e in forwarded]
            check("lean: only the chats were sent, without tools", set(extra) == {("chat", False)}, str(extra))
        refused = [e for e in proxy.seen if e["status"] >= 400]
        check("radixchat answered everything Open WebUI sent without a 4xx/5xx", not refused, f"{len(refused)} refused")

        print("\nwhat Open WebUI sent to radixchat (through the proxy):")
        for e in proxy.seen:
            b = e["body"] if isinstance(e["body"], dict) else {}
            tools = [t.get("function", {}).get("name") for t in b.get("tools") or []]
            extras = sorted(set(b) - {"model", "messages", "stream", "tools"})
            user = (e["headers"].get("x-openwebui-user-name") or "-").ljust(4)
            print(
                f"  {e['status']} {e['method']} {e['path']} user={user} task={task_of(b)} stream={b.get('stream')} "
                f"tools={tools} other fields={extras}"
            )
            if e["status"] >= 400:
                print(f"    request: {json.dumps(b)[:3000]}\n    answer: {e['answer']}")
            elif answer_of(e):
                print(f"    prompt {len(json.dumps(b.get('messages')))} chars; answered {answer_of(e)}")
        # everything, for a closer look (kept with --keep)
        (tmp / "sent.json").write_text(json.dumps(proxy.seen, indent=1))
        return 0 if all(ok for _, ok, _ in results) else 1
    except Exception as e:  # a step that could not run is a failed check, with both logs
        check("the run completes", False, f"{type(e).__name__}: {e}")
        for log in (rc_log, ow_log):
            if log.exists():
                print(f"--- {log} (tail)\n{log.read_text()[-4000:]}")
        return 1
    finally:
        for p in reversed(procs):
            stop_process(p)
        if proxy:
            proxy.close()
        if args.keep:
            print(f"kept {tmp}")
        else:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    sys.exit(main())
