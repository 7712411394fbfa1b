"""Types as a test: mypy checks webui/, the seam and the engine (its parts, step, sampling and
sharded ranks) strictly (pyproject.toml's [tool.mypy]). The repository's folders are
`radixchat.<folder>` only once installed (setuptools' editable finder, which mypy cannot
follow), so the check runs in a folder where `radixchat` is a package of links to them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SEAM = ["radixchat.core.seam.protocol", "radixchat.core.seam.requests", "radixchat.core.seam.handle"]
# the engine's parts (its scheduling among them), over the typed base of the state they share,
# and what steps the model: the generator, the samplers, a sharded rank's lockstep and follower
PARTS = ["engine", "intake", "emit", "prefix_use", "output", "active", "textstream", "prepare", "models"]
SCHED = [
    "radixchat.core.engine.parts",
    "radixchat.core.engine.sched",
    "radixchat.core.engine.step",
    "radixchat.core.engine.sample",
    "radixchat.core.engine.shard.recorder",
    "radixchat.core.engine.shard.ops",
    "radixchat.core.engine.shard.lockstep",
    "radixchat.core.engine.shard.follower",
    *(f"radixchat.core.engine.{m}" for m in PARTS),
]


@pytest.fixture(scope="module")
def linked(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("types")
    (where / "radixchat").mkdir()
    for part in ("core", "webui", "assets"):
        (where / "radixchat" / part).symlink_to(REPO / part)
    return where


def mypy(where: Path, *targets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), *targets],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_webui_and_the_seam_type_check(linked):
    targets = [x for m in ["radixchat.webui", *SEAM, *SCHED] for x in ("-p", m)]
    out = mypy(linked, *targets)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_the_check_holds_the_engines_parts_to_their_declared_state(linked):
    """A part reading state nobody declared, or storing the wrong type in declared state, is
    refused: what the parts share is typed in one place (core/engine/parts.py)."""
    (linked / "part.py").write_text(
        "from radixchat.core.engine.parts import EngineParts\n"
        "class Part(EngineParts):\n"
        "    def turn(self) -> None:\n"
        "        self.kv_budget = 'all of it'\n"
        "        self._undeclared.clear()\n"
    )
    out = mypy(linked, "--strict", "part.py")
    assert out.returncode == 1, out.stdout
    assert "part.py:4: error: Incompatible types in assignment" in out.stdout, out.stdout
    assert 'part.py:5: error: "Part" has no attribute "_undeclared"' in out.stdout, out.stdout


@pytest.mark.slow
def test_the_check_sees_the_seams_types(linked):
    """Not Any: a caller that hands a handle a string, or an engine request a list, is refused."""
    (linked / "misuse.py").write_text(
        "from radixchat.core.seam.handle import RequestHandle\n"
        "from radixchat.core.seam.requests import owner_of\n"
        "def feed(h: RequestHandle) -> None:\n"
        "    h.push('some text')\n"
        "owner: str = owner_of(None)\n"
    )
    out = mypy(linked, "misuse.py")
    assert out.returncode == 1, out.stdout
    assert 'Argument 1 to "push" of "RequestHandle" has incompatible type "str"' in out.stdout, out.stdout
    assert "misuse.py:5: error" in out.stdout, out.stdout


def test_webui_and_the_seam_pass_without_ignores():
    """The check holds webui and the seam with nothing waved through: a `type: ignore` there
    would hide what the checker says of the code a client's request runs through."""
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for folder in ("webui", "core/seam")
        for path in sorted((REPO / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert found == [], found
