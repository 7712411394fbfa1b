"""Which models a server serves, and how: from `--model` (again for each) or a `--models` file.

A models file is TOML, one `[[model]]` table per model, the first the default:

    [[model]]
    path = "default"            # what --model takes: a folder, a .gguf file, a hub id, a short name
    id = "chat"                 # the id it is served under (default: its card's or folder's name)
    aliases = ["assistant"]     # more names a request may give it
    pinned = true               # never unloaded (the first model always is)
    context_length = 4096       # the model's context, shorter than its config's
    kv_bits = 8                 # K/V precision (--kv-bits): 16, 8 or 4
    kv_group_size = 64          # numbers per scale at 8 bits (--kv-group-size): 32, 64 or 128
    kv_batch = "codes"          # what its decoding batch holds at 8 or 4 (--kv-batch)
    temperature = 0.3           # sampling for requests that leave it out (else its card's);
    top_p = 0.9                 # presence_, frequency_ and repetition_penalty too

`specs` reads either form into `ModelSpec`s; a bad file is a ValueError naming the file, the
table and the key. Pure Python (tomllib, pydantic), no MLX: the CLI's thread at start-up.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixchat.core.config import SAMPLING_DEFAULTS, KVBatch, Settings, kv_group_refusal


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what --model would take
    model_id: str | None = None  # None: the id its files give it (core.models.catalog.served_id)
    aliases: tuple[str, ...] = ()
    pinned: bool = False
    overrides: dict = field(default_factory=dict)  # Settings of this model's engine


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1)
    id: str | None = Field(None, min_length=1)
    aliases: list[str] = Field(default_factory=list)
    pinned: bool = False
    context_length: int | None = Field(None, ge=16)
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    kv_bits: Literal[16, 8, 4] | None = None
    kv_group_size: int | None = None
    kv_batch: KVBatch | None = None

    def spec(self) -> ModelSpec:
        overrides: dict = {}
        if self.context_length is not None:
            overrides["context_length"] = self.context_length
        if self.kv_bits is not None:
            overrides["kv_bits"] = self.kv_bits
        if self.kv_group_size is not None:
            overrides["kv_group_size"] = self.kv_group_size
        if self.kv_batch is not None:
            overrides["kv_batch"] = self.kv_batch
        sampling = {k: v for k in SAMPLING_DEFAULTS if (v := getattr(self, k)) is not None}
        if sampling:
            overrides["sampling_defaults"] = sampling
        if self.id is not None:
            overrides["served_model_name"] = self.id
        return ModelSpec(self.path, self.id, tuple(self.aliases), self.pinned, overrides)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: list[_Entry] = Field(min_length=1)


def specs(settings: Settings) -> list[ModelSpec]:
    """The models `settings` asks for, the first first: its --models file's, else --model's
    (and the later --model's)."""
    if settings.models is None:
        first = ModelSpec(settings.model, settings.served_model_name, pinned=True)
        return [first, *(ModelSpec(name) for name in settings.extra_models)]
    out = read(settings.models)
    for n, spec in enumerate(out, start=1):  # a model's own kv_bits against the server's group, or the reverse
        own = {k: spec.overrides.get(k, getattr(settings, k)) for k in ("kv_bits", "kv_group_size")}
        if (why := kv_group_refusal(own["kv_bits"], own["kv_group_size"])) is not None:
            raise ValueError(f"--models {settings.models}: [[model]] number {n}: {why}")
    return out


def read(path: Path) -> list[ModelSpec]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--models {path}: not readable ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--models {path}: not TOML ({e})") from None
    try:
        entries = _File.model_validate(data).model
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        if err["loc"][:1] == ("model",) and len(err["loc"]) > 1 and isinstance(err["loc"][1], int):
            where = f"[[model]] number {err['loc'][1] + 1}" + "".join(f", {x}" for x in err["loc"][2:])
        raise ValueError(f"--models {path}: {where}: {err['msg']}") from None
    return [e.spec() for e in entries]
