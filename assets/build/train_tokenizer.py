"""Train the byte-level BPE tokenizer and write it in the Hugging Face layout mlx-lm loads.

Writes tokenizer.json (vocabulary, merges, special tokens) and tokenizer_config.json (the chat
template and the end-of-turn token as eos). The text it learns from is the training records, the
system prompts and pydoc's reference topics. It does not touch the model or its config.json.
"""

import json
from pathlib import Path
from pydoc_data.topics import topics

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [END, SYSTEM, USER, ASSISTANT]

# Each turn is "<|role|>\n{content}<|end|>\n". The role and end markers are special tokens, so
# a rendered conversation tokenizes the same as its turns tokenized one by one: the prompt of
# turn n is a token prefix of the prompt of turn n+1, which a prefix cache relies on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def corpus(records, prompts):
    for r in records:
        yield "\n".join(r["questions"])
        yield r["answer"]
    yield from prompts
    for key in sorted(topics):
        yield topics[key]


def train(records, prompts, out: Path, vocab_size: int, max_length: int):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(records, prompts), trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": END,
        "pad_token": END,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": END, "pad_token": END}, indent=2) + "\n")
    return tok
