"""Fill the generated parts of the model card (assets/README.md) from the bundled model.

Loads assets/model/ with mlx-lm, offline, and rewrites the blocks between the card's
`<!-- name:start -->` and `<!-- name:end -->` markers: the token counts of the scenario system
prompts, greedy answers to ten scenario questions, and greedy answers to questions whose subjects
were held out of training. It trains nothing and leaves the rest of the card as written.

    python assets/build/sample.py
"""

import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mlx_lm import generate, load

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_data

ASSETS = Path(__file__).resolve().parents[1]
CARD = ASSETS / "README.md"
SAMPLE_QUESTIONS = [0, 3, 5, 10, 12, 18, 20, 22, 26, 28]  # indices into prompts.json questions
MAX_TOKENS = 96


def answer(model, tokenizer, system, question):
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return generate(model, tokenizer, prompt, max_tokens=MAX_TOKENS).strip()


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def replace_block(card, name, body):
    pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
    assert pattern.search(card), f"marker {name} missing from {CARD}"
    return pattern.sub(lambda m: m[1] + body + m[2], card)


def main():
    model, tokenizer = load(str(ASSETS / "model"))
    prompts = json.loads((ASSETS / "prompts.json").read_text())
    system = prompts["system_prompts"][0]

    counts = "| name | words | tokens |\n|---|---|---|\n" + "".join(
        f"| {p['name']} | {len(p['text'].split())} | {len(tokenizer.encode(p['text']))} |\n"
        for p in prompts["system_prompts"]
    )

    rows = "| question | greedy answer |\n|---|---|\n"
    for i in SAMPLE_QUESTIONS:
        q = prompts["questions"][i]
        rows += f"| {cell(q)} | {cell(answer(model, tokenizer, system['text'], q))} |\n"

    held_out = [r for r in make_data.records() if r["split"] == "valid"][:3]
    unseen = "| question | greedy answer | reference (not trained on) |\n|---|---|---|\n"
    for r in held_out:
        q = r["questions"][0]
        reply = answer(model, tokenizer, None, q)
        unseen += f"| {cell(q)} | {cell(reply)} | {cell(r['answer'])} |\n"

    card = CARD.read_text()
    card = replace_block(card, "prompt-tokens", counts)
    card = replace_block(card, "samples", f"System prompt: `{system['name']}`.\n\n" + rows)
    card = replace_block(card, "held-out", unseen)
    CARD.write_text(card)
    print(counts + "\n" + rows + "\n" + unseen)


if __name__ == "__main__":
    main()
