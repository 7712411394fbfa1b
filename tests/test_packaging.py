"""The package as others get it: the wheel's contents, an installed copy serving the bundled
model from outside the checkout, and the layout's import rules (no circles, core/ never
imports webui/, webui/ never imports MLX)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.procs import free_port, start_and_wait

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources git sees: a build/ folder left in the checkout by an
    earlier install could otherwise slip stale modules into the wheel."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (
            rel.split("/")[0] in ("pyproject.toml", "README.md", "LICENSE", "core", "webui", "assets")
            and (REPO / rel).is_file()
        ):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (whl,) = out.glob("radixchat-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_holds_the_code_and_the_bundled_model_but_no_tests(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in (
        "core/engine/engine.py",
        "core/cache/radix.py",
        "core/store/__init__.py",
        "core/platform/blas.py",
        "webui/api/routes.py",
        "webui/page/ui/layout.py",
        "assets/__init__.py",
        "assets/prompts.json",
        "assets/model/config.json",
        "assets/model/model.safetensors",
        "assets/model/tokenizer.json",
    ):
        assert f"radixchat/{must}" in names, must
    # exactly one top-level import package: everything else is the wheel's own metadata
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"radixchat"}, tops
    assert "radixchat/__init__.py" not in names  # a namespace package: the folders map onto it
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    # every package folder of the checkout is in the wheel (pyproject.toml lists them by hand)
    for top in ("core", "webui", "assets"):
        for init in (REPO / top).rglob("__init__.py"):
            assert f"radixchat/{init.relative_to(REPO).as_posix()}" in names, init
    meta = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("METADATA"))
    runtime = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [r for r in runtime if any(b in r for b in ("locust", "matplotlib", "pytest"))], runtime
    assert any("locust" in line and 'extra == "bench"' in line for line in meta.splitlines())


@pytest.mark.slow
def test_wheel_installs_beside_a_distribution_with_its_own_core_package(wheel, tmp_path):
    """Another distribution that ships top-level `core`, `webui` and `assets` packages neither
    breaks radixchat nor is broken by it."""
    other = tmp_path / "other"
    for top in ("core", "webui", "assets"):
        (other / top).mkdir(parents=True)
        (other / top / "__init__.py").write_text(f"WHO = 'other-{top}'\n")
    (other / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "other-core"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["core", "webui", "assets"]\n'
    )
    target = tmp_path / "site"
    for dist in (str(other), str(wheel)):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "--target",
                str(target),
                dist,
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    code = (
        "import core, webui, assets; print(core.WHO, webui.WHO, assets.WHO); "
        "from radixchat.webui.cli.main import main; from radixchat.core.store import Store; "
        "from radixchat import assets as ours; print(ours.BUNDLED_MODEL)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    first, bundled = out.stdout.splitlines()
    assert first == "other-core other-webui other-assets"
    assert bundled.startswith(str(target / "radixchat" / "assets")), bundled


@pytest.mark.slow
def test_installed_wheel_serves_the_bundled_model_from_anywhere(wheel, tmp_path):
    """Installed (not editable) and run from a folder with no checkout: the bundled model
    and the presets are found as package data."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(target)}
    log = tmp_path / "serve.log"
    code = "import sys; from radixchat.webui.cli.main import main; sys.exit(main())"
    proc = start_and_wait(
        [sys.executable, "-c", code, "serve", "--no-auth", "--port", str(port), "--db", str(tmp_path / "t.db")],
        f"http://127.0.0.1:{port}/health",
        log,
        env=env,
        timeout=180,
        cwd=elsewhere,
    )
    try:
        where = subprocess.run(
            [
                sys.executable,
                "-c",
                "import radixchat.core as core; from radixchat import assets; print(core.__file__); "
                "print(assets.BUNDLED_MODEL)",
            ],
            env=env,
            cwd=elsewhere,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert all(w.startswith(str(target)) for w in where), where
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            assert json.load(r)["data"][0]["id"]
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps(
                {
                    "model": "default",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "What does list.append do?"}],
                }
            ).encode(),
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            body = json.load(r)
        assert body["choices"][0]["message"]["content"].strip()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200  # the page, whose presets come from the package's prompts.json
    finally:
        proc.terminate()
        proc.wait(30)


