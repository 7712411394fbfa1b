"""Chromium through Playwright for the page's browser tests: Debian's Chromium and its flags
(never `playwright install`, see DESIGN.md), the browser for a fixture to `yield from`, the two
viewport sizes the tests use, browser contexts that note every request to anywhere but the
server, and numbered screenshots under test-output/."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
SHOTS = OUTPUT / "page"
WIDE, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}

LOCAL = ("data:",)
# what Chromium reports when the page's policy blocks something (there should be nothing to block)
VIOLATIONS = """document.addEventListener('securitypolicyviolation', e =>
  (window.__csp = window.__csp || []).push(e.violatedDirective + ' ' + e.blockedURI));"""


def chromium():
    """Debian's Chromium through Playwright, for a fixture to `yield from`."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Shots:
    """Numbered screenshots in a folder of test-output/ that each run starts empty."""

    def __init__(self, folder: Path = SHOTS):
        self.folder = folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.n = 0
        print(f"\nscreenshots: {folder}")

    def __call__(self, page, name: str) -> None:
        self.n += 1
        page.screenshot(path=str(self.folder / f"{self.n:02d}-{name}.png"))


def alice_and_bob(browser, server, outside: list[str]) -> dict:
    """alice's page at 1280 px and bob's at 390 px, each in a browser context of its own;
    every request to anywhere but the server is noted in `outside`."""
    pages = {}
    for name, size in (("alice", WIDE), ("bob", PHONE)):
        ctx = browser.new_context(viewport=size)
        ctx.on("request", lambda r: r.url.startswith((server.url, "data:", "blob:")) or outside.append(r.url))
        pages[name] = ctx.new_page()
    return pages


def context(browser, server, outside: list[str]):
    """A browser context that notes every request to anywhere but the server (and, in
    `window.__csp`, whatever the page's content policy blocked)."""
    ctx = browser.new_context(viewport=WIDE)
    ctx.on("request", lambda r: r.url.startswith((server.url, *LOCAL)) or outside.append(r.url))
    ctx.add_init_script(VIOLATIONS)
    return ctx
