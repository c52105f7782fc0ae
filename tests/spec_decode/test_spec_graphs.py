"""The host half of the uniform speculative graphs (worker/spec_graphs.py): which shapes are
captured, how a uniform step (every request 1 + n tokens, n drafts) is laid out and padded at its
graph's layout, and that plan_step replays the graph only for a shape the runner holds. The
replay itself: tests/gpu/test_spec_decode_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.core.sched_output import NewRequestData, SchedulerOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.worker.input_batch import InputBatch, uniform_query_len
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.spec_graphs import SpecDecodeGraphs, spec_graph_shapes
from pagedlm.worker.step_buffers import StepBuffers
from pagedlm.worker.step_plan import StepMode, plan_step

K = 3
PROMPT = 11
HEAD = 72  # max_num_reqs + the largest decode graph


def _config(**extra) -> SpeculativeConfig:
    return SpeculativeConfig.from_user({"method": "ngram", "num_speculative_tokens": K, **extra})


def test_shapes_follow_the_batch_sizes_that_speculate() -> None:
    policy = SizePolicy(max_num_seqs=64, max_num_tokens=96)
    shapes = spec_graph_shapes(_config(), policy)
    # the default: k drafts up to batch 32, 2 up to 64; 32 x 4 and 56 x 2 tokens exceed 96
    most = {1: K, 2: K, 4: K, 8: K, 16: K, 24: K, 32: K, 40: 2, 48: 2, 56: 2, 64: 2}
    want = [(s, q) for s, k in most.items() for q in range(2, k + 2) if s * q <= 96]
    assert shapes == want and (32, 4) not in shapes and (32, 3) in shapes and (48, 2) in shapes
    ranged = _config(num_speculative_tokens_per_batch_size=[[1, 1, 1], [2, 8, 0]])
    # batch 1: k 1; 2..8: plain; above: k (sizes 16..64 within 96 tokens)
    assert spec_graph_shapes(ranged, policy)[:3] == [(1, 2), (16, 2), (16, 3)]
    assert spec_graph_shapes(None, policy) == []


def test_uniform_query_len() -> None:
    assert uniform_query_len(np.array([3, 3]), 8, True) == 4
    assert uniform_query_len(np.array([3, 2]), 7, True) == 0  # ragged drafts
    assert uniform_query_len(np.array([0, 0]), 2, True) == 0  # no drafts
    assert uniform_query_len(np.array([3, 3]), 8, False) == 0  # a request does not sample
    assert uniform_query_len(None, 2, True) == 0


def _batch(policy: SizePolicy) -> tuple[InputBatch, StepBuffers]:
    batch = InputBatch(8, 64, 8, spec_k=K, uniform_bucket=policy.uniform_tokens_bucket)
    buf = StepBuffers(64, 8, 8, torch.device("cpu"), pin=False, bucket=policy.step_bucket,
                      num_head_ids=HEAD)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=16)
    for i, req in enumerate("abc"):
        prompt = list(range(10 * i + 1, 10 * i + 1 + PROMPT))
        blocks = [2 * i + 1, 2 * i + 2]
        batch.add_request(NewRequestData(req, prompt, [], params, blocks, PROMPT - 1), None)
    return batch, buf


def _step(drafts: dict[str, int]) -> SchedulerOutput:
    scheduled = {req: 1 + n for req, n in drafts.items()}
    return SchedulerOutput([], [], scheduled, sum(scheduled.values()),
                           sampling_req_ids=set(drafts), num_draft_tokens=drafts)  # fmt: skip


def _plan(layout, buf: StepBuffers, policy: SizePolicy, spec_graphs):
    sections = buf.sections(layout.bucket_tokens, layout.bucket_seqs)
    return plan_step(1, 0, layout, sections, sections, policy, decode_graphs=True,
                     staged_graphs=True, piecewise_graphs=True, spec_graphs=spec_graphs)  # fmt: skip


@pytest.mark.parametrize("held", [True, False])
def test_a_uniform_step_is_laid_out_padded_and_replayed_at_its_graph(held: bool) -> None:
    policy = SizePolicy(max_num_seqs=64, max_num_tokens=64)
    batch, buf = _batch(policy)
    layout = batch.prepare(_step({"a": K, "b": K, "c": K}), buf)
    q = K + 1
    assert (layout.uniform_query_len, layout.num_tokens, layout.bucket_seqs) == (q, 12, 4)
    assert layout.bucket_tokens == policy.uniform_tokens_bucket(4, q) == 16
    plan = _plan(layout, buf, policy, {(4, q)} if held else {(4, 2)})
    if not held:  # no graph of this shape: the pieces, unpadded
        assert (plan.mode, plan.graph_size, plan.pads_decode) == (StepMode.PIECEWISE, 16, False)
        return
    assert (plan.mode, plan.graph_size, plan.pads_decode) == (StepMode.SPEC_GRAPH, 4, True)
    sections = plan.staged
    buf.pad_decode(sections, 3, 3, seq_sections=True, query_len=q)
    rows = sections.arrays
    assert rows["query_start_loc"][:5].tolist() == [0, 4, 8, 12, 12]
    assert rows["seq_lens"][:4].tolist() == [PROMPT + K] * 3 + [0]
    assert rows["positions"][:12].tolist() == list(range(PROMPT - 1, PROMPT + K)) * 3
    assert (rows["slot_mapping"][12:16] == -1).all() and (rows["slot_mapping"][:12] >= 0).all()
    assert rows["input_src"][12:16].tolist() == list(range(HEAD + 12, HEAD + 16))
    assert plan.copy_end >= sections.copy_end(True, 0)  # the padding goes over


def test_a_replayed_step_gathers_its_ids_then_takes_the_drafts() -> None:
    """SpecDecodeGraphs.replay_step's inputs (the replay itself stubbed: CUDA only): each
    request's known token from the ids table, then the drafts written over the draft positions."""
    policy = SizePolicy(max_num_seqs=64, max_num_tokens=64)
    batch, buf = _batch(policy)
    layout = batch.prepare(_step({"a": K, "b": K, "c": K}), buf)
    plan = _plan(layout, buf, policy, {(4, K + 1)})
    graphs = SpecDecodeGraphs(None, [], buf, torch.zeros(4, 8, dtype=torch.int32), policy, 64,
                              [(4, K + 1)])  # fmt: skip
    replayed = []
    graphs.replay = lambda shape: replayed.append(shape) or graphs.input_ids(16)

    def write_drafts(input_ids: torch.Tensor) -> None:  # SpecWorker's, with drafts 100 + j
        input_ids.view(3, K + 1)[:, 1:] = 100 + torch.arange(K)

    ids = graphs.replay_step(plan, write_drafts)[:12].view(3, K + 1)
    assert replayed == [(4, K + 1)]
    assert ids[:, 0].tolist() == [10 * i + PROMPT for i in range(3)]  # each prompt's last token
    assert (ids[:, 1:] == 100 + torch.arange(K)).all()


def test_ragged_and_oversized_steps_keep_their_own_layout() -> None:
    policy = SizePolicy(max_num_seqs=64, max_num_tokens=64)
    batch, buf = _batch(policy)
    ragged = batch.prepare(_step({"a": K, "b": 2, "c": K}), buf)
    assert ragged.uniform_query_len == 0 and ragged.bucket_tokens == policy.step_bucket(11)
    plan = _plan(ragged, buf, policy, {(4, K + 1), (4, 3)})
    assert plan.mode is StepMode.PIECEWISE
    small = SizePolicy(max_num_seqs=8, max_num_tokens=12)  # 4 x 4 padded tokens exceed 12
    assert small.uniform_tokens_bucket(4, K + 1) == 0
