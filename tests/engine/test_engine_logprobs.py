"""Sampled and prompt logprobs through LLM.generate equal log_softmax of transformers' logits
(fp32, 1e-4), with ranks, top-N and decoded tokens; prompt logprobs survive chunked prefill,
a prefix-cache hit they must not take, and async scheduling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from pagedlm import LLM, SamplingParams
from pagedlm.outputs import Logprob

ATOL = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_llama_with_tokenizer_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(
        tiny_llama_with_tokenizer_dir, dtype=torch.float32
    ).eval()


def _make_llm(folder: Path, async_scheduling: bool) -> LLM:
    return LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        max_model_len=128,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=16,
        async_scheduling=async_scheduling,
    )


def _hf_logprobs(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), V]: row q is the distribution of token q + 1."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().log_softmax(dim=-1)


def _prompt(length: int, seed: int, vocab_size: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=gen).tolist()


def _check_position(
    entry: dict[int, Logprob], token_id: int, ref: torch.Tensor, num_top: int, tokenizer: Any
) -> None:
    """entry: {token: Logprob} of one position; ref [V]: the reference log-distribution."""
    assert entry[token_id].logprob == pytest.approx(ref[token_id].item(), abs=ATOL)
    assert entry[token_id].rank == int((ref >= ref[token_id]).sum())
    top_values, top_ids = ref.topk(num_top)
    for rank, (value, top_id) in enumerate(zip(top_values.tolist(), top_ids.tolist()), start=1):
        assert entry[top_id].logprob == pytest.approx(value, abs=ATOL)
        if top_id != token_id:
            assert entry[top_id].rank == rank
    assert set(entry) == {token_id, *top_ids.tolist()}
    assert all(lp.decoded_token == tokenizer.decode([t]) for t, lp in entry.items())


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prompt_logprobs_equal_transformers(
    tiny_llama_with_tokenizer_dir: Path, hf_model: torch.nn.Module, async_scheduling: bool
) -> None:
    llm = _make_llm(tiny_llama_with_tokenizer_dir, async_scheduling)
    vocab_size = hf_model.config.vocab_size
    long_prompt = _prompt(45, 0, vocab_size)  # three chunks of the 16-token budget
    # Cache the long prompt's blocks first: the request that asks must not take the hit.
    llm.generate(long_prompt, SamplingParams(max_tokens=1), use_tqdm=False)
    prompts = [long_prompt, _prompt(20, 1, vocab_size), _prompt(1, 2, vocab_size)]
    params = [
        SamplingParams(max_tokens=2, prompt_logprobs=3),
        SamplingParams(max_tokens=2),
        SamplingParams(max_tokens=2, prompt_logprobs=0),
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert outputs[1].prompt_logprobs is None
    assert outputs[2].prompt_logprobs == [None]
    prompt_logprobs = outputs[0].prompt_logprobs
    assert len(prompt_logprobs) == len(long_prompt) and prompt_logprobs[0] is None
    ref = _hf_logprobs(hf_model, long_prompt)
    for j in range(1, len(long_prompt)):
        _check_position(prompt_logprobs[j], long_prompt[j], ref[j - 1], 3, llm.get_tokenizer())


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_sample_logprobs_equal_transformers(
    tiny_llama_with_tokenizer_dir: Path, hf_model: torch.nn.Module, async_scheduling: bool
) -> None:
    """Greedy and seeded random rows: logprobs are of the raw logits (as vLLM), whatever the
    temperature; cumulative_logprob is the sum of the sampled tokens' ones."""
    llm = _make_llm(tiny_llama_with_tokenizer_dir, async_scheduling)
    vocab_size = hf_model.config.vocab_size
    prompts = [_prompt(9, 3, vocab_size), _prompt(30, 4, vocab_size), _prompt(5, 5, vocab_size)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=3, max_tokens=6, logprobs=4, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert (
        outputs[2].outputs[0].logprobs is None and outputs[2].outputs[0].cumulative_logprob is None
    )
    for prompt, param, output in zip(prompts[:2], params[:2], outputs[:2]):
        completion = output.outputs[0]
        ref = _hf_logprobs(hf_model, prompt + completion.token_ids)
        assert len(completion.logprobs) == len(completion.token_ids) == 6
        total = 0.0
        for k, (token_id, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
            row = ref[len(prompt) + k - 1]
            _check_position(entry, token_id, row, param.logprobs, llm.get_tokenizer())
            total += row[token_id].item()
        assert completion.cumulative_logprob == pytest.approx(total, abs=ATOL)
    assert all(
        entry[t].rank == 1
        for t, entry in zip(outputs[0].outputs[0].token_ids, outputs[0].outputs[0].logprobs)
    )


def test_prompt_logprobs_with_prompt_embeds_are_refused(tiny_llm: LLM) -> None:
    embeds = torch.zeros(3, 64)
    with pytest.raises(ValueError, match=r"prompt_logprobs"):
        tiny_llm.generate(
            {"prompt_embeds": embeds}, SamplingParams(prompt_logprobs=1), use_tqdm=False
        )


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prompt_logprobs_are_sent_once_under_preemption(
    tiny_llama_dir: Path, async_scheduling: bool
) -> None:
    """11 usable blocks of 16 tokens for 6 sequences of up to 88 tokens: requests are preempted
    and recompute their prompt, whose entries must not be delivered twice."""
    llm = LLM(
        str(tiny_llama_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        device="cpu",
        max_model_len=128,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=32,
        async_scheduling=async_scheduling,
    )
    llm.llm_engine.engine_core.scheduler.growth.enabled = (
        False  # admit by the prompt alone: preempt
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    prompts = [_prompt(length, 10 + i, 256) for i, length in enumerate([40, 56, 33, 60, 47, 52])]
    params = SamplingParams(max_tokens=28, ignore_eos=True, prompt_logprobs=1)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.get_stats().num_preemptions > 0
    for prompt, output in zip(prompts, outputs):
        assert len(output.prompt_logprobs) == len(prompt)
        ref = _hf_logprobs(model, prompt)
        got = [entry[token].logprob for entry, token in zip(output.prompt_logprobs[1:], prompt[1:])]
        want = [ref[j - 1, prompt[j]].item() for j in range(1, len(prompt))]
        assert got == pytest.approx(want, abs=ATOL)


def test_parallel_samples_report_prompt_logprobs_once(tiny_llm: LLM) -> None:
    prompt = list(range(30, 50))
    params = SamplingParams(n=3, seed=0, max_tokens=3, prompt_logprobs=2)
    (single,) = tiny_llm.generate(
        prompt, SamplingParams(max_tokens=3, prompt_logprobs=2), use_tqdm=False
    )
    (parallel,) = tiny_llm.generate(prompt, params, use_tqdm=False)
    assert len(parallel.prompt_logprobs) == len(prompt)
    assert parallel.prompt_logprobs[0] is None
    for got, want in zip(parallel.prompt_logprobs[1:], single.prompt_logprobs[1:]):
        assert list(got) == list(want)
        assert [lp.logprob for lp in got.values()] == pytest.approx(
            [lp.logprob for lp in want.values()], abs=ATOL
        )
