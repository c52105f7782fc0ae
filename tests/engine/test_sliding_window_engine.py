"""End to end with sliding-window KV freeing: a tiny Mistral (window 32, blocks of 16) on prompts
several windows long gives exactly transformers' greedy tokens with chunked prefill, prefix hits
and preemption, while each decoding request holds at most W / B + 2 blocks. Models mixing full and
sliding layers: tests/model/test_kv_groups_parity.py."""

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

from pagedlm import LLM

BASE_ARGS = dict(dtype="float32", skip_tokenizer_init=True, block_size=BLOCK_SIZE, device="cpu")
# scenario -> (prompts, engine arguments)
SCENARIOS = {
    "chunked": (LONG_PROMPTS, dict(max_num_batched_tokens=24, num_gpu_blocks_override=64)),
    "prefix": (
        SHARED_PROMPTS,
        dict(enable_prefix_caching=True, max_num_seqs=2, num_gpu_blocks_override=64),
    ),
    # 13 usable blocks (the cache holds max_model_len - 1 tokens): decodes are capped at 3 blocks,
    # so it is prefill chunks growing beside them that run the pool out
    "preempt": (
        LONG_PROMPTS,
        dict(max_model_len=208, num_gpu_blocks_override=14, max_num_batched_tokens=32),
    ),
}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("mistral_w32")
    model = save_tiny_model(folder, "mistral", config_overrides={"sliding_window": WINDOW})
    return folder, model


@pytest.fixture(scope="module")
def mistral_reference(mistral) -> dict[str, list[list[int]]]:
    return hf_references(mistral[1])


@pytest.mark.parametrize("scenario, async_scheduling", SCENARIO_RUNS, ids=SCENARIO_IDS)
def test_mistral_window_freeing_matches_transformers(
    mistral, mistral_reference, scenario: str, async_scheduling: bool
) -> None:
    prompts, engine_args = SCENARIOS[scenario]
    llm = LLM(str(mistral[0]), **BASE_ARGS, **engine_args, async_scheduling=async_scheduling)
    scheduler = llm.llm_engine.engine_core.scheduler
    assert scheduler.kv_cache_manager.sliding_window == WINDOW
    if scenario == "preempt":  # admission by the prompt alone: the pool runs out
        scheduler.growth.enabled = False
    held = record_decoding(llm, lambda kv, req_id: kv.num_held_blocks(req_id))
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    want = mistral_reference["shared" if scenario == "prefix" else "long"]
    assert [o.outputs[0].token_ids for o in outputs] == want
    assert len(held) >= len(prompts) * (NUM_NEW_TOKENS - 2)
    assert max(held) <= WINDOW // BLOCK_SIZE + 2
    stats = llm.get_stats()
    if scenario == "prefix":
        assert max(o.num_cached_tokens for o in outputs) >= 80
    if scenario == "preempt":
        assert stats.num_preemptions > 0


def test_freeing_can_be_switched_off_for_a_b_runs(mistral, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLM_FREE_SLIDING_WINDOW", "0")
    llm = LLM(str(mistral[0]), **BASE_ARGS, num_gpu_blocks_override=64)
    assert llm.llm_engine.engine_core.scheduler.kv_cache_manager.sliding_window is None
