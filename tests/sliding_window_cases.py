"""The prompts and the scheduler probe shared by the end-to-end sliding-window tests (a uniformly
windowed Mistral, tests/engine/test_sliding_window_engine.py; a model mixing full and sliding
layers, tests/model/test_kv_groups_parity.py): window 32, blocks of 16, prompts several windows
long, and prompts sharing a 96-token prefix."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from tiny_hf_models import hf_greedy, random_prompts

from pagedlm import LLM, SamplingParams

T = TypeVar("T")

WINDOW, BLOCK_SIZE = 32, 16
NUM_NEW_TOKENS = 40
LONG_PROMPTS = random_prompts(6, 70, 150, seed=5)  # 2-5 windows
(_PREFIX,) = random_prompts(1, 96, 96, seed=6)
SHARED_PROMPTS = [_PREFIX + suffix for suffix in random_prompts(6, 1, 40, seed=7)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
# (scenario, async scheduling) of the parity tests, with their ids
SCENARIO_RUNS = [("chunked", True), ("prefix", False), ("preempt", True)]
SCENARIO_IDS = ["chunked-async", "prefix-sync", "preempt-async"]


def hf_references(model: torch.nn.Module) -> dict[str, list[list[int]]]:
    """transformers' greedy tokens for the long and the shared-prefix prompts."""
    return {
        "long": hf_greedy(model, LONG_PROMPTS, NUM_NEW_TOKENS),
        "shared": hf_greedy(model, SHARED_PROMPTS, NUM_NEW_TOKENS),
    }


def record_decoding(llm: LLM, measure: Callable[[object, str], T]) -> list[T]:
    """Wraps the scheduler: measure(kv_cache_manager, req_id) of each request scheduled for one
    token, every step."""
    scheduler = llm.llm_engine.engine_core.scheduler
    schedule, measured = scheduler.schedule, []

    def recording_schedule():
        output = schedule()
        kv = scheduler.kv_cache_manager
        measured.extend(
            measure(kv, req_id)
            for req_id, num_tokens in output.num_scheduled_tokens.items()
            if num_tokens == 1
        )
        return output

    scheduler.schedule = recording_schedule
    return measured