def _imports(path: Path, package: str) -> set[str]:
    """Modules of this project that a file imports (at any depth: lazy imports count)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    # the checkout's folders are the installed package's radixchat.<folder>
    return {m.removeprefix("radixchat.") for m in out}


def _module_graph() -> dict[str, set[str]]:
    files = {}
    for top in ("core", "webui", "assets"):
        for f in (REPO / top).rglob("*.py"):
            rel = f.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            files[name] = f
    graph = defaultdict(set)
    for name, f in files.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        for imp in _imports(f, package):
            # a dependency on a module (not on a package's __init__ re-export of itself)
            while imp and imp not in files:
                imp = imp.rpartition(".")[0]
            if imp and imp != name and not name.startswith(imp + "."):
                graph[name].add(imp)
    return graph


def test_core_never_imports_webui_and_webui_never_imports_mlx():
    for name, deps in _module_graph().items():
        if name.startswith("core"):
            assert not [d for d in deps if d.startswith("webui")], (name, deps)
    for f in (REPO / "webui").rglob("*.py"):
        mods = _imports(f, "webui")
        assert not [m for m in mods if m.split(".")[0] in ("mlx", "mlx_lm")], f


# What webui/ may import of core/engine: only the served models by name (to serve one engine as
# a set of one); the rest it knows of an engine is core/seam. webui/cli/, the composition root
# that builds the engines, may import more.
SEAM = {"models"}


def test_webui_sees_the_engine_only_through_the_seam():
    for f in (REPO / "webui").rglob("*.py"):
        if f.parent == REPO / "webui" / "cli":
            continue
        rel = f.relative_to(REPO).with_suffix("")
        package = ".".join(rel.parts[:-1])  # a module's package, and an __init__'s own
        engine_parts = {m.split(".")[2] for m in _imports(f, package) if m.startswith("core.engine.")}
        assert engine_parts <= SEAM, (f, engine_parts - SEAM)
        tree = ast.parse(f.read_text())
        touched = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not touched & {"loaded", "tokenizer", "submit_tokens", "prefix"}, (f, touched)


# Which rooms each room may import (a room: core/<folder>, core/config.py, webui/<folder>, the
# modules at webui/'s top, assets). platform imports core/engine for one thing: `doctor` joins
# the mlx.launch group the way the engine does (core.engine.shard.lockstep) to report on it.
ROOMS = {
    "core.config": set(),
    "core.models": {"core.config", "assets"},
    "core.seam": {"core.models"},
    "core.store": {"core.config"},
    "core.cache": {"core.config", "core.models", "assets"},
    "core.engine": {"core.config", "core.models", "core.seam", "core.cache", "core.platform", "assets"},
    "core.platform": {"core.config", "core.models", "core.seam", "core.cache", "core.engine", "assets"},
    "webui": {"core.config", "core.seam", "core.engine", "core.store", "webui.api", "webui.auth", "webui.page"},
    "webui.api": {"core.config", "core.seam", "core.engine", "core.store", "webui"},
    "webui.auth": {"core.store"},
    "webui.page": {
        *("core.config", "core.seam", "core.engine", "core.store", "core.platform", "assets"),
        *("webui", "webui.api", "webui.auth"),
    },
    "webui.remote": {"core.config", "core.seam", "core.engine", "webui.api"},
    # the composition root: builds the engines and the app from every other room
    "webui.cli": {
        *("core.config", "core.seam", "core.engine", "core.store", "core.platform"),
        *("webui", "webui.api", "webui.remote"),
    },
    "assets": set(),
}


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "core" or (parts[0] == "webui" and len(parts) > 2):
        return ".".join(parts[:2])
    return parts[0]


def test_the_pages_logic_runs_without_gradio():
    """webui/page/logic/ is what the page does, without the page: it imports no Gradio (and
    nothing that does), so its tests need no browser and no Blocks."""
    graph = _module_graph()
    seen, todo = set(), [m for m in graph if m.startswith("webui.page.logic")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    for m in seen:
        f = REPO / (m.replace(".", "/") + ".py")
        if not f.exists():
            f = REPO / m.replace(".", "/") / "__init__.py"
        gradio = [i for i in _imports(f, m.rpartition(".")[0]) if i.split(".")[0] == "gradio"]
        assert not gradio, (m, gradio)


# What a folder holds: a room a newcomer can take in at once (issue 52: about 15 modules at most).
MOST_MODULES = 15


def test_no_room_is_a_crowd():
    for init in [*(REPO / "core").rglob("__init__.py"), *(REPO / "webui").rglob("__init__.py")]:
        modules = [f for f in init.parent.glob("*.py") if f.name != "__init__.py"]
        assert len(modules) <= MOST_MODULES, (init.parent, len(modules))


def test_each_room_imports_only_the_rooms_its_row_names():
    strays = sorted(
        f"{name} -> {dep}"
        for name, deps in _module_graph().items()
        for dep in deps
        if _room(dep) != _room(name) and _room(dep) not in ROOMS[_room(name)]
    )
    assert not strays, strays


def test_no_import_circles():
    graph = _module_graph()
    seen, on_path = set(), []

    def visit(n):
        if n in on_path:
            raise AssertionError("import circle: " + " -> ".join(on_path[on_path.index(n) :] + [n]))
        if n in seen:
            return
        on_path.append(n)
        for d in sorted(graph.get(n, ())):
            visit(d)
        on_path.pop()
        seen.add(n)

    for n in sorted(graph):
        visit(n)


@pytest.mark.slow
def test_serving_imports_load_no_mlx_outside_the_engine():
    """Importing the server, the page and the API pulls in no MLX: only the engine thread loads it."""
    code = (
        "import sys, radixchat.webui.server, radixchat.webui.page.ui.layout, radixchat.webui.api.routes, "
        "radixchat.webui.cli.main, radixchat.core.engine.engine, radixchat.core.store; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_tests_import_nothing_from_loadtests():
    for f in (REPO / "tests").rglob("*.py"):
        mods = _imports(f, "tests")
        assert not [m for m in mods if m.split(".")[0] == "loadtests"], f


def _harness_violations(source: str) -> list[str]:
    """What in one test file breaks the harness rules: a use of `sys.path` (tests import as
    `tests.…` from the repository root, which pytest's rootdir conftest puts on the path), or an
    import of a test module (`tests.test_x`, `test_x`, `from tests import test_x`, relative or
    through importlib), whose helpers and fixtures belong in tests/support/ or conftest.py."""

    def test_module(name: str, relative: bool = False) -> bool:
        parts = name.split(".")
        return (
            parts[0].startswith("test_")
            or (parts[0] == "tests" and len(parts) > 1 and parts[1].startswith("test_"))
            or (relative and bool(parts[0]) and parts[0].startswith("test_"))
        )

    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name):
            if node.value.id == "sys":
                found.append(f"{where}: sys.path")
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if base == "sys" and any(a.name == "path" for a in node.names):
                found.append(f"{where}: from sys import path")
            dots, relative = "." * node.level, node.level > 0
            if base and test_module(base, relative):
                found.append(f"{where}: from {dots}{base} import ...")
            else:
                within = [a.name for a in node.names if test_module(f"{base}.{a.name}" if base else a.name, relative)]
                found += [f"{where}: from {dots}{base} import {name}" for name in within]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0].value
            if called in ("import_module", "__import__") and isinstance(arg, str) and test_module(arg):
                found.append(f"{where}: {called}({arg!r})")
    return found


def test_tests_edit_no_sys_path_and_import_no_test_module():
    """The harness (servers, browsers, models, clients, shared helpers) lives in tests/support/
    and shared fixtures in tests/conftest.py: no test file edits sys.path, none imports another
    test module. The check itself is checked on what it must catch and what it must let pass."""
    caught = [
        "import sys\nsys.path.insert(0, 'tests')",
        "import sys, os\nsys.path.append(os.path.dirname(__file__))",
        "from sys import path",
        "import test_cli",
        "from test_cli import RADIXCHAT",
        "from tests.test_openai_api import Server",
        "import tests.test_page_browser",
        "from tests import test_page_routes",
        "from . import test_cli",
        "from .test_cli import RADIXCHAT",
        "import importlib\nimportlib.import_module('tests.test_cli')",
    ]
    for source in caught:
        assert _harness_violations(source), source
    allowed = [
        "import os.path\nos.path.dirname(__file__)",
        "from tests.support.server import Server",
        "import tests.support.procs",
        "from tests import support",
        "from tests.support.clients import client  # test_x in a comment",
        "path = 'sys.path'",
    ]
    for source in allowed:
        assert not _harness_violations(source), source

    files = sorted((REPO / "tests").rglob("*.py"))
    assert REPO / "tests" / "conftest.py" in files and REPO / "tests" / "support" / "server.py" in files
    bad = {str(f.relative_to(REPO)): v for f in files if (v := _harness_violations(f.read_text()))}
    assert bad == {}, bad


def test_gradio_writes_no_stub_beside_a_component_once_webui_is_imported(tmp_path):
    """Gradio's metaclass rewrites a `.pyi` beside every component class it makes (~1.1 s of
    each process's import); after webui's import it makes none (webui/gradio_import.py)."""
    import importlib.util

    import gradio  # (the suite imports webui first: tests/__init__.py)

    source = tmp_path / "box.py"
    source.write_text("import gradio\n\n\nclass Box(gradio.Textbox):\n    EVENTS = []\n")
    spec = importlib.util.spec_from_file_location("box", source)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert gradio.component_meta.create_or_modify_pyi.__module__ == "radixchat.webui.gradio_import"
    assert not source.with_suffix(".pyi").exists()
