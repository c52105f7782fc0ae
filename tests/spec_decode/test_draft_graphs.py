"""The host half of the draft model's CUDA graphs (spec_decode/draft_graphs.py): the shapes
captured, and on the CPU the graphs' bodies over their static buffers (run without a capture),
padding rows included, against the eager proposer on NaN-poisoned caches. The replays
themselves: tests/gpu/test_draft_model_gpu.py."""

from __future__ import annotations

import functools
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_hf_models import random_prompts

from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.sampler import RandomParams
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.spec_decode.draft_graph_inputs import FirstForwardBuffers, SingleStepBuffers
from pagedlm.spec_decode.draft_graphs import (
    DraftGraphs,
    Shape,
    draft_graph_shapes,
    single_step_sizes,
)
from pagedlm.spec_decode.draft_model import DraftModelProposer
from pagedlm.worker.sizes import SizePolicy, capture_sizes
from spec_decode.test_draft_model import Chunk, K, spec_args, verified_step

NUM_COLS = 8
# the tests' graphs: single steps of 1, 2 and 4 rows; first forwards of 2 and 4 sequences, r
# rows each: 5 (3 drafts verified), 2 (none)
SHAPES = [(1, 1), (2, 1), (4, 1), (2, 2), (2, 5), (4, 2), (4, 5)]
KS = (K, K, 2, K)  # the steps' k


def _spec(**extra) -> SpeculativeConfig:
    return SpeculativeConfig.from_user(
        {"method": "draft_model", "model": "m", "num_speculative_tokens": K, **extra}
    )


def test_single_step_sizes_follow_the_batch_sizes_that_take_single_steps() -> None:
    sizes = capture_sizes(128, 2048)  # 1, 2, 4, 8, 16, ..., 128
    # the default: k up to batch 32, 2 up to 64 (one single step), plain above
    assert single_step_sizes(_spec(), 128, sizes) == [s for s in sizes if s <= 64]
    ranged = _spec(num_speculative_tokens_per_batch_size=[[1, 5, 3], [6, 128, 1]])
    assert single_step_sizes(ranged, 128, sizes) == [1, 2, 4, 8]  # 8 holds 5 requests
    single = _spec(num_speculative_tokens_per_batch_size=[[1, 1, 1], [2, 128, 0]])
    assert single_step_sizes(single, 128, sizes) == []  # no batch takes a single step
    # a batch of 40 sequences (k 2) may have 2 sampling requests: every size up to 40's graph
    assert single_step_sizes(_spec(), 40, capture_sizes(40, 2048))[-1] == 40


def test_first_forward_shapes_follow_the_uniform_target_steps() -> None:
    policy = SizePolicy(max_num_seqs=64, max_num_tokens=96)
    shapes = draft_graph_shapes(_spec(), 64, policy)
    single = [(s, 1) for s in policy.capture_sizes]  # every size drafts k >= 2
    assert shapes[: len(single)] == single
    first = shapes[len(single) :]
    # r = q + 1 for the target's uniform (S, q), q in 2..1 + k within 96 tokens; and r = 2
    assert (1, 2) in first and (1, K + 2) in first and (32, 4) in first and (32, 5) not in first
    assert (48, 3) in first and (64, 2) in first and (56, 3) not in first  # 56 x 2 > 96
    assert first == sorted(first) and all(r >= 2 for _, r in first)
    plain = _spec(num_speculative_tokens_per_batch_size=[[1, 64, 0]])
    assert draft_graph_shapes(plain, 64, policy) == []


def two_request_steps(prompts: list[list[int]]) -> list[list[Chunk]]:
    """Two requests: their prompts (ragged), then verify steps of 3 drafts each."""
    p0, p1 = prompts
    return [
        [Chunk(0, p0, 0, 5), Chunk(1, p1, 0, 9)],
        [
            Chunk(0, [5, 70, 71, 72], len(p0), 17, num_drafts=3, num_rejected=2),
            Chunk(1, [9, 80, 81, 82], len(p1), 33, num_drafts=3),
        ],
        [
            Chunk(0, [17, 90, 91, 92], len(p0) + 2, 41, num_drafts=3, num_rejected=1),
            Chunk(1, [33, 60, 61, 62], len(p1) + 4, 58, num_drafts=3, num_rejected=3),
        ],
        [Chunk(0, [41], len(p0) + 5, 7), Chunk(1, [58], len(p1) + 5, 8)],  # no drafts
    ]


