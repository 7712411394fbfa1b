"""Which model a benchmark runs on: --model, else the bundled one, else a random llama.

Shared by the bench_* scripts so they measure the same thing the same way.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from assets import BUNDLED_MODEL


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (default: bundled, else random)")
    p.add_argument("--random-dim", type=int, default=0, help="use a random model of this width")
    p.add_argument("--random-layers", type=int, default=8)


def resolve_model(args) -> str:
    if args.model:
        return args.model
    if not args.random_dim and (BUNDLED_MODEL / "config.json").exists():
        return str(BUNDLED_MODEL)
    from tests.support.randmodel import build_random_model

    dim = args.random_dim or 512
    out = Path(tempfile.mkdtemp()) / f"random-{dim}x{args.random_layers}"
    return str(build_random_model(out, dim=dim, layers=args.random_layers, context=4096,
                                  vocab_size=2048))
