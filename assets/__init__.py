"""Package data: the bundled model (`model/`), system-prompt presets and the question sets
(`prompts.json`). Found with importlib.resources, so an installed wheel has them too."""

import json
from functools import cache
from importlib.resources import files
from pathlib import Path


def path(name: str) -> Path:
    """A file or folder shipped in this package, as a filesystem path (wheels install unzipped)."""
    return Path(str(files(__name__) / name))


@cache
def prompts() -> dict:
    """prompts.json: {"system_prompts": [{"name", "text"}...], ...} (read once)."""
    return json.loads((files(__name__) / "prompts.json").read_text(encoding="utf-8"))


BUNDLED_MODEL = path("model")