def three_request_steps(prompts: list[list[int]]) -> list[list[Chunk]]:
    """Three sampling requests (graphs of 4 sequences: one padding sequence): their prompts,
    then uniform verify steps (3 drafts each, some rejected), then one without drafts."""
    p0, p1, p2 = prompts
    return [
        [Chunk(0, p0, 0, 5), Chunk(1, p1, 0, 9), Chunk(2, p2, 0, 11)],
        [
            Chunk(0, [5, 70, 71, 72], len(p0), 17, num_drafts=3, num_rejected=2),
            Chunk(1, [9, 80, 81, 82], len(p1), 33, num_drafts=3),
            Chunk(2, [11, 40, 41, 42], len(p2), 44, num_drafts=3, num_rejected=3),
        ],
        [
            Chunk(0, [17, 90, 91, 92], len(p0) + 2, 41, num_drafts=3, num_rejected=1),
            Chunk(1, [33, 60, 61, 62], len(p1) + 4, 58, num_drafts=3, num_rejected=3),
            Chunk(2, [44, 50, 51, 52], len(p2) + 1, 21, num_drafts=3),
        ],
        [
            Chunk(0, [41], len(p0) + 5, 7),
            Chunk(1, [58], len(p1) + 5, 8),
            Chunk(2, [21], len(p2) + 5, 9),
        ],
    ]


def request_steps(num_requests: int, prompts: list[list[int]]) -> list[list[Chunk]]:
    return two_request_steps(prompts) if num_requests == 2 else three_request_steps(prompts)


def expected_replays(num_requests: int) -> list[Shape]:
    """The graphs request_steps' steps replay with SHAPES at KS: the prompts' first forward
    eagerly (ragged), the uniform ones' (5 rows a request, then 2) on their graph; each single
    step on the graph of its rows."""
    size = 2 if num_requests == 2 else 4
    first = [None, (size, 5), (size, 5), (size, 2)]
    return [
        shape
        for head, k in zip(first, KS, strict=True)
        for shape in ([head] if head else []) + [(size, 1)] * (k - 1)
    ]


def _poisoned(models, **spec) -> DraftModelProposer:
    target, draft, *_ = models
    proposer = DraftModelProposer(spec_args(target, draft, **spec).create_engine_config())
    proposer.load_model()
    proposer.allocate_kv_cache(64)
    for cache in proposer.kv_caches:
        cache.fill_(float("nan"))
    return proposer


def _uncaptured(proposer: DraftModelProposer) -> tuple[DraftGraphs, list[Shape]]:
    """The proposer's graphs of SHAPES on the CPU, never captured: a replay runs the body a
    capture records (DraftGraphs.run) over the static buffers; and the shapes replayed,
    appended."""
    graphs = proposer.new_graphs(proposer.kv_caches, SHAPES)
    graphs._graphs = {
        shape: SimpleNamespace(replay=functools.partial(graphs.run, shape)) for shape in SHAPES
    }
    return graphs, count_draft_replays(graphs)


