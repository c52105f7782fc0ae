"""Speculation for requests with penalties and bad words, end to end on the CPU in float32:
greedy tokens identical to plain decoding (n-gram and draft_model) for each penalty kind and bad
words, in a ragged batch beside plain requests, under preemption and chunked prefill; the
penalised requests verify drafts and accept some, and their penalties change their tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedlm import LLM, SamplingParams
from spec_decode.test_spec_engine import NGRAM, _prompts, _tokens, cpu_llm

LENGTHS = [40, 17, 56, 33, 25, 47, 30]
PENALTIES = [
    {"repetition_penalty": 0.85},
    {"frequency_penalty": 0.6},
    {"presence_penalty": -0.7},
    {"repetition_penalty": 0.8, "frequency_penalty": -0.3, "presence_penalty": 0.5},
]


def _greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


@pytest.fixture(scope="module")
def plain(tiny_llama_dir: Path) -> LLM:
    return cpu_llm(tiny_llama_dir, None, num_gpu_blocks_override=64)


@pytest.fixture(scope="module")
def cases(plain: LLM) -> tuple[list[dict], list[SamplingParams]]:
    """Four penalised requests, two with bad words (from their unconstrained output, so they
    bite: a one-token word, and two- and three-token words whose prefixes the drafts often end),
    and a plain one."""
    prompts = _prompts(3, LENGTHS)
    params = [_greedy(m, **p) for m, p in zip((30, 22, 34, 28), PENALTIES)]
    free = _tokens(plain.generate(prompts[4:6], [_greedy(30), _greedy(26)], use_tqdm=False))
    words_a = [free[0][0][4:6], free[0][0][10:13]]
    words_b = [[free[1][0][7]], free[1][0][2:4]]
    params += [
        _greedy(30, bad_words_token_ids=words_a),
        _greedy(26, bad_words_token_ids=words_b, frequency_penalty=0.4),
        _greedy(24),
    ]
    return prompts, params


def _check(
    llm: LLM, plain: LLM, cases: tuple[list[dict], list[SamplingParams]], min_accepted: int
) -> None:
    """min_accepted: drafts the penalised requests accept in all (each accepted draft is in the
    history of the positions after it)."""
    prompts, params = cases
    want = _tokens(plain.generate(prompts, params, use_tqdm=False))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert _tokens(outputs) == want
    unpenalised = [_greedy(p.max_tokens) for p in params]
    free = _tokens(plain.generate(prompts, unpenalised, use_tqdm=False))
    for i in range(6):  # the penalties and bad words acted, and their requests speculated
        assert want[i] != free[i], i
        assert outputs[i].outputs[0].spec_decode_metrics.num_draft_tokens > 0, i
    for tokens, p in zip(want[4:6], params[4:6]):
        for word in p.bad_words_token_ids:
            n = len(word)
            assert all(tokens[0][s : s + n] != word for s in range(len(tokens[0]))), word
    accepted = [o.outputs[0].spec_decode_metrics.num_accepted_draft_tokens for o in outputs[:6]]
    assert sum(accepted) >= min_accepted


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_ngram_greedy_with_penalties_equals_plain_under_preemption(
    tiny_llama_dir: Path, plain: LLM, cases, async_scheduling: bool
) -> None:
    llm = cpu_llm(
        tiny_llama_dir,
        NGRAM,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=32,
        async_scheduling=async_scheduling,
    )
    llm.llm_engine.engine_core.scheduler.growth.enabled = False
    _check(llm, plain, cases, min_accepted=1)  # the tiny random model refuses most n-grams
    assert llm.get_stats().num_preemptions > 0


def test_draft_model_greedy_with_penalties_equals_plain_under_preemption(
    tiny_llama_dir: Path, plain: LLM, cases
) -> None:
    """The target as its own draft: its unpenalised drafts are right until a penalty or a bad
    word turns the target's argmax."""
    spec = {"method": "draft_model", "model": str(tiny_llama_dir), "num_speculative_tokens": 3}
    llm = cpu_llm(tiny_llama_dir, spec, num_gpu_blocks_override=12, max_num_batched_tokens=32)
    llm.llm_engine.engine_core.scheduler.growth.enabled = False
    _check(llm, plain, cases, min_accepted=80)
    assert llm.get_stats().num_preemptions > 0
