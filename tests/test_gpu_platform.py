"""What a GPU machine gets that a CPU one does not: the dtype `auto` picks, the device doctor
names, and the setup's CUDA switch. CI has no GPU; `on_gpu` is what the loader asks, so these
tests answer for it and load on the CPU (bfloat16 and float16 run there too, slowly)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from radixchat.core.models import model as model_module
from radixchat.core.models.model import load_model
from radixchat.core.platform.doctor import device_line

ROOT = Path(__file__).resolve().parent.parent


def _float_dtypes(m) -> set:
    return {v.dtype for _, v in tree_flatten(m.model.parameters()) if mx.issubdtype(v.dtype, mx.floating)}


def test_auto_is_float32_on_a_cpu(tiny_model_dir):
    m = load_model(str(tiny_model_dir))
    assert m.dtype == "float32" and _float_dtypes(m) == {mx.float32}


def test_auto_on_a_gpu_runs_float32_weights_in_bfloat16(tiny_model_dir, monkeypatch):
    """float32 weights on a GPU would double what every step reads (the H200 measured with
    --dtype auto ran float32 until this)."""
    monkeypatch.setattr(model_module, "on_gpu", lambda: True)
    m = load_model(str(tiny_model_dir))
    assert m.dtype == "bfloat16" and _float_dtypes(m) == {mx.bfloat16}
    assert m.runs_as == "bfloat16"
    assert m.weights_bytes == load_model(str(tiny_model_dir), "float32").weights_bytes // 2


def test_a_half_checkpoint_keeps_its_own_dtype_on_a_gpu(tiny_model_dir, tmp_path, monkeypatch):
    half = tmp_path / "half"
    half.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name != "model.safetensors":
            (half / f.name).write_bytes(f.read_bytes())
    weights = mx.load(str(tiny_model_dir / "model.safetensors"))
    mx.save_safetensors(str(half / "model.safetensors"), {k: v.astype(mx.float16) for k, v in weights.items()})
    monkeypatch.setattr(model_module, "on_gpu", lambda: True)
    assert _float_dtypes(load_model(str(half))) == {mx.float16}
    # a dtype asked for by name is what it says, GPU or not
    assert _float_dtypes(load_model(str(half), "float32")) == {mx.float32}


def test_doctor_names_the_device_and_its_memory():
    # what mlx-cuda-13's device_info gave on the H200 machine (keys of mlx/backend/gpu/available.h)
    gpu = {"device_name": "NVIDIA H200", "architecture": "sm_90", "total_memory": 150_121_971_712}
    assert device_line("Device(gpu, 0)", gpu) == "Device(gpu, 0) (NVIDIA H200, 140 GiB)"
    assert device_line("Device(gpu, 0)", {"architecture": "applegpu_g15s", "memory_size": 2**35}) == (
        "Device(gpu, 0) (applegpu_g15s, 32 GiB)"
    )
    assert device_line("Device(cpu, 0)", {}) == "Device(cpu, 0)"
    # and this machine's, through MLX itself
    here = device_line(str(mx.default_device()), mx.device_info())
    assert here.startswith(str(mx.default_device()) + " (")


@pytest.mark.slow
def test_setup_refuses_a_switch_it_does_not_know():
    """`.ci/setup` takes --test and --cuda in any order; anything else is a usage line, not a
    half-done setup."""
    out = subprocess.run(["sh", str(ROOT / ".ci/setup"), "--gpu"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "usage: sh .ci/setup [--test] [--cuda]" in out.stderr
    assert not out.stdout  # it stopped before installing anything
