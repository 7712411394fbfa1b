"""`reasoning_effort` on a model whose chat template has a thinking switch (Qwen3's
`enable_thinking`): "none" and "minimal" turn it off, the others leave it on, and the prompt
says so; on a model without one it is a 400 naming it (tests/test_openai_api.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.randmodel import TEMPLATE, build_random_model
from tests.support.server import Server, stop_clean

# the plain template, with the switch Qwen3's has: thinking off puts an empty think block
SWITCH = TEMPLATE.replace(
    "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}",
)


@pytest.mark.slow
def test_reasoning_effort_flips_the_templates_thinking_switch(tmp_path):
    assert SWITCH != TEMPLATE
    model = build_random_model(tmp_path / "switch", template=SWITCH)
    srv = Server(model, tmp_path / "s.db", "--no-auth", "--no-warm-presets")
    try:

        def prompt_tokens(**extra) -> int:
            body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **extra}
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens"]

        on = prompt_tokens(reasoning_effort="high")
        assert prompt_tokens(reasoning_effort="low") == on
        off = prompt_tokens(reasoning_effort="none")
        assert prompt_tokens(reasoning_effort="minimal") == off > on  # off: the empty think block
        # left out: mlx-lm's default, on only where the tokenizer has thinking tokens (not here)
        assert prompt_tokens() == off
    finally:
        stop_clean(srv)
