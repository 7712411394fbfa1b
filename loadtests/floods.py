"""Mallory's floods for loadtests/bench_fairness.py: what each kind of flood sends, sized
from what the benchmark learned of the server, and the child process that keeps it going.

A kind is a `Flood`: one JSON body with a placeholder (TAG) that each request replaces with
its own number (at the start of the user's message, and as a schema's title), so no two of
mallory's prompts share more than the chat template's first tokens in the prefix cache and
no two schemas are the same text; how many workers send it, each sending its next request
as soon as the last one ends; whether it streams. Kinds (`KINDS` is the default set):

  long             prompts of ~1,590 tokens (calibrated against the server's own count),
                   max_tokens 20
  bodies           ~1 MB of message content (far beyond any context: refused, 400)
  bodies_keys      the same, mallory's workers spread over as many API keys as a user may
                   hold (core.store.accounts.MAX_LIVE_KEYS): refusals counted per key alone
                   let her 20 times the refusals
  schemas          a response_format json_schema of ~138 KB (over --max-schema-bytes: 400)
  regex            a json_schema just under --max-schema-bytes whose string fields carry
                   heavy `pattern` regular expressions, max_tokens 64
  long_max_tokens  max_tokens of the model's context minus the prompt, ignore_eos: a few
                   such requests reserve the whole K/V room where the server reserves
                   the worst case
  n16              n=16, max_tokens --flood-max-tokens, ignore_eos (each choice counts
                   against the user's limit)
  short            the earlier benchmark's flood: short prompts, --flood-max-tokens
                   tokens, not streamed (not in the default set)
  one_token        short prompts, max_tokens 1, streamed: a request arriving at every step
                   (not in the default set, nor are the two below)
  extras           short prompts whose rows cost more than plain ones: 4 stop strings of
                   250 characters, top-20 logprobs, a 300-entry logit_bias and both
                   penalties, --flood-max-tokens tokens, ignore_eos
  count_tokens     /v1/messages/count_tokens with ~100,000 characters of content: templated
                   and tokenized, never generated

The child (`run_flood`, started with multiprocessing's spawn) runs the workers in one event
loop, so the flood's client work never holds the GIL of the process that times alice. A
worker refused with 429 waits the server's Retry-After (jittered); one refused with another
4xx sends again after --refused-wait (0: at once, as an attacker would). What comes back:
the outcomes by status and error code, every token's arrival time (a streamed chunk's
content is a token step; a whole reply counts its completion_tokens at its end), and per
stream its first token and its longest gap between two tokens (a stream still running at
the stop counts the time since its last token as a gap). Traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from loadtests.bench_prepare import body_of, schema_of
from radixchat.core.store.accounts import MAX_LIVE_KEYS

KINDS = ("long", "bodies", "schemas", "regex", "long_max_tokens", "n16")
MORE = ("short", "bodies_keys", "one_token", "extras", "count_tokens")
COUNT_CHARS = 100_000
TAG = "@@N@@"
LONG_PROMPT_TOKENS = 1590
LONG_MAX_TOKENS = 20
REGEX_MAX_TOKENS = 64
BIG_SCHEMA_BYTES = 138_000
BODY_CHARS = 1_000_000


@dataclass(frozen=True)
class Server:
    """What the benchmark learned of the server it started, to size the floods by."""

    limit: int  # --max-user-requests
    context: int  # the model's context, in tokens
    schema_limit: int  # --max-schema-bytes
    body_limit: int  # the largest request body
    short_prompt: int  # tokens of a short question's prompt (chat template included)
    long_chars: int  # characters of text that make a ~LONG_PROMPT_TOKENS prompt
    model: str = "default"  # the model the floods name (bench_fairness --flood-model: another one)


@dataclass(frozen=True)
class Flood:
    kind: str
    workers: int  # requests mallory tries to keep in flight
    body: bytes  # the JSON body, TAG where each request's number goes
    stream: bool
    target: int  # engine requests of mallory's to wait for before alice is timed
    note: str  # how this kind is sized, for the report
    keys: int = 1  # how many of mallory's API keys the workers take turns with
    end_user: str = ""  # sent as X-OpenWebUI-User-Id (the keys are then a front end's: Open WebUI's)
    path: str = "/v1/chat/completions"  # or /v1/messages (`over_messages`)


def heavy_pattern(i: int) -> str:
    """A regular expression that is slow to match token by token: a counted repetition of
    overlapping alternatives (the lexer follows every way of reading the text so far);
    `i` varies the counts so that no two fields share one. Heavier ones (an outer count of
    20 and more) hit llguidance's limit of expressions within a few tokens and end the
    request instead."""
    return rf"^(?:[a-z]{{1,{7 + i % 5}}}|[a-z0-9]{{2,{9 + i % 7}}}|[a-f0-9]{{3,{12 + i % 3}}}){{1,{12 + i % 5}}}$"


def regex_schema(size: int) -> dict:
    """An object schema of string fields with heavy patterns, all required, just under
    `size` bytes as the server measures it (json.dumps), TAG as its title."""
    props: dict = {}

    def whole() -> dict:
        return {"title": TAG, "type": "object", "properties": props, "required": list(props)}

    for i in itertools.count():
        props[f"field_{i}"] = {"type": "string", "pattern": heavy_pattern(i)}
        if len(json.dumps(whole())) >= size:
            del props[f"field_{i}"]
            return whole()
    raise AssertionError


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": f"[{TAG}] {content}"}]


def plan(kind: str, server: Server, question: str, flood: int, flood_max_tokens: int) -> Flood:
    """What `kind` sends to `server`: mallory wants `flood` requests in flight (at most her
    limit where refusals are expected anyway), `question` is a short user message."""
    limit = server.limit
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    base = {"model": server.model, "temperature": 0}
    if kind == "long":
        body = {**base, **stream, "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True}
        body["messages"] = _user(body_of(server.long_chars))
        note = f"~{LONG_PROMPT_TOKENS}-token prompts ({server.long_chars:,} characters), max_tokens {LONG_MAX_TOKENS}"
        return _flood(kind, flood, body, True, min(flood, limit), note)
    if kind == "bodies":
        body = {**base, **stream, "max_tokens": LONG_MAX_TOKENS, "messages": _user(body_of(BODY_CHARS))}
        data = json.dumps(body).encode()
        note = f"{len(data):,}-byte bodies (the server takes {server.body_limit:,}), {BODY_CHARS:,} characters of text"
        return _flood(kind, min(flood, limit), body, True, 0, note)
    if kind == "bodies_keys":
        body = {**base, **stream, "max_tokens": LONG_MAX_TOKENS, "messages": _user(body_of(BODY_CHARS))}
        note = f"as bodies, over {MAX_LIVE_KEYS} API keys of mallory's"
        return Flood(kind, min(flood, limit), json.dumps(body).encode(), True, 0, note, keys=MAX_LIVE_KEYS)
    if kind == "schemas":
        schema = {"title": TAG, **schema_of(BIG_SCHEMA_BYTES)}
        body = {**base, **stream, "max_tokens": LONG_MAX_TOKENS, "messages": _user(question)}
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "flood", "schema": schema}}
        note = f"{len(json.dumps(schema)):,}-byte json_schema (--max-schema-bytes {server.schema_limit:,})"
        return _flood(kind, min(flood, limit), body, True, 0, note)
    if kind == "regex":
        schema = regex_schema(server.schema_limit - 64)  # the title's number is longer than TAG
        body = {**base, **stream, "max_tokens": REGEX_MAX_TOKENS, "messages": _user(question)}
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "flood", "schema": schema}}
        note = (
            f"{len(json.dumps(schema)):,}-byte json_schema of {len(schema['properties'])} pattern fields "
            f"(--max-schema-bytes {server.schema_limit:,}), max_tokens {REGEX_MAX_TOKENS}"
        )
        return _flood(kind, flood, body, True, min(flood, limit), note)
    if kind == "long_max_tokens":
        max_tokens = server.context - server.short_prompt - 8  # the tag's digits: a few tokens more
        body = {**base, **stream, "max_tokens": max_tokens, "ignore_eos": True, "messages": _user(question)}
        note = f"max_tokens {max_tokens:,} (context {server.context:,} minus the prompt), ignore_eos"
        return _flood(kind, flood, body, True, min(flood, limit), note)
    if kind == "n16":
        body = {**base, **stream, "n": 16, "temperature": 1.0, "max_tokens": flood_max_tokens, "ignore_eos": True}
        body["messages"] = _user(question)
        note = f"n=16, max_tokens {flood_max_tokens}, ignore_eos (16 of her {limit} requests each)"
        return _flood(kind, flood, body, True, min(flood * 16, limit // 16 * 16), note)
    if kind == "short":
        body = {**base, "max_tokens": flood_max_tokens, "ignore_eos": True, "messages": _user(question)}
        note = f"short prompts, max_tokens {flood_max_tokens}, ignore_eos, not streamed"
        return _flood(kind, flood, body, False, min(flood, limit), note)
    if kind == "one_token":
        body = {**base, **stream, "max_tokens": 1, "messages": _user(question)}
        return _flood(kind, flood, body, True, 0, "short prompts, max_tokens 1, streamed")
    if kind == "extras":
        body = {**base, **stream, "max_tokens": flood_max_tokens, "ignore_eos": True, "messages": _user(question)}
        body |= {"stop": [f"{k}" * 250 for k in "wxyz"], "logprobs": True, "top_logprobs": 20}
        body |= {"logit_bias": {str(t): 0.5 for t in range(300)}, "frequency_penalty": 0.5, "presence_penalty": 0.5}
        note = (
            f"max_tokens {flood_max_tokens}, ignore_eos, 4 stop strings of 250 characters, top-20 logprobs, "
            "a 300-entry logit_bias, frequency and presence penalties"
        )
        return _flood(kind, flood, body, True, min(flood, limit), note)
    if kind == "count_tokens":
        body = {"model": server.model, "messages": _user(body_of(COUNT_CHARS))}
        note = f"/v1/messages/count_tokens of {COUNT_CHARS:,} characters"
        return Flood(
            kind, min(flood, limit), json.dumps(body).encode(), False, 0, note, path="/v1/messages/count_tokens"
        )
    raise ValueError(f"unknown kind of flood: {kind}")


def _flood(kind: str, workers: int, body: dict, stream: bool, target: int, note: str) -> Flood:
    return Flood(kind, workers, json.dumps(body).encode(), stream, target, note)


def over_messages(flood: Flood) -> Flood:
    """The same flood through Anthropic's Messages API: the body in its shape (a json_schema
    as `output_config.format`; no `ignore_eos`, which Messages lacks: replies may end sooner);
    n16 has no Messages form."""
    body = json.loads(flood.body)
    if "n" in body:
        raise ValueError(f"the {flood.kind} flood has no Messages form (n is OpenAI's)")
    out = {k: body[k] for k in ("model", "max_tokens", "messages", "stream", "temperature") if k in body}
    fmt = (body.get("response_format") or {}).get("json_schema")
    if fmt:
        out["output_config"] = {"format": {"type": "json_schema", "schema": fmt["schema"]}}
    return dataclasses.replace(flood, body=json.dumps(out).encode(), path="/v1/messages")


# ---- the child process ---------------------------------------------------------------------


def run_flood(
    flood: Flood, url: str, keys: list[str], waits: tuple, limit_s: float, seed: int, stop, shared, results
) -> None:
    """Child process: keep `flood` going until `stop` is set (or `limit_s` passes), then put
    mallory's figures on `results`; worker w sends with `keys[w % flood.keys]`. `waits` is (seconds after a 429, None for the server's
    Retry-After; seconds after another 4xx); `shared` is (requests sent so far, a shared int
    this counts; when alice's timing began, a shared wall-clock time the parent sets: a
    stream's stalls from then on are also kept apart, as `timed_gap`)."""
    results.put(asyncio.run(_run(flood, url, keys, waits, limit_s, seed, stop, shared)))


async def _run(flood: Flood, url, keys, waits, limit_s, seed, stop, shared) -> dict:
    sent, timed = shared
    retry_wait, refused_wait = waits
    outcomes: Counter = Counter()
    tokens: list[tuple[float, int]] = []  # (arrival, tokens) for every token step
    streams: list[dict] = []  # per accepted streamed request: start, first, last, gap, end
    numbers = itertools.count()
    workers = max(1, flood.workers)
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    headers = {"Content-Type": "application/json"}
    t_start = time.time()

    async def one(http: httpx.AsyncClient, body: bytes, key: str) -> tuple[int, str, float]:
        """Send one request; (status, error code or "", seconds to wait: Retry-After)."""
        auth = {"Authorization": f"Bearer {key}"}
        if flood.end_user:
            auth["X-OpenWebUI-User-Id"] = flood.end_user
        async with http.stream("POST", flood.path, content=body, headers=auth) as r:
            if r.status_code != 200:
                raw = await r.aread()
                try:
                    code = (json.loads(raw).get("error") or {}).get("code") or ""
                except (ValueError, AttributeError):
                    code = ""
                return r.status_code, code, float(r.headers.get("retry-after") or 1)
            outcomes["accepted"] += 1  # at its headers: a stream cut at the stop was accepted too
            if not flood.stream:
                usage = json.loads(await r.aread()).get("usage") or {}
                tokens.append((time.time(), usage.get("completion_tokens", usage.get("output_tokens", 0))))
                return 200, "", 0.0
            s = {"start": time.time(), "first": None, "last": None, "gap": 0.0, "timed_gap": 0.0, "end": None}
            streams.append(s)
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:  # (an error event of either API)
                    s["end"] = "failed"
                    continue
                k = sum(1 for ch in chunk.get("choices") or [] if (ch.get("delta") or {}).get("content"))
                k += chunk.get("type") == "content_block_delta" and bool((chunk.get("delta") or {}).get("text"))
                if k:
                    now = time.time()
                    tokens.append((now, k))
                    if s["first"] is None:
                        s["first"] = now
                    else:
                        s["gap"] = max(s["gap"], now - s["last"])
                        if 0 < timed.value <= s["last"]:
                            s["timed_gap"] = max(s["timed_gap"], now - s["last"])
                    s["last"] = now
            s["end"] = s["end"] or "done"
            return 200, "", 0.0

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=limit_s, limits=limits) as http:

        async def worker(w: int) -> None:
            rng = random.Random(seed * 1000 + w)
            while not stop.is_set():
                body = flood.body.replace(TAG.encode(), f"{flood.kind} {next(numbers)}".encode())
                with sent.get_lock():
                    sent.value += 1
                try:
                    status, code, after = await one(http, body, keys[w % min(flood.keys, len(keys))])
                except httpx.HTTPError as e:
                    outcomes[f"error {type(e).__name__}"] += 1
                    await asyncio.sleep(0.5)
                    continue
                if status != 200:
                    outcomes[f"{status} {code}".strip()] += 1
                if status == 429:  # jittered, so the refused don't all come back at once
                    wait = retry_wait if retry_wait is not None else after
                    await asyncio.sleep(wait * rng.uniform(0.5, 1.5))
                elif 400 <= status < 500:
                    await asyncio.sleep(refused_wait * rng.uniform(0.5, 1.5))
                elif status != 200:
                    await asyncio.sleep(0.5)

        tasks = [asyncio.create_task(worker(w)) for w in range(workers)]
        end = time.time() + limit_s
        while not stop.is_set() and time.time() < end:
            await asyncio.sleep(0.05)
        t_stop = time.time()
        # cancelling closes their connections, and the server cancels what they asked for
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for s in streams:
        if s["end"] is None:
            s["end"] = "cut"
            if s["last"] is not None:  # a stall that lasts until the stop is a stall too
                s["gap"] = max(s["gap"], t_stop - s["last"])
                if 0 < timed.value <= s["last"]:
                    s["timed_gap"] = max(s["timed_gap"], t_stop - s["last"])
    return {
        "outcomes": dict(outcomes),
        "tokens": tokens,
        "streams": streams,
        "t_start": t_start,
        "t_stop": t_stop,
        "sent": sent.value,
    }
