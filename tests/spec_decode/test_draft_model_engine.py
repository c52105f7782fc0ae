"""Speculative decoding with method draft_model end to end on the CPU, float32: the target as its
own draft gives plain greedy's tokens and accepts every draft; another draft (the target with noise on its weights, accepting about
a third) gives greedy tokens identical to plain decoding under chunked prefill and prefix hits,
sync and async; probabilistic drafts keep seeded random sampling batch-invariant and bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from pagedlm import LLM, SamplingParams
from spec_decode.test_spec_engine import _counters, _prompts, _tokens, cpu_llm

NOISE = 0.05  # relative to each weight's spread: about a third of the drafts accepted


@pytest.fixture(scope="module")
def near_draft(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with noise on every weight: it agrees with the target on some drafts only."""
    folder = tmp_path_factory.mktemp("near_draft")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    torch.manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * NOISE * param.std())
    model.save_pretrained(folder)
    return folder


def _llm(target: Path, draft: Path | None, **kwargs) -> LLM:
    spec = kwargs.pop("spec", {})
    config = None
    if draft is not None:
        config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3, **spec}
    return cpu_llm(target, config, num_gpu_blocks_override=64, **kwargs)


@pytest.fixture(scope="module")
def plain(tiny_llama_dir: Path) -> LLM:
    return _llm(tiny_llama_dir, None, max_num_batched_tokens=32)


GREEDY = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (30, 7, 24, 1)]


@pytest.fixture(scope="module")
def self_draft(tiny_llama_dir: Path, plain: LLM) -> LLM:
    """The target as its own draft, after one greedy batch: its tokens checked against plain."""
    llm = _llm(tiny_llama_dir, tiny_llama_dir, max_num_batched_tokens=32)
    prompts = _prompts(0, [40, 17, 56, 5])
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == _tokens(
        plain.generate(prompts, GREEDY, use_tqdm=False)
    )
    return llm


def test_the_target_as_its_own_draft_accepts_every_greedy_draft(self_draft: LLM) -> None:
    counters = _counters(self_draft)
    assert counters.num_drafts > 10
    assert counters.num_accepted_tokens == counters.num_draft_tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_another_draft_gives_plain_greedy_tokens(
    tiny_llama_dir: Path, near_draft: Path, plain: LLM, async_scheduling: bool
) -> None:
    """Prefill chunks of 32 tokens (steps where no request samples too), then the same prompts
    again (prefix hits)."""
    llm = _llm(
        tiny_llama_dir, near_draft, max_num_batched_tokens=32, async_scheduling=async_scheduling
    )
    prompts = _prompts(1, [40, 17, 56, 5])
    want = _tokens(plain.generate(prompts, GREEDY, use_tqdm=False))
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    hits = llm.get_stats().prefix_cache_hits
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    assert llm.get_stats().prefix_cache_hits > hits
    counters = _counters(llm)
    assert counters.num_drafts > 10
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens


def test_probabilistic_drafts_keep_random_sampling_seeded(
    tiny_llama_dir: Path, near_draft: Path
) -> None:
    llm = _llm(tiny_llama_dir, near_draft, spec={"draft_sample_method": "probabilistic"})
    prompts = _prompts(2, [25, 31, 14])
    params = [
        SamplingParams(temperature=0.7, top_k=20, seed=5, max_tokens=20, min_tokens=8),
        SamplingParams(temperature=1.0, seed=6, max_tokens=17),
        SamplingParams(temperature=0, max_tokens=19),
    ]
    together = _tokens(llm.generate(prompts, params, use_tqdm=False))
    alone = [_tokens(llm.generate([p], [s], use_tqdm=False))[0] for p, s in zip(prompts, params)]
    assert together == alone
    for outputs, p in zip(together, params):
        assert p.min_tokens <= len(outputs[0]) <= p.max_tokens
    assert _counters(llm).num_drafts > 0
