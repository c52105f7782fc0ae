"""The draft_model proposer on CUDA (Triton attention, float32): no host sync in `propose`
(set_sync_debug_mode("error")), and the drafts of the CPU run over the same steps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from spec_decode.test_draft_model import Chunk, K, spec_args, verified_step
from tiny_hf_models import random_prompts, save_tiny_model

from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.sampler import RandomParams
from pagedlm.spec_decode.draft_model import DraftModelProposer, ModelVerifiedStep

pytestmark = pytest.mark.gpu
NUM_COLS = 8


def _proposer(target, draft, device: str, **spec) -> DraftModelProposer:
    args = replace(spec_args(target, draft, **spec), device=device)
    proposer = DraftModelProposer(args.create_engine_config())
    proposer.load_model()
    proposer.allocate_kv_cache(64)
    return proposer


def _on(step: ModelVerifiedStep, device: str, sampling: RandomParams | None) -> ModelVerifiedStep:
    meta = step.attn_metadata
    moved = replace(
        meta,
        query_start_loc=meta.query_start_loc.to(device),
        seq_lens=meta.seq_lens.to(device),
        slot_mapping=meta.slot_mapping.to(device),
        block_table=meta.block_table.to(device),
    )
    return replace(
        step,
        rows=step.rows.to(device),
        input_ids=step.input_ids.to(device),
        token_ids=step.token_ids.to(device),
        num_accepted=step.num_accepted.to(device),
        first_positions=step.first_positions.to(device),
        attn_metadata=moved,
        sampling=sampling,
    )


def _steps(prompts: list[list[int]]) -> list[list[Chunk]]:
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


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_draft_model_proposals_make_no_sync(tmp_path, method: str) -> None:
    target, draft = tmp_path / "target", tmp_path / "draft"
    save_tiny_model(target, "llama", seed=1)
    save_tiny_model(draft, "qwen3", seed=2)
    on_gpu = _proposer(target, draft, "cuda", draft_sample_method=method)
    on_cpu = _proposer(target, draft, "cpu", draft_sample_method=method)
    prompts = random_prompts(2, 6, 14, seed=3)
    table = torch.arange(1, 1 + 2 * NUM_COLS, dtype=torch.int32).view(2, NUM_COLS)
    keys = torch.from_numpy(row_keys_np(np.arange(2, dtype=np.uint64), np.zeros(2)))
    temperature = torch.tensor([0.7, 1.3])
    for proposer in (on_gpu, on_cpu):
        for row, prompt in enumerate(prompts):
            proposer.add_request(row, prompt)
    for i, chunks in enumerate(_steps(prompts)):
        step = verified_step(chunks, table)
        gpu_params = RandomParams(noise_keys=keys.cuda(), temperature=temperature.cuda())
        cpu_params = RandomParams(noise_keys=keys, temperature=temperature)
        gpu_step = _on(step, "cuda", gpu_params)
        if i == 0:  # the first call compiles and allocates
            drafts = on_gpu.propose(gpu_step)
        else:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                drafts = on_gpu.propose(gpu_step)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        expected = on_cpu.propose(_on(step, "cpu", cpu_params))
        assert torch.equal(drafts.token_ids.cpu(), expected.token_ids), f"step {i}"
        assert drafts.num_drafts.tolist() == [K, K]
        if method == "probabilistic":
            torch.testing.assert_close(drafts.probs.cpu(), expected.probs, atol=1e-5, rtol=1e-4)
