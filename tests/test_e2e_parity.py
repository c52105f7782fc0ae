"""End to end: LLM.generate on tiny random-weight checkpoints of every family gives exactly the
tokens of transformers' greedy generate, under the scheduler's hard cases (chunked prefill with
mixed batches, preemption, prefix caching), in sync and async scheduling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_hf_models import hf_greedy, random_prompts, save_tiny_model

from pagedlm import LLM, SamplingParams

NUM_NEW_TOKENS = 32
RAGGED_PROMPTS = random_prompts(8, 1, 100, seed=0)  # lengths 1..100
SHARED_PREFIX_LEN = 48


def _shared_prefix_prompts() -> list[list[int]]:
    """Eight prompts: one 48-token prefix (three blocks of 16), ragged suffixes of 1..36."""
    (prefix,) = random_prompts(1, SHARED_PREFIX_LEN, SHARED_PREFIX_LEN, seed=1)
    return [prefix + suffix for suffix in random_prompts(8, 1, 36, seed=2)]


PROMPT_SETS = {"ragged": RAGGED_PROMPTS, "shared_prefix": _shared_prefix_prompts()}
BASE_ARGS = dict(dtype="float32", skip_tokenizer_init=True, num_gpu_blocks_override=128)
# scenario -> (prompt set, engine arguments)
SCENARIOS = {
    "default": ("ragged", {}),
    "chunked": ("ragged", dict(max_num_batched_tokens=16, enable_prefix_caching=False)),
    # 11 usable blocks of 16 tokens for 8 sequences of up to 132 tokens
    "preempt": ("ragged", dict(max_model_len=160, num_gpu_blocks_override=12)),
    "prefix": ("shared_prefix", dict(enable_prefix_caching=True, max_num_seqs=4)),
}
# Every family runs the default settings and at least one hard scenario; every hard scenario
# runs on two families, once sync and once async (CPU time matters: ten engine runs, six
# transformers references).
CASES = [
    pytest.param(family, scenario, mode == "async", id=f"{family}-{scenario}-{mode}")
    for family, scenario, mode in [
        ("llama", "default", "sync"),
        ("mistral", "default", "async"),
        ("qwen2", "default", "sync"),
        ("qwen3", "default", "async"),
        ("llama", "chunked", "async"),
        ("mistral", "chunked", "sync"),  # window + chunks
        ("llama", "preempt", "sync"),
        ("qwen2", "preempt", "async"),
        ("qwen3", "prefix", "sync"),
        ("mistral", "prefix", "async"),
    ]
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)


class _Reference:
    """Tiny checkpoints and their transformers greedy outputs, built on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models: dict[str, torch.nn.Module] = {}
        self.outputs: dict[tuple[str, str], list[list[int]]] = {}

    def folder(self, family: str) -> Path:
        if family not in self.models:
            self.models[family] = save_tiny_model(self.root / family, family)
        return self.root / family

    def greedy(self, family: str, prompt_set: str) -> list[list[int]]:
        key = (family, prompt_set)
        if key not in self.outputs:
            self.folder(family)
            self.outputs[key] = hf_greedy(
                self.models[family], PROMPT_SETS[prompt_set], NUM_NEW_TOKENS
            )
        return self.outputs[key]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> _Reference:
    return _Reference(tmp_path_factory.mktemp("e2e_models"))


@pytest.mark.parametrize("family, scenario, async_scheduling", CASES)
def test_greedy_tokens_match_transformers(
    reference: _Reference, family: str, scenario: str, async_scheduling: bool
) -> None:
    prompt_set, engine_args = SCENARIOS[scenario]
    expected = reference.greedy(family, prompt_set)
    llm = LLM(
        str(reference.folder(family)),
        **{**BASE_ARGS, **engine_args},
        async_scheduling=async_scheduling,
    )
    if (
        scenario == "preempt"
    ):  # admission by the prompt alone (no growth reserve): the pool runs out
        llm.llm_engine.engine_core.scheduler.growth.enabled = False
    outputs = llm.generate(PROMPT_SETS[prompt_set], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    stats = llm.get_stats()
    if scenario == "preempt":
        assert stats.num_preemptions > 0
    if scenario == "prefix":
        assert stats.prefix_cache_hits > 0
        assert max(o.num_cached_tokens for o in outputs) >= SHARED_PREFIX_LEN


def test_seeded_sampling_is_identical_sync_and_async(reference: _Reference) -> None:
    """Random sampling, chunked prefill: async scheduling changes nothing."""
    params = [
        SamplingParams(temperature=0.8, top_k=50, seed=i, max_tokens=16, ignore_eos=True)
        for i in range(len(RAGGED_PROMPTS))
    ]
    results = []
    for async_scheduling in (False, True):
        llm = LLM(
            str(reference.folder("llama")),
            **BASE_ARGS,
            max_num_batched_tokens=24,
            async_scheduling=async_scheduling,
        )
        outputs = llm.generate(RAGGED_PROMPTS, params, use_tqdm=False)
        results.append([o.outputs[0].token_ids for o in outputs])
    assert results[0] == results[1]
    greedy = [tokens[:16] for tokens in reference.greedy("llama", "ragged")]
    assert results[0] != greedy  # it really sampled
