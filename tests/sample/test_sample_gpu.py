"""On CUDA: steady-state sampling steps never sync the host, and CPU and GPU agree."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pagedlm.sample import SamplingState
from pagedlm.sample.noise import mix64_
from pagedlm.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu

VOCAB_SIZE = 32000
NUM_ROWS = 48


def mixed_params(rng: random.Random) -> SamplingParams:
    return rng.choice(
        [
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.8, top_p=0.9, seed=rng.randrange(1000)),
            SamplingParams(temperature=1.2, top_k=40, min_p=0.05),
            SamplingParams(
                temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.4, logprobs=5
            ),
            SamplingParams(
                temperature=0.7, logit_bias={11: 3.0, 12: -2.0}, min_tokens=6, stop_token_ids=[13]
            ),
            SamplingParams(
                temperature=0.0, allowed_token_ids=list(range(100, 300)), presence_penalty=1.0
            ),
        ]
    )


def build(device: str) -> SamplingState:
    rng = random.Random(0)
    state = SamplingState(NUM_ROWS, VOCAB_SIZE, device, seed=0)
    for row in range(NUM_ROWS):
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(20)]
        state.add_request(row, mixed_params(rng), prompt, [], eos_token_ids=[2])
    return state


def step_logits(step: int, num_rows: int) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB_SIZE, generator=torch.Generator().manual_seed(step)) * 3


def test_steady_state_steps_do_not_sync() -> None:
    state = build("cuda")
    rows_np = np.arange(NUM_ROWS, dtype=np.int32)
    logits_gpu = [step_logits(step, NUM_ROWS).cuda() for step in range(6)]
    for step in range(2):  # warm-up: allocator pools, pinned blocks
        state.sample(logits_gpu[step].clone(), rows_np)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(2, 6):
            out = state.sample(logits_gpu[step].clone(), rows_np)
            state.remove_request(step)  # rows change hands between steps, penalised ones too
            state.add_request(
                step,
                SamplingParams(temperature=0.9, repetition_penalty=1.2, logprobs=3),
                [5, 6, 7],
                [8],
            )
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert out.sampled_token_ids.shape == (NUM_ROWS,) and out.logprobs is not None


def test_hash_is_bitwise_equal_on_gpu() -> None:
    values = torch.randint(-(2**63), 2**63 - 1, (10000,), dtype=torch.int64)
    assert torch.equal(mix64_(values.cuda()).cpu(), mix64_(values.clone()))


def test_cpu_and_gpu_draw_the_same_tokens() -> None:
    cpu, gpu = build("cpu"), build("cuda")
    rows_np = np.random.default_rng(0).permutation(NUM_ROWS).astype(np.int32)
    num_same = 0
    for step in range(4):
        logits = step_logits(step, NUM_ROWS)
        tokens_cpu = cpu.sample(logits.clone(), rows_np).sampled_token_ids
        tokens_gpu = gpu.sample(logits.cuda(), rows_np).sampled_token_ids.cpu()
        num_same += int((tokens_cpu == tokens_gpu).sum())
    assert num_same >= 0.95 * 4 * NUM_ROWS
