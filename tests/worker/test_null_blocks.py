"""The worker side of sliding-window freeing: CachedRequestData.num_null_blocks points a row's
leading block-table entries to the null block, and the next step copies the table again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.input_batch import InputBatch
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.step_buffers import StepBuffers

BLOCKS = [3, 4, 5, 6, 7, 8]
NUM_PROMPT = 40


def _decode(batch: InputBatch, buf: StepBuffers, num_computed: int, num_null: int):
    batch.update_request(CachedRequestData("r", [], num_computed, num_null))
    layout = batch.prepare(SchedulerOutput([], [], {"r": 1}, 1, sampling_req_ids={"r"}), buf)
    batch.record_sampled(layout, np.array([9]))
    return layout


def test_null_blocks_are_pointed_to_the_null_block_and_the_table_recopied() -> None:
    batch = InputBatch(max_num_reqs=2, max_model_len=64, block_size=8)
    buf = StepBuffers(
        max_num_tokens=64,
        max_num_reqs=2,
        max_num_blocks_per_req=8,
        device=torch.device("cpu"),
        pin=False,
        bucket=SizePolicy(2, 64).step_bucket,
        num_head_ids=2,
    )
    prompt = list(range(1, NUM_PROMPT + 1))
    batch.add_request(NewRequestData("r", prompt, [], SamplingParams(), BLOCKS, 0), None)
    layout = batch.prepare(
        SchedulerOutput([], [], {"r": NUM_PROMPT}, NUM_PROMPT, sampling_req_ids={"r"}), buf
    )
    batch.record_sampled(layout, np.array([9]))
    _decode(batch, buf, NUM_PROMPT, 0)
    steady = _decode(batch, buf, NUM_PROMPT + 1, 0)
    assert steady.reuse_block_table  # nothing changed: the device still holds the table
    nulled = _decode(batch, buf, NUM_PROMPT + 2, 2)
    assert not nulled.reuse_block_table
    assert batch.block_table_np[0, :6].tolist() == [0, 0, 5, 6, 7, 8]
    again = _decode(batch, buf, NUM_PROMPT + 3, 2)  # the same count: no change
    assert again.reuse_block_table
    with pytest.raises(ValueError, match="num_null_blocks=7 exceeds"):
        batch.update_request(CachedRequestData("r", [], NUM_PROMPT + 4, 7))
