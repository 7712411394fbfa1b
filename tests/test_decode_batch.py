"""The decoding batch (core.engine.step.decode_batch): a step keeps its logits whole, a running
row's response reads its row only when asked, and tokens and log-probabilities are the ones
mlx-lm's own GenerationBatch gives."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import BatchGenerator, StopSequences

from radixchat.core.engine.step.decode_batch import DecodingBatch, Rows, Running
from radixchat.core.engine.step.stepper import BudgetedBatchGenerator

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
SIZES = dict(max_tokens=1000, completion_batch_size=8, prefill_batch_size=4, prefill_step_size=512)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load(str(tiny_model_dir))[0]


def run(gen, lengths=(6, 6, 6), late: int = 0, steps: int = 40) -> list[list[tuple[int, mx.array]]]:
    """Each prompt's tokens and log-probabilities; with `late`, that many more prompts join
    the batch once its first row has finished (rows leave and join mid-batch)."""
    stops = [StopSequences()] * 3
    uids = gen.insert(PROMPTS, max_tokens=list(lengths), stop_sequences=stops)
    out = {u: [] for u in uids}
    for _ in range(steps):
        for r in gen.next()[1]:
            out[r.uid].append((r.token, r.logprobs))
            if r.finish_reason and late:
                uids += gen.insert(PROMPTS[:late], max_tokens=list(lengths[:late]), stop_sequences=stops[:late])
                out.update({u: [] for u in uids[-late:]})
                late = 0
    gen.close()
    return [out[u] for u in uids]


def ours_and_librarys(model, **kw):
    library = run(BatchGenerator(model, **SIZES), **kw)
    ours = run(BudgetedBatchGenerator(model, step_tokens=256, on_prompt=lambda r: None, **SIZES), **kw)
    assert len(ours) == len(library)
    for theirs, mine in zip(library, ours):
        assert [t for t, _ in mine] == [t for t, _ in theirs] and len(mine) > 1
        for (_, a), (_, b) in zip(theirs, mine):
            assert a.shape == b.shape and mx.allclose(a, b, atol=1e-4).item()


def test_tokens_and_log_probabilities_are_the_librarys(model):
    ours_and_librarys(model)


def test_they_stay_the_librarys_as_rows_leave_and_join(model):
    ours_and_librarys(model, lengths=(3, 9, 5), late=2)


def test_a_step_keeps_its_logits_whole_and_a_running_row_reads_its_own(model):
    gen = BudgetedBatchGenerator(model, step_tokens=256, on_prompt=lambda r: None, **SIZES)
    batch = gen._generation_batch
    assert isinstance(batch, DecodingBatch)
    gen.insert(PROMPTS, max_tokens=[6] * 3, stop_sequences=[StopSequences()] * 3)
    responses = []
    while len(responses) < 3:
        responses = gen.next()[1]
    step = batch._current_logprobs
    assert isinstance(step, Rows) and step._index is None and not step._more  # the step's own rows
    assert all(isinstance(r, Running) for r in responses)
    for i, r in enumerate(responses):  # each reads its own row of the step's logits
        assert mx.array_equal(r.logprobs, step._all[i]).item()
        assert int(mx.argmax(r.logprobs).item()) == r.token  # greedy: the row's choice
    gen.close()


def test_a_row_that_leaves_or_joins_slices_no_other_rows_logits(model):
    gen = BudgetedBatchGenerator(model, step_tokens=256, on_prompt=lambda r: None, **SIZES)
    batch = gen._generation_batch
    gen.insert(PROMPTS, max_tokens=[8, 3, 8], stop_sequences=[StopSequences()] * 3)
    while not any(r.finish_reason for r in gen.next()[1]):
        pass
    rows = batch._next_logprobs  # the step in flight's logits, less the row that left
    assert isinstance(rows, Rows) and len(rows) == 2 and rows._index == [0, 2]
    assert mx.array_equal(rows[1], rows._all[2]).item()  # the last row took the hole
    gen.insert([[20, 21]], max_tokens=[8], stop_sequences=[StopSequences()])
    while len(batch.uids) < 3:
        gen.next()
    joined = batch._current_logprobs  # the newcomer's placeholder after the two rows, none sliced
    assert isinstance(joined, Rows) and joined._index == [0, 2, 3] and len(joined._more) == 1
    gen.close()
