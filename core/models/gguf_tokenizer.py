"""A Hugging Face tokenizer rebuilt from a GGUF vocabulary: tokenizer.json and
tokenizer_config.json.

Owns: llama.cpp's byte-level BPE in the `tokenizers` library's terms (its pre-tokenizer
regexes, merges, control and user-defined tokens, the BOS template), the special tokens'
roles and the chat template in tokenizer_config.json, and refusing a vocabulary it cannot
rebuild (`check_tokenizer`). Leaves to others: the header (`gguf_file.py`), the weights
(`gguf_llama.py`), the folder it writes into (`gguf.py`). Runs in whichever thread converts:
the engine thread at start-up, or the CLI's for `radixchat doctor`.
"""

from __future__ import annotations

import json
from pathlib import Path

from radixchat.core.models.gguf_file import GGUFError

# llama.cpp's pre-tokenizer regexes (llm_tokenizer_bpe), applied one after another, each
# match isolated; byte-level BPE then runs inside every piece
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    **dict.fromkeys(["gpt2", "gpt-2", "mpt", "olmo", "jais"], (_GPT2,)),
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"], (r"\p{N}", _GPT2)
    ),
    **dict.fromkeys(["llama-bpe", "llama3", "dbrx", "smaug-bpe"], (_LLAMA3,)),
}
_IGNORE_MERGES = {"llama-bpe", "llama3", "dbrx", "smaug-bpe"}  # whole-word vocabulary hits first

_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
_ROLE_KEYS = (
    ("bos", "bos_token"),
    ("eos", "eos_token"),
    ("padding", "pad_token"),
    ("unknown", "unk_token"),
)  # tokenizer.ggml.<role>_token_id -> tokenizer_config


def check_tokenizer(meta: dict, arrays: set[str], name: str) -> None:
    """Refuse, in one line, a vocabulary `build_tokenizer` cannot rebuild."""
    if "tokenizer.ggml.tokens" not in arrays:
        raise GGUFError(f"{name}: the file has no vocabulary (tokenizer.ggml.tokens)")
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(
            f"{name}: tokenizer {model!r} is not supported; only byte-level BPE ('gpt2') vocabularies convert"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE:
        raise GGUFError(f"{name}: pre-tokenizer {pre!r} is not supported (known: {', '.join(sorted(_PRE))})")


def build_tokenizer(meta: dict, out: Path, context_length: int) -> list[int]:
    """tokenizer.json and tokenizer_config.json from the GGUF vocabulary; returns the
    end-of-sequence token ids for config.json."""
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = _ints(meta.get("tokenizer.ggml.token_type")) or [1] * len(tokens)
    tok = _bpe(tokens, list(meta.get("tokenizer.ggml.merges", [])), meta.get("tokenizer.ggml.pre", "default"))
    _add_tokens(tok, tokens, types)
    named = {
        role: _scalar(meta.get(f"tokenizer.ggml.{role}_token_id"))
        for role in ("bos", "eos", "padding", "unknown", "eot", "eom")
    }
    named = {role: i for role, i in named.items() if i is not None and 0 <= i < len(tokens)}
    if _scalar(meta.get("tokenizer.ggml.add_bos_token")) and "bos" in named:
        from tokenizers import processors

        bos = tokens[named["bos"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, named["bos"])]
        )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
    }
    for role, key in _ROLE_KEYS:
        if role in named:
            config[key] = tokens[named[role]]
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return list(dict.fromkeys(named[r] for r in ("eos", "eot", "eom") if r in named))


def _bpe(tokens: list[str], merges: list[str], pre: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in _IGNORE_MERGES))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _add_tokens(tok, tokens: list[str], types: list[int]) -> None:
    """Control tokens (the chat template's markers) become special tokens, matched whole and
    never split; user-defined ones are matched whole but decode like text."""
    from tokenizers import AddedToken

    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )


def _scalar(v):
    return v.item() if hasattr(v, "item") else v


def _ints(v) -> list[int]:
    return [] if v is None else (v.tolist() if hasattr(v, "tolist") else list(v))
