"""How much memory a model will take before it is loaded: its weights, from its files.

`weights_bytes` reads sizes and headers only (nothing loads): a folder's safetensors files,
scaled when its 16-bit weights will run in float32 (a CPU: core.models.model casts them),
or a GGUF's tensor table (dequantized to float32 on a CPU; kept packed on a Mac's GPU). The
set of models (core.engine.models) adds each one's K/V budget and checks the sum against
`--memory-bytes` before a load; once a model has loaded, the bytes its weights really take
(ModelInfo.weights_bytes) replace the estimate.

Pure Python, no MLX: any thread.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from radixchat.core.models.catalog import resolve

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # a number's bytes, by dtype name


def weights_bytes(name: str, dtype: str = "auto") -> int:
    """The bytes the weights of the model `name` (a --model value) take once loaded in
    `dtype` ("auto": float32 except on a Mac, where they run as stored); 0 when its files
    are not here to read (a hub id not downloaded yet)."""
    local = Path(resolve(name).path).expanduser()
    per = DTYPE_BYTES.get(dtype) or (None if sys.platform == "darwin" else 4)  # None: as stored
    if local.is_file():
        from radixchat.core.models.gguf_file import GGUFError, read_header

        try:
            tensors = read_header(local).tensors
        except (GGUFError, OSError):
            return 0
        return local.stat().st_size if per is None else per * sum(math.prod(t.shape) for t in tensors)
    if not local.is_dir():
        return 0
    stored = sum(f.stat().st_size for f in local.glob("*.safetensors"))
    try:
        config = json.loads((local / "config.json").read_text())
    except (OSError, ValueError):
        return stored
    if per is None or "quantization" in config:  # packed weights stay packed
        return stored
    return stored * per // DTYPE_BYTES.get(str(config.get("torch_dtype")), per)
