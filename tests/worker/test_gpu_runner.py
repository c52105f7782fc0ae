"""The runner on CUDA: pinned staging, the step events; greedy tokens equal
transformers' in sync and async mode; steady-state steps make no host-device sync; the KV-cache
size comes from a profile run."""

from __future__ import annotations

import logging

import pytest
import torch
from worker_helpers import (
    HEAD_DIM,
    NUM_KV_HEADS,
    NUM_LAYERS,
    MiniScheduler,
    Req,
    hf_greedy,
    make_config,
    make_runner,
    random_prompt,
    run_requests,
)

from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.model_runner import ModelRunner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("async_mode", [False, True])
def test_greedy_equals_transformers_on_cuda(tiny, async_mode):
    folder, hf_model = tiny
    runner = make_runner(
        make_config(folder, max_num_batched_tokens=12, device="cuda", attention_backend="auto")
    )
    assert runner._staging[0].flat.is_pinned() and runner._sampled_cpu[0].is_pinned()
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=12)
    specs = {"a": (5, 6), "b": (19, 4), "c": (9, 7)}
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        sched.add(Req(req_id, random_prompt(num_prompt, i), max_tokens))
    done = run_requests(runner, sched, async_mode)
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        assert done[req_id] == hf_greedy(hf_model, max_tokens, random_prompt(num_prompt, i)), req_id


def test_steady_state_steps_make_no_sync(tiny):
    """Async decode steps (one greedy, one random with top-k/top-p and logprobs): execute_model
    under sync debug mode "error"; get_output waits on its event only."""
    folder, _ = tiny
    runner = make_runner(
        make_config(folder, max_num_batched_tokens=32, device="cuda", attention_backend="auto")
    )
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=32)
    sched.add(Req("greedy", random_prompt(9, 1), 30))
    sched.add(
        Req(
            "random",
            random_prompt(5, 2),
            30,
            SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=3, logprobs=2),
        )
    )
    torch.cuda.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError):  # the mode does catch a sync here
        torch.ones(1, device="cuda").item()
    torch.cuda.set_sync_debug_mode("default")
    pending = None
    for step in range(12):
        steady = step >= 4
        torch.cuda.set_sync_debug_mode("error" if steady else "default")
        try:
            output = runner.execute_model(sched.schedule())
            output, pending = pending, output
            if output is not None:
                sched.update(output.get_output())
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sched.update(pending.get_output())
    assert all(len(r.outputs) == 12 for r in sched.running)


def test_profile_sizes_the_kv_cache(tiny, caplog):
    folder, _ = tiny
    config = make_config(
        folder,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        num_blocks=None,
        device="cuda",
        attention_backend="auto",
        gpu_memory_utilization=0.5,
    )
    runner = ModelRunner(config)
    runner.load_model()
    with caplog.at_level(logging.INFO, logger="pagedlm"):
        num_blocks = runner.determine_num_blocks()
    assert "peak activation" in caplog.text and "non-torch" in caplog.text
    total = torch.cuda.mem_get_info()[1]
    per_block = NUM_LAYERS * 2 * 8 * NUM_KV_HEADS * HEAD_DIM * 4  # K and V of 8 tokens, fp32
    assert 0 < num_blocks * per_block < 0.5 * total
    assert num_blocks * per_block > 0.3 * total  # a tiny model leaves most of the budget to KV
    assert runner.input_batch.num_reqs == 0 and runner.kv_caches == []
