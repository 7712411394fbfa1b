"""Build a random-weight llama-style chat model in mlx-lm's format, for tests and benchmarks.

Fixed seed, no downloads: a byte-level BPE tokenizer trained on a few sentences with the
`tokenizers` library, a ChatML-like template, and random weights scaled so that greedy
decoding has clear winners (few floating-point near-ties). Tests use a tiny one; the
benchmarks a larger one where prefill costs more. Besides llama, two tiny shapes whose
caches the prefix cache cannot trim: lfm2 (short convolutions) and gemma3 (sliding-window
layers with a rotating cache, between global ones). `python -m tests.support.randmodel OUT`
builds one from the command line.
"""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# the same, teaching the Hermes/Qwen tool-call format (for the tool-calling tests)
TOOL_TEMPLATE = (
    "{%- if tools %}<|system|>You may call these tools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    'Call one as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call><|end|>{%- endif %}'
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' and m.get('tool_calls') %}<|assistant|>{% for c in m['tool_calls'] %}"
    "<tool_call>\n{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}"
    "\n</tool_call>{% endfor %}<|end|>"
    "{%- elif m['role'] == 'tool' %}<|user|><tool_response>\n{{ m['content'] }}\n</tool_response><|end|>"
    "{%- else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{%- endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|pad|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Python lists are mutable sequences; tuples are immutable.",
    "A dictionary maps keys to values. Use dict.get for defaults.",
    "def main():\n    print('hello world')\n",
    "Generators yield values lazily, one at a time, with the yield statement.",
] * 20


def build_tokenizer(out: Path, vocab_size: int = 400, template: str = TEMPLATE) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|end|>",
                "pad_token": "<|pad|>",
                "chat_template": template,
                "model_max_length": 4096,
            }
        )
    )
    return tok.get_vocab_size()


def _llama(dim: int, layers: int, vocab: int, context: int) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": dim,
        "num_hidden_layers": layers,
        "intermediate_size": dim * 2 if dim <= 128 else dim * 8 // 3,
        "num_attention_heads": max(4, dim // 64),
        "num_key_value_heads": max(2, dim // 128),
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _qwen3(dim: int, layers: int, vocab: int, context: int) -> dict:
    """Llama's shape with per-head RMS norms on queries and keys (and an explicit head size)."""
    return {
        "model_type": "qwen3",
        "hidden_size": dim,
        "num_hidden_layers": layers,
        "intermediate_size": dim * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": dim // 4,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _lfm2(dim: int, layers: int, vocab: int, context: int) -> dict:
    """A hybrid: short-convolution layers (ArraysCache, not trimmable) and attention layers."""
    return {
        "model_type": "lfm2",
        "hidden_size": dim,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": context,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": dim,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "intermediate_size": dim * 2,
        "full_attn_idxs": list(range(1, layers, 2)),
        "vocab_size": vocab,
        "torch_dtype": "float32",
    }


SLIDING_WINDOW = 16  # tokens: far shorter than any chat prompt, so every one wraps


def _gemma3(dim: int, layers: int, vocab: int, context: int) -> dict:
    """Sliding-window layers (RotatingKVCache of SLIDING_WINDOW tokens) alternating with
    global ones (KVCache): a prompt longer than the window wraps the rotating caches."""
    return {
        "model_type": "gemma3_text",
        "hidden_size": dim,
        "num_hidden_layers": layers,
        "intermediate_size": dim * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": dim // 4,
        "query_pre_attn_scalar": dim // 4,
        "rms_norm_eps": 1e-6,
        "sliding_window": SLIDING_WINDOW,
        "sliding_window_pattern": 2,
        "max_position_embeddings": context,
        "rope_theta": 10000.0,
        "rope_local_base_freq": 10000.0,
        "vocab_size": vocab,
        "torch_dtype": "float32",
    }


CONFIGS = {"llama": _llama, "qwen3": _qwen3, "lfm2": _lfm2, "gemma3": _gemma3}


def _sharpen(model, arch: str, vocab: int, dim: int) -> None:
    """Scales chosen so greedy decoding has clear winners (few float near-ties) and the
    reply depends on the whole prompt, not just its last token."""
    import mlx.core as mx

    if arch in ("llama", "qwen3"):
        model.model.embed_tokens.weight = mx.random.normal((vocab, dim))
        model.lm_head.weight = mx.random.normal((vocab, dim)) * 0.5
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight = layer.self_attn.v_proj.weight * 2
    elif arch == "gemma3":  # the model multiplies embeddings by sqrt(dim) itself
        model.model.embed_tokens.weight = mx.random.normal((vocab, dim)) * dim**-0.5
        model.lm_head.weight = mx.random.normal((vocab, dim)) * 0.5
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight = layer.self_attn.v_proj.weight * 2
    else:
        model.model.embed_tokens.weight = mx.random.normal((vocab, dim)) * 0.3
        for layer in model.model.layers:
            if layer.is_attention_layer:
                layer.self_attn.v_proj.weight = layer.self_attn.v_proj.weight * 4
            else:
                layer.conv.in_proj.weight = layer.conv.in_proj.weight * 4


def build_random_model(
    out: Path,
    seed: int = 0,
    dim: int = 64,
    layers: int = 2,
    context: int = 512,
    vocab_size: int = 400,
    arch: str = "llama",
    template: str = TEMPLATE,
) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out, vocab_size, template)
    config = CONFIGS[arch](dim, layers, vocab, context)
    (out / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    _sharpen(model, arch, vocab, dim)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="build a random-weight chat model")
    p.add_argument("out", type=Path)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=sorted(CONFIGS), default="llama")
    a = p.parse_args()
    print(build_random_model(a.out, a.seed, a.dim, a.layers, a.context, arch=a.arch))
