"""Which model a benchmark runs on: --model (a folder, a .gguf file or a short name: default,
smollm2, tiny), else the default model, or a random model with --random-dim (a llama unless
--random-arch says otherwise).

A GGUF (SmolLM2 by default) is benchmarked as a float32 mlx-lm folder written once from what
radixchat loads (dequantized): that folder is what every server in a comparison is given, so
mlx_lm.server and radixchat run the same weights in the same dtype. Shared by the bench_*
scripts so they measure the same thing the same way.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="default", help="model folder, .gguf file, or default / smollm2 / tiny (default: default)"
    )
    p.add_argument("--random-dim", type=int, default=0, help="use a random model of this width")
    p.add_argument("--random-layers", type=int, default=8)
    p.add_argument("--random-arch", default="llama", help="the random model's architecture: llama, qwen3, lfm2, gemma3")
    p.add_argument("--random-vocab", type=int, default=2048, help="the random model's vocabulary")


def resolve_model(args) -> str:
    if args.random_dim:
        from tests.support.randmodel import build_random_model

        arch, vocab = getattr(args, "random_arch", "llama"), getattr(args, "random_vocab", 2048)
        out = Path(tempfile.mkdtemp()) / f"random-{arch}-{args.random_dim}x{args.random_layers}-v{vocab}"
        return str(
            build_random_model(
                out, dim=args.random_dim, layers=args.random_layers, context=4096, vocab_size=vocab, arch=arch
            )
        )
    from radixchat.core.models import catalog

    path = Path(catalog.resolve(args.model).path)
    return str(float32_folder(path)) if path.suffix == ".gguf" else str(path)


def float32_folder(gguf: Path) -> Path:
    """A float32 mlx-lm folder of a GGUF's weights, made once next to its converted folder."""
    from radixchat.core.models.gguf import converted_folder

    folder, _ = converted_folder(gguf)
    out = folder.with_name(folder.name + "-float32")
    if (out / "config.json").is_file():
        return out
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from radixchat.core.models.model import load_model

    loaded = load_model(str(gguf), dtype="float32")
    tmp = Path(tempfile.mkdtemp(prefix=out.name + "-", dir=out.parent))
    mx.save_safetensors(
        str(tmp / "model.safetensors"), dict(tree_flatten(loaded.model.parameters())), metadata={"format": "mlx"}
    )
    config = json.loads((folder / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy2(f, tmp / f.name)
    tmp.rename(out)
    return out
