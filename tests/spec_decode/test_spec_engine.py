"""Speculative decoding (n-gram) end to end on the CPU, float32: greedy tokens identical to plain
decoding over ragged batches, chunked prefill, prefix hits, preemption, max_tokens, EOS and stop
tokens, n > 1, sync and async scheduling; the counters say drafts were verified and accepted, so
no test passes without speculating. The tiny random model rejects most drafts (each rejection
must roll its KV back); the default model on a copy prompt accepts most (tests/spec_decode/
test_spec_default_model.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pagedlm import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}  # fmt: skip


def cpu_llm(model_dir: Path, speculative_config: dict | None, **kwargs) -> LLM:
    """A float32 CPU engine without a tokenizer, speculating as the config says (None: plain)."""
    return LLM(
        str(model_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        device="cpu",
        max_model_len=128,
        speculative_config=speculative_config,
        **kwargs,
    )


def _llm(model_dir: Path, speculative: bool, **kwargs) -> LLM:
    return cpu_llm(model_dir, NGRAM if speculative else None, **kwargs)


def _prompts(seed: int, lengths: list[int]) -> list[dict]:
    """Prompts that repeat a short random phrase, so the n-gram lookup finds matches."""
    rng = np.random.default_rng(seed)
    out = []
    for length in lengths:
        phrase = rng.integers(3, 256, size=int(rng.integers(2, 6))).tolist()
        out.append({"prompt_token_ids": (phrase * length)[:length]})
    return out


@pytest.fixture(scope="module")
def plain(tiny_llama_dir: Path) -> LLM:
    return _llm(tiny_llama_dir, speculative=False, num_gpu_blocks_override=64)


def _tokens(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def _counters(llm: LLM):
    return llm.llm_engine.engine_core.scheduler.spec.counters


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_greedy_equals_plain_under_chunking_preemption_and_prefix_hits(
    tiny_llama_dir: Path, plain: LLM, async_scheduling: bool
) -> None:
    """12 usable blocks for 6 requests of up to 90 tokens (admission by the prompt alone:
    preemptions), prefill chunks of 32 tokens, then the same prompts again (prefix hits);
    ragged max_tokens, stop token ids and n = 2."""
    llm = _llm(
        tiny_llama_dir,
        speculative=True,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=32,
        async_scheduling=async_scheduling,
    )
    llm.llm_engine.engine_core.scheduler.growth.enabled = False
    prompts = _prompts(0, [40, 17, 56, 33, 5, 47])
    params = [
        SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, n=n, stop_token_ids=stop)
        for m, n, stop in [
            (30, 1, None),
            (7, 2, None),
            (34, 1, [57]),
            (1, 1, None),
            (40, 1, None),
            (25, 2, [10, 11]),
        ]  # fmt: skip
    ]
    want = _tokens(plain.generate(prompts, params, use_tqdm=False))
    assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == want
    assert llm.get_stats().num_preemptions > 0
    hits = llm.get_stats().prefix_cache_hits
    assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == want
    assert llm.get_stats().prefix_cache_hits > hits
    counters = _counters(llm)
    assert counters.num_drafts > 20 and counters.num_accepted_tokens > 0
    for outputs, p in zip(want, params):
        assert all(len(tokens) <= p.max_tokens for tokens in outputs)


def test_greedy_logprobs_equal_plain(tiny_llama_dir: Path, plain: LLM) -> None:
    """The logprobs of every emitted token (accepted drafts and the target's own) are those of
    plain decoding; a request asking none gets none beside one that asks."""
    llm = _llm(tiny_llama_dir, speculative=True, num_gpu_blocks_override=64)
    prompts = _prompts(0, [40, 17, 56, 33])
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=n)
              for n in (2, None, 0, 1)]  # fmt: skip
    want = plain.generate(prompts, params, use_tqdm=False)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert _counters(llm).num_accepted_tokens > 0
    for g, w in zip(got, want):
        g_lp, w_lp = g.outputs[0].logprobs, w.outputs[0].logprobs
        if w_lp is None:
            assert g_lp is None
            continue
        assert len(g_lp) == len(w_lp) == len(g.outputs[0].token_ids)
        for g_entry, w_entry in zip(g_lp, w_lp):
            assert g_entry.keys() == w_entry.keys()
            for token, entry in w_entry.items():
                assert g_entry[token].logprob == pytest.approx(entry.logprob, abs=1e-4)
                assert g_entry[token].rank == entry.rank


def test_random_sampling_is_seeded_and_bounded(tiny_llama_dir: Path) -> None:
    """Seeded random requests (temperature, top-k, top-p, min-p, min_tokens) give the same
    tokens run alone or in a batch, never more than max_tokens, and EOS is held off by
    min_tokens; a penalised one speculates beside them (test_spec_penalties.py: greedy)."""
    llm = _llm(tiny_llama_dir, speculative=True, num_gpu_blocks_override=64)
    prompts = _prompts(2, [25, 31, 14])
    params = [
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=5, max_tokens=20, min_tokens=8),
        SamplingParams(temperature=1.0, min_p=0.05, seed=6, max_tokens=17),
        SamplingParams(temperature=0.8, seed=7, max_tokens=19, repetition_penalty=1.3),
    ]
    together = _tokens(llm.generate(prompts, params, use_tqdm=False))
    alone = [_tokens(llm.generate([p], [s], use_tqdm=False))[0] for p, s in zip(prompts, params)]
    assert together == alone
    for outputs, p in zip(together, params):
        assert p.min_tokens <= len(outputs[0]) <= p.max_tokens
    assert _counters(llm).num_drafts > 0
