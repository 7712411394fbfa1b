"""Which system prompts to prefill at start-up, so the first user of the day finds them cached.

The presets (assets/prompts.json) and those of `--warm-prompts FILE`: a JSON list of
strings (or of objects with "text"), or plain text whose paragraphs, separated by blank
lines, are one prompt each. Only says which; the engine submits them (core/engine/engine.py,
`_start_warm_up`), as requests of an owner no user can be, so they are neither stored nor
counted as users' requests. Pure Python, any thread.
"""

from __future__ import annotations

import json
from pathlib import Path

WARM_OWNER = "radixchat:warm-up"  # not a valid user name: its namespace is nobody's


def warm_prompts(file: Path | None, presets: bool = True) -> list[str]:
    out: list[str] = []
    if presets:
        from radixchat import assets

        out += [p["text"] for p in assets.prompts().get("system_prompts", []) if p.get("text")]
    if file is not None:
        text = Path(file).expanduser().read_text(encoding="utf-8")
        try:
            items = json.loads(text)
        except ValueError:
            items = [p.strip() for p in text.split("\n\n")]
        if not isinstance(items, list):
            raise ValueError(f"{file}: a JSON list of prompts, or paragraphs of text")
        out += [i.get("text", "") if isinstance(i, dict) else str(i) for i in items]
    seen, unique = set(), []
    for p in out:
        if p.strip() and p not in seen:
            seen.add(p)
            unique.append(p)
    return unique
