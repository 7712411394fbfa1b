"""The decoding batch (core.engine.decode_batch): a step keeps its logits whole, a running
row's response reads its row only when asked, and tokens and log-probabilities are the ones
mlx-lm's own GenerationBatch gives."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import BatchGenerator, StopSequences

from radixchat.core.engine.decode_batch import DecodingBatch, Rows, Running
from radixchat.core.engine.stepper import BudgetedBatchGenerator

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
SIZES = dict(max_tokens=1000, completion_batch_size=8, prefill_batch_size=4, prefill_step_size=512)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load(str(tiny_model_dir))[0]


def run(gen, steps: int = 30) -> list[list[tuple[int, mx.array]]]:
    uids = gen.insert(PROMPTS, max_tokens=[6] * 3, stop_sequences=[StopSequences()] * 3)
    out = {u: [] for u in uids}
    for _ in range(steps):
        for r in gen.next()[1]:
            out[r.uid].append((r.token, r.logprobs))
    gen.close()
    return [out[u] for u in uids]


def test_tokens_and_log_probabilities_are_the_librarys(model):
    library = run(BatchGenerator(model, **SIZES))
    ours = run(BudgetedBatchGenerator(model, step_tokens=256, on_prompt=lambda r: None, **SIZES))
    for theirs, mine in zip(library, ours):
        assert [t for t, _ in mine] == [t for t, _ in theirs] and len(mine) == 6
        for (_, a), (_, b) in zip(theirs, mine):
            assert a.shape == b.shape and mx.allclose(a, b, atol=1e-4).item()


def test_a_step_keeps_its_logits_whole_and_a_running_row_reads_its_own(model):
    gen = BudgetedBatchGenerator(model, step_tokens=256, on_prompt=lambda r: None, **SIZES)
    batch = gen._generation_batch
    assert isinstance(batch, DecodingBatch)
    gen.insert(PROMPTS, max_tokens=[6] * 3, stop_sequences=[StopSequences()] * 3)
    responses = []
    while len(responses) < 3:
        responses = gen.next()[1]
    step = batch._current_logprobs
    assert isinstance(step, Rows) and step._list is None  # no row was sliced
    assert all(isinstance(r, Running) for r in responses)
    for i, r in enumerate(responses):  # each reads its own row of the step's logits
        assert mx.array_equal(r.logprobs, step._all[i]).item()
        assert int(mx.argmax(r.logprobs).item()) == r.token  # greedy: the row's choice
    assert step._list is None  # reading a row slices it alone: the step's logits stay whole
    gen.close()
