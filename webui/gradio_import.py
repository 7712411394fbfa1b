"""Gradio imported without rewriting its own type stubs.

Gradio's component metaclass (`gradio.component_meta`) parses the source of every component
class it defines and rewrites the `.pyi` stub beside it if it differs: a help for gradio's own
developers, run on every import. It costs each process ~1.1 s of a ~2.4 s `import gradio` on
this project's 2-core machine (every server start, every test worker, every server a test
starts), and it writes into the installed package, which a read-only install refuses. `install`
puts a finder first on `sys.meta_path` that, when `gradio.component_meta` is loaded, replaces
that one function with one that does nothing; the stubs gradio's wheel ships stay as they are.
Gradio's behaviour is otherwise untouched, and if a later gradio renames the function the
finder changes nothing. Imported by `radixchat.webui` (its `__init__`) before anything in
webui imports gradio; runs in whichever thread first imports webui. No MLX.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

TARGET = "gradio.component_meta"


def _keep_stubs(*_args: Any, **_kwargs: Any) -> None:
    """In place of gradio's `create_or_modify_pyi`."""


class _Patching(importlib.abc.Loader):
    """Gradio's own loader of that module, which then swaps the one function."""

    def __init__(self, inner: importlib.abc.Loader):
        self._inner = inner

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        if hasattr(module, "create_or_modify_pyi"):  # (read when a component class is made)
            vars(module)["create_or_modify_pyi"] = _keep_stubs

    def __getattr__(self, name: str) -> Any:  # get_source and the rest, for tracebacks
        return getattr(self._inner, name)


class _KeepStubs(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once: the module is found as it would be without this
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Patching(spec.loader)
        return spec


def install() -> None:
    """Before gradio's first import in this process; nothing if it is already imported."""
    if TARGET not in sys.modules and not any(isinstance(f, _KeepStubs) for f in sys.meta_path):
        sys.meta_path.insert(0, _KeepStubs())
