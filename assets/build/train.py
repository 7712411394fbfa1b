"""Train the bundled chat model from scratch and write it to assets/model/ in mlx-lm's format.

One command runs the whole pipeline: build the question/answer records (make_data), train the
tokenizer (train_tokenizer), train a llama-architecture model from a fresh initialisation with
AdamW on conversation rows (chat_data), evaluate on the held-out subjects, and save config.json
and model.safetensors next to the tokenizer. Deterministic for a given seed and Python version.
Writing the sample answers for the model card is sample.py's job.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python assets/build/train.py

(without OpenBLAS, MLX's bundled reference BLAS makes this about 15 times slower on Linux).
"""

import argparse
import json
import math
import random
import sys
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import llama

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules, however we are run
import chat_data
import make_data
import train_tokenizer

ASSETS = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ASSETS / "model")
    p.add_argument("--log", type=Path, default=ASSETS / "build" / "train_log.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=512, help="tokens per training row")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--eval-every", type=int, default=100)
    return p.parse_args(argv)


def model_config(args, end_id):
    return {
        "_name_or_path": "radixchat-python-4m",  # the id servers report for it
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": args.dim,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "intermediate_size": args.ffn,
        "hidden_act": "silu",
        "vocab_size": args.vocab,
        # RoPE has no table to outgrow; training rows are args.length tokens long.
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": end_id,
        "torch_dtype": "float32",
    }


def weighted_ce(model, ids, weights):
    """Sum of cross-entropy over weighted targets, and the sum of weights."""
    logits = model(ids[:, :-1])
    ce = nn.losses.cross_entropy(logits, ids[:, 1:]) * weights[:, 1:]
    return ce.sum(), weights[:, 1:].sum()


def batches(records, long_prompts, layout, args):
    """Endless batches; each epoch reshuffles records, phrasings and prompts from its own seed."""
    ids = np.zeros((0, args.length + 1), np.int32)
    weights = np.zeros((0, args.length + 1), np.float32)
    epoch = 0
    while True:
        while len(ids) < args.batch:
            rng = random.Random(args.seed * 1_000_003 + epoch)
            more_ids, more_w = chat_data.rows(records, long_prompts, layout, rng, args.length)
            order = np.random.default_rng(args.seed + epoch).permutation(len(more_ids))
            ids = np.concatenate([ids, more_ids[order]])
            weights = np.concatenate([weights, more_w[order]])
            epoch += 1
        yield epoch, mx.array(ids[: args.batch]), mx.array(weights[: args.batch])
        ids, weights = ids[args.batch :], weights[args.batch :]


def evaluate(model, ids, weights, batch):
    total, count = 0.0, 0.0
    for i in range(0, len(ids), batch):
        s, n = weighted_ce(model, mx.array(ids[i : i + batch]), mx.array(weights[i : i + batch]))
        total, count = total + s.item(), count + n.item()
    return total / count


def relative(value):
    """Paths inside the repository as the repository sees them, so the log is machine-free."""
    if isinstance(value, Path) and value.resolve().is_relative_to(ASSETS.parent):
        return value.resolve().relative_to(ASSETS.parent)
    return value


def main(argv=None):
    args = parse_args(argv)
    t0 = time.perf_counter()
    records = make_data.records()
    train = [r for r in records if r["split"] == "train"]
    valid = [r for r in records if r["split"] == "valid"]
    prompts = json.loads((ASSETS / "prompts.json").read_text())
    long_prompts = [p["text"] for p in prompts["system_prompts"]]
    tok = train_tokenizer.train(train, long_prompts + chat_data.SHORT_PROMPTS, args.out, args.vocab, 2048)
    layout = chat_data.Layout(tok)
    valid_ids, valid_w = chat_data.rows(valid, long_prompts, layout, random.Random(args.seed + 1), args.length)
    t_data = time.perf_counter() - t0

    mx.random.seed(args.seed)
    config = model_config(args, layout.end)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"{n_params / 1e6:.2f}M parameters; data and tokenizer in {t_data:.0f}s", flush=True)

    schedule = optim.join_schedules(
        [
            optim.linear_schedule(args.lr / args.warmup, args.lr, args.warmup),
            optim.cosine_decay(args.lr, args.steps - args.warmup, args.lr / 10),
        ],
        [args.warmup],
    )
    opt = optim.AdamW(learning_rate=schedule, betas=[0.9, 0.95], weight_decay=0.01)
    state = [model.state, opt.state]

    def loss_fn(model, ids, weights):
        s, n = weighted_ce(model, ids, weights)
        return s / n

    @partial(mx.compile, inputs=state, outputs=state)
    def step(ids, weights):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, ids, weights)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return loss

    history, window, t_train = [], [], time.perf_counter()
    data = batches(train, long_prompts, layout, args)
    for it in range(1, args.steps + 1):
        epoch, ids, weights = next(data)
        loss = step(ids, weights)
        mx.eval(state, loss)
        window.append(loss.item())
        if it % 10 == 0 or it == args.steps:
            elapsed = time.perf_counter() - t_train
            entry = {"step": it, "epoch": epoch, "train_loss": sum(window) / len(window), "seconds": round(elapsed, 1)}
            if it % args.eval_every == 0 or it == args.steps:
                entry["valid_loss"] = evaluate(model, valid_ids, valid_w, args.batch)
            history.append(entry)
            window = []
            tps = it * args.batch * args.length / elapsed
            print(json.dumps(entry), f"{tps:.0f} tok/s", flush=True)
    t_train = time.perf_counter() - t_train

    mx.save_safetensors(
        str(args.out / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"}
    )
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    valid_loss = history[-1]["valid_loss"]
    log = {
        "args": {k: str(relative(v)) for k, v in vars(args).items()},
        "parameters": n_params,
        "train_subjects": len(train),
        "valid_subjects": len(valid),
        "valid_loss": valid_loss,
        "valid_perplexity": math.exp(valid_loss),
        "seconds_data": round(t_data, 1),
        "seconds_train": round(t_train, 1),
        "seconds_total": round(time.perf_counter() - t0, 1),
        "history": history,
    }
    args.log.write_text(json.dumps(log, indent=2) + "\n")
    print(
        f"held-out loss {valid_loss:.3f} (perplexity {math.exp(valid_loss):.1f}); "
        f"wrote {args.out} in {log['seconds_total']:.0f}s"
    )


if __name__ == "__main__":
    main()
