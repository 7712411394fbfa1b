"""Several served models with no model in any of them: the real `ModelSet` (core.engine.models)
over fake engines (tests/support/fake_engine.py), for the page's tests of which model a chat
chats with. Each fake answers "a reply from <its id>"; a model named in `fail` cannot load
(the 503 a model without memory, or without its files, gets)."""

from __future__ import annotations

from pathlib import Path

from radixchat.core.config import Settings
from radixchat.core.engine.models import ModelSet
from radixchat.core.models.catalog import Card
from radixchat.core.seam.protocol import ModelInfo
from tests.support.fake_engine import FakeEngine


def fake_models(
    *folders: Path, cards: dict[str, Card] | None = None, fail: set[str] = frozenset()
) -> tuple[ModelSet, dict[str, FakeEngine]]:
    """A started ModelSet serving `folders` (the first loaded now, the others on first use) and
    the fakes made so far, by model id (each folder's name: tests/support/randmodel.py's)."""
    made: dict[str, FakeEngine] = {}

    def make(settings: Settings, owners) -> FakeEngine:
        model_id = Path(settings.model).name
        if model_id in fail:
            raise OSError("no memory for it")
        info = ModelInfo(
            model_id,
            num_params=1000,
            dtype="float32",
            context_length=512,
            vocab_size=256,
            card=(cards or {}).get(model_id),
        )
        made[model_id] = FakeEngine(f"a reply from {model_id}", info=info)
        return made[model_id]

    first, *more = folders
    settings = Settings(model=str(first), extra_models=[str(f) for f in more], model_idle_s=0)
    return ModelSet.of(settings, make).start(), made
