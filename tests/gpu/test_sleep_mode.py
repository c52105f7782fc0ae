"""Sleep mode and shutdown on the GPU (bf16, CUDA graphs on): sleep frees at least 90% of the
weights' and KV cache's bytes by torch.cuda.mem_get_info, and after wake-up the graphs replay to
the same greedy tokens (level 1; level 2 after reload_weights): by default the very graphs
captured at start-up (the cuMem pools keep the addresses), with PAGEDLM_SLEEP_KEEP_ADDRESSES=0
graphs captured again; a draft model's graphs follow the target's. Three engines built and
destroyed leave torch.cuda.memory_allocated where it started."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from spec_decode.test_draft_graphs import count_draft_replays
from tiny_hf_models import random_prompts

from pagedlm import LLM, SamplingParams
from pagedlm.worker import cumem

pytestmark = pytest.mark.gpu

ENGINE = dict(
    skip_tokenizer_init=True,
    max_model_len=512,
    max_num_seqs=32,
    kv_cache_memory_gib=4.0,  # what sleep must give back, mostly
    enable_sleep_mode=True,
    graph_size_timing=False,
)
PROMPTS = random_prompts(6, 2, 48, seed=5)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
COUNTER_SLACK = 1 << 20  # pagedlm/ops/counters.py keeps one 256 KiB buffer per device for good


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(params=[True, False], ids=["keep_addresses", "recapture"])
def keep_addresses(request, monkeypatch) -> bool:
    monkeypatch.setenv("PAGEDLM_SLEEP_KEEP_ADDRESSES", "1" if request.param else "0")
    cumem.process_allocator.cache_clear()
    yield request.param
    cumem.process_allocator.cache_clear()


def test_sleep_frees_the_memory_and_graphs_replay_after_wake(checkpoints, keep_addresses) -> None:
    folder = checkpoints["llama"][0]
    llm = LLM(str(folder), **ENGINE)
    runner = llm.llm_engine.engine_core.model_runner
    assert runner.pools.keeps_addresses == keep_addresses
    before = greedy(llm)
    (footprint,) = llm.collective_rpc("memory_footprint")
    held = footprint["weights_bytes"] + footprint["kv_cache_bytes"]
    for level in (1, 2):
        # weak: the graphs hold the KV cache they were captured on, so a strong reference here
        # would keep the re-capture path's memory from going back
        graphs, piecewise = weakref.ref(runner.graphs), weakref.ref(runner.piecewise)
        free_awake = free_bytes()
        llm.sleep(level=level)
        freed = free_bytes() - free_awake
        assert freed >= 0.9 * held, (level, freed, held)
        assert (runner.graphs is not None and runner.graphs is graphs()) == keep_addresses
        if level == 2:
            llm.wake_up(["weights"])
            llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        llm.wake_up()
        assert runner.graphs is not None and runner.piecewise is not None
        if keep_addresses:  # no capture since start-up
            assert runner.graphs is graphs() and runner.piecewise is piecewise()
        assert greedy(llm) == before, level
    llm.shutdown()


def test_three_engines_leave_no_device_memory(checkpoints) -> None:
    folder = checkpoints["llama"][0]
    gc.collect()
    torch.cuda.empty_cache()
    allocated, free_after = torch.cuda.memory_allocated(), []
    for index in range(3):
        llm = LLM(str(folder), **ENGINE)
        assert greedy(llm)
        assert torch.cuda.memory_allocated() - allocated > 3 << 30  # the KV cache is there
        if index == 0:
            llm.shutdown()
        del llm  # the others: dropped only
        assert torch.cuda.memory_allocated() - allocated <= COUNTER_SLACK, index
        free_after.append(free_bytes())
    # the driver's view, past what the first engine loaded for good (kernels, cuBLAS's handle)
    assert free_after[0] - free_after[2] < 16 << 20, free_after


def test_the_draft_graphs_follow_the_targets_over_sleep(checkpoints, keep_addresses) -> None:
    """A draft model (the target itself, k = 3): asleep, its weights and KV cache are released
    with the target's; after wake-up the draft's graphs are those of start-up (kept addresses) or, as the target's, captured again, over the
    draft's KV cache then in use, and they replay to the same greedy tokens."""
    folder = checkpoints["llama"][0]
    spec = {"method": "draft_model", "model": str(folder), "num_speculative_tokens": 3}
    llm = LLM(str(folder), speculative_config=spec, **ENGINE)
    runner = llm.llm_engine.engine_core.model_runner
    before = greedy(llm)
    draft_graphs = weakref.ref(runner.graphs.draft)  # weak: as the target's (above)
    llm.sleep(level=1)
    assert (runner.graphs is not None and runner.graphs.draft is draft_graphs()) == keep_addresses
    footprint = llm.collective_rpc("memory_footprint")[0]  # the draft's weights and KV included
    assert footprint["weights_bytes"] == 0 and footprint["kv_cache_bytes"] == 0, footprint
    llm.wake_up()
    graphs = runner.graphs.draft
    assert (graphs is draft_graphs()) == keep_addresses
    assert graphs._kv_caches is runner.draft_model().kv_caches
    replays = count_draft_replays(graphs)
    assert greedy(llm) == before and replays
    llm.shutdown()
