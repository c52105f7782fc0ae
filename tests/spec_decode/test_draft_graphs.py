"""The host half of the draft model's single-step CUDA graphs (spec_decode/draft_graphs.py): the
sizes kept, and on the CPU the graphs' body over their static buffers (run without a capture),
padding rows included, against the eager proposer on NaN-poisoned caches. The replays
themselves: tests/gpu/test_draft_model_gpu.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from tiny_hf_models import random_prompts

from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.sampler import RandomParams
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.spec_decode.draft_graphs import DraftGraphs, draft_graph_sizes
from pagedlm.spec_decode.draft_model import DraftModelProposer
from pagedlm.worker.sizes import capture_sizes
from spec_decode.test_draft_model import Chunk, K, spec_args, verified_step

NUM_COLS = 8


def _spec(**extra) -> SpeculativeConfig:
    return SpeculativeConfig.from_user(
        {"method": "draft_model", "model": "m", "num_speculative_tokens": K, **extra}
    )


def test_sizes_follow_the_batch_sizes_that_take_single_steps() -> None:
    sizes = capture_sizes(128, 2048)  # 1, 2, 4, 8, 16, ..., 128
    # the default: k up to batch 32, 2 up to 64 (one single step), plain above
    assert draft_graph_sizes(_spec(), 128, sizes) == [s for s in sizes if s <= 64]
    ranged = _spec(num_speculative_tokens_per_batch_size=[[1, 5, 3], [6, 128, 1]])
    assert draft_graph_sizes(ranged, 128, sizes) == [1, 2, 4, 8]  # 8 holds 5 requests
    single = _spec(num_speculative_tokens_per_batch_size=[[1, 1, 1], [2, 128, 0]])
    assert draft_graph_sizes(single, 128, sizes) == []  # no batch takes a single step
    # a batch of 40 sequences (k 2) may have 2 sampling requests: every size up to 40's graph
    assert draft_graph_sizes(_spec(), 40, capture_sizes(40, 2048))[-1] == 40


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
    ]


def three_request_steps(prompts: list[list[int]]) -> list[list[Chunk]]:
    """Three sampling requests (a graph of 4 rows: one padding row): their prompts, then
    uniform verify steps (3 drafts each, some rejected)."""
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
    ]


def request_steps(num_requests: int, prompts: list[list[int]]) -> list[list[Chunk]]:
    return two_request_steps(prompts) if num_requests == 2 else three_request_steps(prompts)


def _poisoned(models, **spec) -> DraftModelProposer:
    target, draft, *_ = models
    proposer = DraftModelProposer(spec_args(target, draft, **spec).create_engine_config())
    proposer.load_model()
    proposer.allocate_kv_cache(64)
    for cache in proposer.kv_caches:
        cache.fill_(float("nan"))
    return proposer


def _uncaptured(proposer: DraftModelProposer, sizes: list[int]) -> tuple[DraftGraphs, list[int]]:
    """The proposer's graphs on the CPU, never captured: a replay runs the body a capture
    records (DraftGraphs._run) over the static buffers; and the sizes replayed, appended."""
    graphs = proposer.new_graphs(proposer.kv_caches, sizes)
    replays = []

    def run_body(size: int) -> torch.Tensor | None:
        replays.append(size)
        graphs._run(size)
        return graphs._logits.get(size)

    graphs.replay = run_body
    return graphs, replays


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
@pytest.mark.parametrize("num_requests", [2, 3], ids=["unpadded", "padded"])
def test_the_graph_body_drafts_as_the_eager_proposer(models, method: str, num_requests: int):
    """The same steps (ragged, then uniform; k 3, 3, then 2) through the eager proposer and one
    whose single steps run the graphs' body at sizes 1, 2, 4 (3 requests: a padding row): the
    same drafts and q, no NaN of an unwritten slot read (padding rows read and write no KV)."""
    eager = _poisoned(models, draft_sample_method=method)
    bodied = _poisoned(models, draft_sample_method=method)
    graphs, replays = _uncaptured(bodied, [1, 2, 4])
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
    for i, (chunks, k) in enumerate(zip(steps, (K, K, 2), strict=True)):
        step = replace(verified_step(chunks, table), sampling=params)
        expected = eager.propose(step, k)
        drafts = bodied.propose(replace(step, graphs=graphs), k)
        assert torch.equal(drafts.token_ids, expected.token_ids), f"step {i}"
        assert torch.equal(drafts.num_drafts, expected.num_drafts), f"step {i}"
        if method == "probabilistic":
            torch.testing.assert_close(drafts.probs, expected.probs)
        assert not expected.token_ids.eq(-1).any() or k < K
    size = 2 if num_requests == 2 else 4
    assert replays == [size] * (2 * (K - 1) + 1), replays
