"""End to end with KV cache groups (core/kv_groups.py): a tiny Qwen2 of one full and three
sliding layers (window 32, blocks of 16) runs four groups, each layer reading and writing through
its own group's block table in a KV tensor shared with the other groups' layers; it gives exactly
transformers' greedy tokens with chunked prefill, prefix hits and preemption, while the sliding
groups free the blocks below their window and the full group keeps every block."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sliding_window_cases import (
    BLOCK_SIZE,
    GREEDY,
    LONG_PROMPTS,
    NUM_NEW_TOKENS,
    SCENARIO_IDS,
    SCENARIO_RUNS,
    SHARED_PROMPTS,
    WINDOW,
    hf_references,
    record_decoding,
)
from tiny_hf_models import save_tiny_model

from pagedlm import LLM, SamplingParams
from pagedlm.core.kv_groups import HybridKVCacheManager
from pagedlm.worker.memory import kv_cache_bytes_per_block, pool_bytes_per_block

LAYER_TYPES = ["full_attention"] + ["sliding_attention"] * 3
BASE_ARGS = dict(
    dtype="float32",
    skip_tokenizer_init=True,
    block_size=BLOCK_SIZE,
    device="cpu",
    max_model_len=208,
)
# scenario -> (prompts, engine arguments); 4 groups: a request's token costs 4 blocks at most
SCENARIOS = {
    "chunked": (LONG_PROMPTS, dict(max_num_batched_tokens=24, num_gpu_blocks_override=160)),
    "prefix": (
        SHARED_PROMPTS,
        dict(enable_prefix_caching=True, max_num_seqs=2, num_gpu_blocks_override=160),
    ),
    # 52 usable blocks, the least that holds one max_model_len request in every group
    "preempt": (LONG_PROMPTS, dict(num_gpu_blocks_override=53, max_num_batched_tokens=32)),
}


@pytest.fixture(scope="module")
def mixed_qwen2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen2_mixed")
    overrides = dict(
        num_hidden_layers=len(LAYER_TYPES),
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,
        layer_types=LAYER_TYPES,
    )
    return folder, save_tiny_model(folder, "qwen2", config_overrides=overrides)


@pytest.fixture(scope="module")
def reference(mixed_qwen2) -> dict[str, list[list[int]]]:
    return hf_references(mixed_qwen2[1])


def held_per_group(kv: HybridKVCacheManager, req_id: str) -> tuple[int, int]:
    """(the full group's, a sliding group's) blocks of a request."""
    full, sliding = kv.groups[:2]
    return full.num_held_blocks(req_id), sliding.num_held_blocks(req_id)


@pytest.mark.parametrize("scenario, async_scheduling", SCENARIO_RUNS, ids=SCENARIO_IDS)
def test_groups_match_transformers(
    mixed_qwen2, reference, scenario: str, async_scheduling: bool
) -> None:
    prompts, engine_args = SCENARIOS[scenario]
    llm = LLM(str(mixed_qwen2[0]), **BASE_ARGS, **engine_args, async_scheduling=async_scheduling)
    scheduler = llm.llm_engine.engine_core.scheduler
    kv = scheduler.kv_cache_manager
    assert isinstance(kv, HybridKVCacheManager) and kv.group_windows == (None,) + (WINDOW,) * 3
    runner = llm.llm_engine.engine_core.model_runner
    assert len({id(cache) for cache in runner.kv_caches}) == 1  # one tensor, 4 layers
    if scenario == "preempt":  # admission by the prompt alone: the pool runs out
        scheduler.growth.enabled = False
    held = record_decoding(llm, held_per_group)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    want = reference["shared" if scenario == "prefix" else "long"]
    assert [o.outputs[0].token_ids for o in outputs] == want
    assert len(held) >= len(prompts) * (NUM_NEW_TOKENS - 2)
    assert max(sliding for _, sliding in held) <= WINDOW // BLOCK_SIZE + 2
    longest = max(map(len, prompts)) + NUM_NEW_TOKENS - 1
    assert max(full for full, _ in held) == -(-longest // BLOCK_SIZE)
    if scenario == "prefix":
        assert max(o.num_cached_tokens for o in outputs) >= 80
    if scenario == "preempt":
        assert llm.get_stats().num_preemptions > 0
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_groups_can_be_switched_off(mixed_qwen2, reference, monkeypatch) -> None:
    """PAGEDLM_FREE_SLIDING_WINDOW=0: one group keeping every block, a KV tensor per layer."""
    monkeypatch.setenv("PAGEDLM_FREE_SLIDING_WINDOW", "0")
    llm = LLM(str(mixed_qwen2[0]), **BASE_ARGS, num_gpu_blocks_override=64)
    kv = llm.llm_engine.engine_core.scheduler.kv_cache_manager
    assert not isinstance(kv, HybridKVCacheManager) and kv.sliding_window is None
    runner = llm.llm_engine.engine_core.model_runner
    assert len({id(cache) for cache in runner.kv_caches}) == len(LAYER_TYPES)
    outputs = llm.generate(LONG_PROMPTS[:2], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == reference["long"][:2]


def test_triton_reads_each_groups_table(mixed_qwen2, reference) -> None:
    """The Triton backend (TRITON_INTERPRET=1 off CUDA: tests/conftest.py) on a short case: a
    chunked prefill and decodes past the window, through the groups' tables."""
    llm = LLM(
        str(mixed_qwen2[0]),
        **BASE_ARGS,
        num_gpu_blocks_override=160,
        max_num_batched_tokens=48,
        attention_backend="triton",
    )
    assert isinstance(llm.llm_engine.engine_core.scheduler.kv_cache_manager, HybridKVCacheManager)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    (output,) = llm.generate(LONG_PROMPTS[:1], params, use_tqdm=False)
    assert output.outputs[0].token_ids == reference["long"][0][:8]


def test_a_block_costs_one_groups_layers(mixed_qwen2) -> None:
    """Group size 1 (one full layer): a block is one layer's KV; the default CPU cache gives every
    group room for max_model_len and a step, so the engine starts without an override."""
    llm = LLM(str(mixed_qwen2[0]), **BASE_ARGS)
    config = llm.llm_engine.config
    one_layer = kv_cache_bytes_per_block(config.model, BLOCK_SIZE, num_layers=1)
    assert pool_bytes_per_block(config) == one_layer
    kv = llm.llm_engine.engine_core.scheduler.kv_cache_manager
    assert kv.capacity_tokens >= config.model.max_model_len - 1