def count_draft_replays(graphs: DraftGraphs) -> list[Shape]:
    """The shapes the draft's graphs replay from now on, appended."""
    replays, replay = [], graphs.replay

    def counted(shape: Shape) -> torch.Tensor | None:
        replays.append(shape)
        return replay(shape)

    graphs.replay = counted
    return replays


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
@pytest.mark.parametrize("num_requests", [2, 3], ids=["unpadded", "padded"])
def test_the_graph_body_drafts_as_the_eager_proposer(models, method: str, num_requests: int):
    """The same steps (ragged, then uniform; k 3, 3, 2, 3) through the eager proposer and one
    that runs the graphs' bodies of SHAPES (3 requests: a padding sequence): the same drafts
    and q, and the same KV written (NaN where none was: padding rows write none), no NaN of
    an unwritten slot read."""
    eager = _poisoned(models, draft_sample_method=method)
    bodied = _poisoned(models, draft_sample_method=method)
    graphs, replays = _uncaptured(bodied)
    prompts = random_prompts(num_requests, 6, 14, seed=3)
    table = torch.arange(1, 1 + num_requests * NUM_COLS, dtype=torch.int32)
    table = table.view(num_requests, NUM_COLS)
    rows = np.arange(num_requests, dtype=np.uint64)
    params = RandomParams(
        noise_keys=torch.from_numpy(row_keys_np(rows, np.zeros(num_requests))),
        temperature=torch.linspace(0.7, 1.3, num_requests),
    )
    for proposer in (eager, bodied):
        for row, prompt in enumerate(prompts):
            proposer.add_request(row, prompt)
    steps = request_steps(num_requests, prompts)
    for i, (chunks, k) in enumerate(zip(steps, KS, strict=True)):
        step = replace(verified_step(chunks, table), sampling=params)
        expected = eager.propose(step, k)
        drafts = bodied.propose(replace(step, graphs=graphs), k)
        assert torch.equal(drafts.token_ids, expected.token_ids), f"step {i}"
        assert torch.equal(drafts.num_drafts, expected.num_drafts), f"step {i}"
        if method == "probabilistic":
            torch.testing.assert_close(drafts.probs, expected.probs)
        assert not expected.token_ids.eq(-1).any() or k < K
        for got, want in zip(bodied.kv_caches, eager.kv_caches, strict=True):  # NaN: unwritten
            torch.testing.assert_close(got, want, equal_nan=True)
    assert replays == expected_replays(num_requests), replays


def test_a_smaller_proposal_pads_the_rows_a_larger_one_loaded() -> None:
    """The buffers after a proposal of 3 rows, then of 2 (of 5 rows a request, then 2): rows
    past the second's hold no column, have seq_len 0 and no query; its first forward's tokens
    past its own write no KV."""
    table = torch.zeros(4, 3, dtype=torch.int32)
    single, first = SingleStepBuffers(4, table, 64), FirstForwardBuffers(4, 20, table)
    for num_rows, query_len in ((3, 5), (2, 2)):
        held = torch.full((num_rows,), 2, dtype=torch.int64)
        positions = torch.arange(num_rows, dtype=torch.int64)
        single.load(SimpleNamespace(first_positions=positions, cols_held=held))
        num_tokens = num_rows * query_len
        rows = torch.arange(num_tokens)
        meta = SimpleNamespace(
            num_seqs=num_rows,
            num_tokens=num_tokens,
            max_query_len=query_len,
            slot_mapping=rows + 8,
            query_start_loc=torch.arange(num_rows + 1, dtype=torch.int32) * query_len,
            seq_lens=torch.full((num_rows,), 9, dtype=torch.int32),
            block_table=torch.ones(num_rows, 2, dtype=torch.int32),
        )
        logits_rows = torch.arange(num_rows) * query_len
        first.load(
            SimpleNamespace(input_ids=rows, positions=rows, meta=meta, logits_rows=logits_rows)
        )
    batch = single.batch(torch.zeros(4, dtype=torch.int64), block_size=8)
    assert batch.cols_held.tolist() == [2, 2, 0, 0]
    assert batch.meta.query_start_loc.tolist() == [0, 1, 2, 2, 2]
    assert batch.meta.seq_lens.tolist() == [2, 3, 0, 0] and batch.meta.slot_mapping[2:].eq(-1).all()
    _, _, meta, logits_rows = first.inputs(4, 5, 64)
    assert meta.slot_mapping[4:].eq(-1).all() and meta.slot_mapping[:4].tolist() == [8, 9, 10, 11]
    assert meta.query_start_loc.tolist() == [0, 2, 4, 4, 4] and meta.seq_lens.tolist() == [
        9,
        9,
        0,
        0,
    ]
    assert logits_rows.tolist() == [0, 2, 0, 0]
