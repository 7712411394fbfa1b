"""Counting what a decode step hands MLX: the primitives of every graph a step evaluates and
the evaluations themselves, for the engine's generator and for mlx-lm's own `BatchGenerator`
on the same model, rows and prompts. Shared by tests/test_step_primitives.py (the counts as
invariants) and loadtests/bench_kernels.py (the counts as figures, and timings); it runs MLX
in the caller's thread, as a test or a benchmark does."""

from __future__ import annotations

import io
import re
from collections import Counter

# primitives that make a view or a broadcast rather than run a kernel of their own on a GPU
VIEWS = frozenset({"Broadcast", "Slice", "Reshape", "ExpandDims", "Squeeze", "Transpose", "AsStrided", "Flatten"})
_LABEL = re.compile(r'label ="([^"]+)", shape=rectangle')


class Count:
    """While entered, every mx.eval / mx.async_eval has its unevaluated primitives counted."""

    def __init__(self):
        self.names: Counter[str] = Counter()
        self.evals = 0

    def _count(self, args) -> None:
        import mlx.core as mx
        from mlx.utils import tree_flatten

        arrays = [v for _, v in tree_flatten(list(args)) if isinstance(v, mx.array)]
        if not arrays:
            return
        dot = io.StringIO()
        mx.export_to_dot(dot, *arrays)
        found = [m.split("\n")[0].split(" ")[0] for m in _LABEL.findall(dot.getvalue())]
        self.names.update(found)
        self.evals += bool(found)  # an eval of what is already evaluated waits for nothing

    def __enter__(self) -> Count:
        import mlx.core as mx

        self._real_eval, self._real_async = mx.eval, mx.async_eval

        def counted(*args):
            self._count(args)
            self._real_eval(*args)

        mx.eval = mx.async_eval = counted
        return self

    def __exit__(self, *exc) -> None:
        import mlx.core as mx

        mx.eval, mx.async_eval = self._real_eval, self._real_async

    def total(self, compute_only: bool = False) -> int:
        return sum(n for name, n in self.names.items() if not (compute_only and name in VIEWS))


def random_prompts(rows: int, length: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(rows)]


def decoding(gen, rows: int, warm: int) -> None:
    """Step until every row decodes (nothing waits or prefills), then `warm` steps more."""
    for _ in range(10_000):
        batch = gen._generation_batch
        if len(batch) == rows and not gen._unprocessed_sequences and not gen._currently_processing:
            break
        gen.next()
    else:
        raise RuntimeError("the prompts never all reached the decoding batch")
    for _ in range(warm):
        gen.next()


def count_steps(gen, prompts: list[list[int]], steps: int, max_tokens: int) -> Count:
    gen.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    decoding(gen, len(prompts), warm=3)
    with Count() as c:
        for _ in range(steps):
            gen.next()
    if len(gen._generation_batch) != len(prompts):
        raise RuntimeError("a row left while counting: raise --max-tokens")
    return c


def count_churn(gen, prompts: list[list[int]], steps: int) -> Count:
    """Rows that leave and join: row k of the first batch stops after k + 4 tokens, and each
    row that stops is replaced by a new prompt that stops `len(prompts)` tokens later, so about
    one row leaves and one joins a step; the count covers every step's prefill, joins, leaves
    and decode."""
    rows = len(prompts)
    gen.insert(prompts, max_tokens=[k + 4 for k in range(rows)])
    more = iter(prompts * (steps + rows))
    with Count() as c:
        for _ in range(steps):
            _, finished = gen.next()
            done = sum(r.finish_reason is not None for r in finished)
            if done:
                gen.insert([next(more) for _ in range(done)], max_tokens=[rows] * done)
    return c


def library(model, rows: int):
    from mlx_lm.generate import BatchGenerator

    return BatchGenerator(model, completion_batch_size=rows, prefill_batch_size=rows)


def engine(model, rows: int, step_tokens: int | None = None):
    """The generator the engine builds (core.engine.step.stepper.make_generator), its settings the
    server's defaults but the batch's size (and `step_tokens`, where given); every row greedy,
    as the library's."""
    import mlx.core as mx

    from radixchat.core.config import Settings
    from radixchat.core.engine.step.stepper import make_generator

    step = {} if step_tokens is None else {"step_tokens": step_tokens}
    settings = Settings(max_batch=rows, speculate=0, **step)
    return make_generator(model, settings, mx.new_stream(mx.default_device()), lambda responses: None, 0)


def both(model, rows: int, measure, step_tokens: int | None = None) -> tuple:
    """`measure(gen)` of a fresh engine's generator, then of a fresh library's, each on its stream."""
    import mlx.core as mx

    got = []
    for make in (lambda: engine(model, rows, step_tokens), lambda: library(model, rows)):
        gen = make()  # one at a time: the first is closed before the second is made
        with mx.stream(gen.stream):
            got.append(measure(gen))
        gen.close()
    return tuple(got)
