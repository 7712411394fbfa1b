"""Shared fixtures: tiny random models on disk, an engine serving one, a fresh store, real
servers (one whose API wants keys; the model the page tests' servers run), Chromium, and a
listener that records what a page fetches from elsewhere. The harness they use is tests/support/."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from tests.support.cheap import cheap_scrypt
from tests.support.page import PAGE_MODEL_CONTEXT
from tests.support.procs import scaled
from tests.support.randmodel import build_random_model

pytest_plugins = ["pytester"]  # tests/test_harness.py runs the suite's own hooks in a pytest of its own

_fast_test: list[str] = []  # the test being set up or run, while it is one not marked slow
_popen_inits: list = []  # Popen.__init__ as it was before this conftest's run (a pytester run nests one)


def pytest_configure(config):
    # A library's one-time cache, made by a process it starts on its first import: matplotlib's
    # font list runs fc-list, and gradio imports matplotlib while answering a page's event. Made
    # here, before the guard below: inside the first fast test to answer one, on a machine
    # without the cache, the guard failed that test from gradio's worker thread, and the event hung.
    with contextlib.suppress(ImportError):
        import matplotlib.font_manager  # noqa: F401
    inner = subprocess.Popen.__init__
    _popen_inits.append(inner)

    def tiered(self, *args, **kwargs):
        if _fast_test:
            what = args[0] if args else kwargs.get("args")
            raise pytest.fail.Exception(
                f"{_fast_test[0]} starts a process ({what!r}) and is not marked slow: mark it "
                "(`@pytest.mark.slow`, or `pytestmark = pytest.mark.slow` for its module)",
                pytrace=False,
            )
        inner(self, *args, **kwargs)

    subprocess.Popen.__init__ = tiered


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_inits.pop()


@contextlib.contextmanager
def _tiered(item):
    fast = item.get_closest_marker("slow") is None
    if fast:
        _fast_test.append(item.nodeid)
    try:
        yield
    finally:
        _fast_test.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """The tiers cannot drift: a test not marked slow that starts a process (a server, a
    browser, mlx.launch, the CLI), in its body or in a fixture it is the first to use, fails
    and says so, so `pytest -m "not slow"` (the fast tier) starts none."""
    with _tiered(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _tiered(item):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """Each test's timeout (pyproject's, or its own mark's) stretched by the machine's load as
    the test starts, as the harness's waits are (tests/support/procs.py `scaled`): a loaded
    machine is slow, not broken. pytest-timeout's own timer does the rest."""
    import pytest_timeout

    return pytest_timeout.pytest_timeout_set_timer(item, settings._replace(timeout=scaled(settings.timeout)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("tiny") / "tiny-random")


@pytest.fixture(scope="session")
def tiny_wide_dir(tmp_path_factory) -> Path:
    """Heads of 32 numbers (the tiny model's are 16): what --kv-bits' formats need at least."""
    return build_random_model(tmp_path_factory.mktemp("wide") / "tiny-wide", dim=128)


@pytest.fixture(scope="session")
def tiny_wider_dir(tmp_path_factory) -> Path:
    """Heads of 64 numbers: what --kv-group-size 64 needs."""
    return build_random_model(tmp_path_factory.mktemp("wider") / "tiny-wider", dim=256)


@pytest.fixture(scope="module")
def tiny_wide_sliding_dir(tmp_path_factory) -> Path:
    """gemma3-style with heads of 32 numbers."""
    return build_random_model(
        tmp_path_factory.mktemp("wsliding") / "tiny-wide-sliding", dim=128, layers=4, arch="gemma3"
    )


@pytest.fixture(scope="session")
def engine(tiny_model_dir):
    from radixchat.core.config import Settings
    from radixchat.core.engine.engine import Engine

    eng = Engine(
        Settings(model=str(tiny_model_dir), max_batch=8, max_prefill_batch=4, max_tokens=24, max_queue=64)
    ).start(timeout=120)
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def tiny_hybrid_dir(tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("hybrid") / "tiny-hybrid", layers=4, arch="lfm2")


@pytest.fixture(scope="module")
def tiny_sliding_dir(tmp_path_factory) -> Path:
    """gemma3-style: rotating sliding-window layers between global KVCache layers."""
    return build_random_model(tmp_path_factory.mktemp("sliding") / "tiny-sliding", layers=4, arch="gemma3")


@pytest.fixture
def store(tmp_path):
    """A fresh SQLite store in tmp_path with a cheap password hash."""
    from radixchat.core.store import Store

    s = Store(tmp_path / "test.db", scrypt=cheap_scrypt())
    yield s
    s.close()


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, tmp_path_factory):
    """(server, alice's key, a revoked key, the db): a real server whose API wants keys."""
    from tests.support.server import keyed_server

    yield from keyed_server(tiny_model_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def page_model(tmp_path_factory) -> Path:
    # slower than the tiny model, so that a reply streams for a moment and can be stopped; its
    # context room for a reply that is still being written when a slow browser presses Stop
    path = tmp_path_factory.mktemp("page") / "page-model"
    return build_random_model(path, dim=128, layers=4, context=PAGE_MODEL_CONTEXT)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright, for the page's browser tests."""
    from tests.support.browser import chromium

    yield from chromium()


@pytest.fixture(scope="module")
def listener():
    """An HTTP server on another loopback port that records every request it gets."""
    from tests.support.server import Listener

    lis = Listener()
    yield lis
    lis.close()
