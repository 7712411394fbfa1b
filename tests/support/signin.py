"""Signing in over real HTTP from chosen loopback addresses: the sign-in tests' clients."""

from __future__ import annotations

import time

import httpx


def from_address(url: str, last: int, **kw) -> httpx.Client:
    """A client of `url` whose connections come from 127.0.0.<last>: another address."""
    transport = httpx.HTTPTransport(local_address=f"127.0.0.{last}")
    return httpx.Client(base_url=url, transport=transport, timeout=30, **kw)


def fail_until_locked(url: str, name: str, password_of_nobody: str, addresses, at_least_s: int) -> None:
    """Fail `name`'s password, each time from the next of `addresses`, until its lockout
    is `at_least_s` long (the lockout doubles with each failure past the fifth)."""
    addresses = iter(addresses)
    while True:
        with from_address(url, next(addresses)) as c:
            r = c.post("/login", data={"username": name, "password": password_of_nobody})
        if r.status_code == 429:
            wait = int(r.headers["retry-after"])
            if wait >= at_least_s:
                return
            time.sleep(wait + 0.1)
        else:
            assert r.status_code == 400, r.text


def login(client: httpx.Client, name: str, password: str | None = None, **headers) -> httpx.Response:
    return client.post("/login", data={"username": name, "password": password or f"{name}-password"}, headers=headers)
