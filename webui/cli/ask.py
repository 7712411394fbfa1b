"""`radixchat ask` against a server already running on this machine.

Loading a model for one question took 17.6 s where a server on the same port had it loaded
already. `running_server` looks for one (its /health at the settings' port on loopback, half
a second at most); `ask_server` streams the question through its chat completions API and
prints the reply and the same timing line as a local `ask`. A server that wants a key gets
`--api-key` (or RADIXCHAT_API_KEY); without one the user is told how to give one or to load
the model here (`--local`). What a local `ask` does is webui/cli/main.py's. Runs in the command's
main thread; no MLX.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx

from radixchat.core.config import Settings

PROBE_S = 0.5


def running_server(settings: Settings) -> str | None:
    """The base URL of a radixchat server answering on this machine at the settings' port, or None."""
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    url = f"http://{'[' + host + ']' if ':' in host else host}:{settings.port}"
    try:
        r = httpx.get(url + "/health", timeout=PROBE_S)
        body = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    return url if isinstance(body, dict) and "engine_alive" in body and "queue_depth" in body else None


def ask_server(url: str, key: str | None, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]) -> None:
    """Stream the reply to stdout, then the timing line to stderr; exit with a message on a refusal."""
    body = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    body |= {k: v for k, v in sampling.items() if v is not None}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    t0, first, finish = time.perf_counter(), None, None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=None) as r:
        if r.status_code != 200:
            r.read()
            sys.exit(_refusal(url, r, key))
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                print()
                sys.exit(f"radixchat: {chunk['error'].get('message')}")
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content") or ""
                if text:
                    first = first or time.perf_counter()
                    sys.stdout.write(text)
                    sys.stdout.flush()
                finish = choice.get("finish_reason") or finish
    print()
    total = time.perf_counter() - t0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    print(
        f"[{finish}] prompt {usage.get('prompt_tokens', 0)} tok (cached {cached}), generated "
        f"{usage.get('completion_tokens', 0)} tok, first token {((first or t0) - t0) * 1e3:.0f} ms, "
        f"total {total * 1e3:.0f} ms (asked the server at {url})",
        file=sys.stderr,
    )


def _refusal(url: str, r: httpx.Response, key: str | None) -> str:
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {r.status_code}"
    if r.status_code == 401 and not key:
        return (
            f"radixchat: a server is running at {url} and wants an API key: pass --api-key KEY "
            "(or set RADIXCHAT_API_KEY), or --local to load the model here"
        )
    return f"radixchat: {url} refused the question: {message}"
