"""tp = 2 (two worker processes over gloo) against tp = 1 in float32: greedy tokens identical and
logprobs within 1e-4, through chunked prefill, prefix hits and preemption; seeded and unseeded
sampling identical; rank-0 sampling (Llama: untied head, one KV head for two ranks, a vocabulary
that does not split evenly) and batch-sharded sampling (Qwen3: q/k norm, tied head). Last, a
killed worker: the engine reports it, exits, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams
from pagedlm.executor.multiproc import WorkerFailed

ENGINE = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    device="cpu",
    max_model_len=128,
    max_num_batched_tokens=32,  # prompts of up to 40 tokens prefill in chunks
    max_num_seqs=8,
    num_gpu_blocks_override=14,  # 8 requests of up to 64 tokens need 32: preemption
    async_scheduling=True,  # two steps in flight through the workers
)
VOCAB = 250  # two shards of 128 rows: the second holds 122 ids and 6 zero rows
SHARED = list(range(2, 34))  # a two-block prefix several prompts share


def _prompts() -> list[list[int]]:
    tails = [[t % VOCAB for t in tail] for tail in tiny_hf_models.random_prompts(8, 4, 8, seed=3)]
    return [SHARED + tail if i % 2 else tail + SHARED for i, tail in enumerate(tails)]


def _params() -> list[SamplingParams]:
    greedy = [SamplingParams(max_tokens=24, temperature=0.0, logprobs=3, ignore_eos=True)] * 4
    greedy[0] = SamplingParams(max_tokens=24, temperature=0.0, prompt_logprobs=2, ignore_eos=True)
    seeded = [
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=i, ignore_eos=True)
        for i in range(3)
    ]
    unseeded = [SamplingParams(max_tokens=24, temperature=1.0, logprobs=1, ignore_eos=True)]
    return greedy + seeded + unseeded


def _run(llm: LLM) -> tuple[list[Any], Any]:
    llm.llm_engine.engine_core.scheduler.growth.enabled = False  # admit by the prompt: preempt
    outputs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], _params(), use_tqdm=False)
    return outputs, llm.get_stats()


def _save(folder: Path, family: str, **overrides: Any) -> str:
    tiny_hf_models.save_tiny_model(folder, family, vocab_size=VOCAB, config_overrides=overrides)
    return str(folder)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _save(tmp_path_factory.mktemp("llama_kv1"), "llama", num_key_value_heads=1)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _save(tmp_path_factory.mktemp("qwen3_tied"), "qwen3", tie_word_embeddings=True)


@pytest.fixture(scope="module")
def llama_tp2(llama_dir: str) -> LLM:
    llm = LLM(llama_dir, tensor_parallel_size=2, **ENGINE)
    yield llm
    llm.shutdown()


def _assert_same(reference: tuple[list[Any], Any], tp: tuple[list[Any], Any]) -> None:
    (ref_outputs, ref_stats), (tp_outputs, tp_stats) = reference, tp
    assert tp_stats.num_preemptions == ref_stats.num_preemptions > 0
    assert tp_stats.prefix_cache_hits == ref_stats.prefix_cache_hits > 0
    for ref, got in zip(ref_outputs, tp_outputs, strict=True):
        ref_out, got_out = ref.outputs[0], got.outputs[0]
        assert got_out.token_ids == ref_out.token_ids
        for ref_step, got_step in zip(ref_out.logprobs or [], got_out.logprobs or [], strict=True):
            assert list(got_step) == list(ref_step)  # the same ids, in rank order
            for token, logprob in ref_step.items():
                assert got_step[token].logprob == pytest.approx(logprob.logprob, abs=1e-4)
        for ref_pos, got_pos in zip(
            ref.prompt_logprobs or [], got.prompt_logprobs or [], strict=True
        ):
            if ref_pos is None:
                assert got_pos is None
                continue
            assert list(got_pos) == list(ref_pos)
            for token, logprob in ref_pos.items():
                assert got_pos[token].logprob == pytest.approx(logprob.logprob, abs=1e-4)
    assert ref_outputs[0].prompt_logprobs and ref_outputs[1].outputs[0].logprobs  # compared


def test_llama_untied_kv_heads_below_tp_rank0_sampling(llama_dir: str, llama_tp2: LLM) -> None:
    reference = _run(LLM(llama_dir, **ENGINE))
    _assert_same(reference, _run(llama_tp2))


def test_qwen3_tied_qk_norm_batch_sharded_sampling(qwen3_dir: str) -> None:
    reference = _run(LLM(qwen3_dir, **ENGINE))
    tp = LLM(qwen3_dir, tensor_parallel_size=2, enable_batch_sharded_sampling=True, **ENGINE)
    try:
        _assert_same(reference, _run(tp))
    finally:
        tp.shutdown()


def test_a_killed_worker_ends_the_engine_with_one_error_and_no_orphans(llama_tp2: LLM) -> None:
    executor = llama_tp2.llm_engine.engine_core.executor
    procs = list(executor._procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="rank 1 .* exited with code -9"):
        llama_tp2.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4))
    assert time.monotonic() - start < 30
    assert all(proc.poll() is not None for proc in procs)  # rank 0 stopped too: no orphan
    with pytest.raises(WorkerFailed):
        llama_tp2.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4))
