"""What a decode step hands MLX, counted (loadtests/bench_kernels.py): the engine's generator
submits no more primitives than mlx-lm's own `BatchGenerator` on the same model and rows, and
with rows leaving and joining it waits for about as many evaluations (a leave or a join is
one for every layer, core.cache.batch.slots.one_eval). Counts, not times: the same on any machine."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load

from tests.support.randmodel import build_random_model
from tests.support.step_count import Count, both, count_churn, count_steps, random_prompts


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from radixchat.core.engine.step import unnormalized

    unnormalized.install()
    unnormalized.use_here(True)  # as the engine thread runs (this thread, here)
    folder = build_random_model(tmp_path_factory.mktemp("prims") / "m", layers=6, vocab_size=400)
    m, _ = load(str(folder))
    yield m
    unnormalized.use_here(False)


def test_the_count_sees_what_is_pending_and_nothing_evaluated():
    a = mx.ones((4, 4))
    with Count() as c:
        b = mx.exp(a) + 1
        mx.eval(b)
        mx.eval(b)  # already evaluated: no wait, nothing counted
    assert c.names["Exp"] == 1 and c.names["Add"] == 1 and c.evals == 1
    assert c.total(compute_only=True) < c.total()  # the broadcast of the 1 is a view
    assert mx.eval.__name__ == "eval"


def test_a_decode_step_submits_no_more_primitives_than_the_librarys(model):
    prompts = random_prompts(8, 24, 400)
    engine, library = both(model, 8, lambda gen: count_steps(gen, prompts, 4, 1000))
    assert engine.evals == library.evals == 4
    assert engine.total(compute_only=True) <= 1.02 * library.total(compute_only=True)
    assert engine.total() <= library.total()


def test_rows_leaving_and_joining_wait_for_about_as_many_evaluations_as_the_librarys(model):
    """A leave's and a join's row writes evaluated layer by layer: 176 against the library's
    62 here (6 layers, 16 steps); one evaluation for every layer: 65. What is left beyond
    the library's is the slot buffers' re-lays (one evaluation a layer, for memory)."""
    prompts = random_prompts(8, 24, 400)
    engine, library = both(model, 8, lambda gen: count_churn(gen, prompts, 16))
    assert engine.evals <= 1.25 * library.evals
    assert engine.total() < library.total()
