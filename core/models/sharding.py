"""Splitting a loaded model over the ranks of an mlx.launch group (tensor parallel, mlx-lm's
`shard`), or one line saying why it cannot be. Runs where the model loads (the engine thread);
the group itself is core.engine.shard.lockstep's.
"""

from __future__ import annotations

SPLIT = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "moe_intermediate_size")


def shard_model(model, link) -> str:
    """Shard a lazily loaded model over the group, or say in one line why it cannot be."""
    if not hasattr(model, "shard"):
        pipeline = hasattr(getattr(model, "model", None), "pipeline")
        raise ValueError(
            f"this model ({type(model).__module__.rsplit('.', 1)[-1]}) has no tensor-parallel "
            "sharding in mlx-lm"
            + (" (only pipeline stages, which radixchat does not run yet)" if pipeline else "")
            + ": run it on one machine"
        )
    args = getattr(model, "args", None)
    uneven = [
        f"{getattr(args, k)} {k.replace('_', ' ').replace('num ', '')}"
        for k in SPLIT
        if isinstance(getattr(args, k, None), int) and getattr(args, k) % link.size
    ]
    if uneven:  # mlx-lm would divide them with // and compute garbage
        raise ValueError(
            f"this model's {', '.join(uneven)} do not split evenly over {link.size} ranks: "
            "run it on a number of ranks that divides them"
        )
    model.shard(link.group)
    return "tensor"
