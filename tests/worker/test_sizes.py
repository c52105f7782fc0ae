"""SizePolicy: the decode graphs, the step buffers' buckets and the LM head's row counts agree, before
and after the replay timing drops sizes; the piecewise token counts likewise."""

from __future__ import annotations

import torch

from pagedlm.worker.sizes import LARGE_BUCKET, SizePolicy, bucket_size, smallest_at_least
from pagedlm.worker.step_buffers import StepBuffers


def test_step_buckets_are_the_decode_graph_sizes_up_to_the_largest():
    policy = SizePolicy(max_num_seqs=24, max_num_tokens=40)
    assert (
        policy.capture_sizes == policy.decode_sizes == [1, 2, 4, 8, 16, 24]
        and policy.max_decode_size == 24
    )
    for n in range(1, 25):
        assert policy.step_bucket(n) == policy.decode_graph_size(n) == policy.lm_head_rows(n)
    assert policy.decode_graph_size(25) is None
    assert policy.step_bucket(25) == policy.lm_head_rows(25) == LARGE_BUCKET
    assert policy.is_staged(8) and not policy.is_staged(16)


def test_the_timing_narrows_decode_graphs_and_buckets_but_not_the_lm_head():
    """16 loses to 24 of the same kind, 8 (another kind) stays: a step of 9..16 sequences is laid out
    and replayed at 24 from now on, in a buffer made before; the LM head keeps every capture size."""
    policy = SizePolicy(max_num_seqs=24, max_num_tokens=40)
    buffers = StepBuffers(40, 24, 4, torch.device("cpu"), pin=False, bucket=policy.step_bucket)
    moves = policy.keep_fastest_decode({8: 1.0, 16: 3.0, 24: 2.0}, {8: 2, 16: 1, 24: 1})
    assert moves == {16: (24, 3.0, 2.0)} and policy.decode_sizes == [1, 2, 4, 8, 24]
    assert policy.decode_graph_size(9) == policy.step_bucket(9) == buffers.bucket(9) == 24
    assert policy.lm_head_rows(9) == 16 and policy.capture_sizes == [1, 2, 4, 8, 16, 24]
    assert buffers.sections(24, 24).num_seqs == 24  # the buffer made before holds the new layouts


def test_piecewise_sizes_narrow_alike():
    policy = SizePolicy(max_num_seqs=4, max_num_tokens=96)
    assert policy.piecewise_sizes == [16, 32, 64, 96] and policy.max_piecewise_size == 96
    moves = policy.keep_fastest_piecewise({16: 1.0, 32: 3.0, 64: 2.0, 96: 1.9})
    assert moves == {32: (64, 3.0, 2.0)} and policy.piecewise_sizes == [16, 64, 96]
    assert policy.piecewise_size(17) == 64 and policy.piecewise_size(97) is None


def test_smallest_at_least_and_bucket_size():
    assert [smallest_at_least([2, 4], n) for n in (1, 2, 3, 5)] == [2, 2, 4, None]
    assert [bucket_size([2, 4], n) for n in (3, 5, 256, 257)] == [4, 256, 256, 512]
