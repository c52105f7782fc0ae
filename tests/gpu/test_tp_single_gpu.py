"""The TP workers' CUDA path on one GPU (the two-GPU tests are issue 30's).

- tp = 1 through the "mp" executor (one worker process, CUDA graphs on) gives the same greedy
  tokens as "uni" (the same runner in process): the broadcast ring, the results socket and the
  worker loop change nothing. The per-step cost of the executor is printed (decode-heavy generate,
  min of 3); benchmarks/tp_executor_cost.py measures it per batch size.
- tp = 2 with both ranks on the one GPU over gloo (PAGEDLM_TP_ONE_DEVICE=1; NCCL refuses two ranks
  on one device), float32: greedy tokens identical to tp = 1 and logprobs within 1e-3, with
  rank-0 and batch-sharded sampling, and with n-gram speculation. Every collective then runs on
  CUDA tensors through gloo.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams

pytestmark = pytest.mark.gpu

ENGINE = dict(
    skip_tokenizer_init=True,
    device="cuda",
    max_model_len=256,
    max_num_seqs=16,
    num_gpu_blocks_override=256,
    graph_size_timing=False,  # both engines capture every size: the same steps, the same numerics
)
PROMPTS = [{"prompt_token_ids": p} for p in tiny_hf_models.random_prompts(8, 4, 40, seed=5)]
GREEDY = SamplingParams(max_tokens=64, temperature=0.0, logprobs=2, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tp_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder


def _generate(llm: LLM) -> tuple[list, float]:
    """(outputs, least seconds per decode step over 3 runs)."""
    outputs, best = None, float("inf")
    for _ in range(3):
        start = time.perf_counter()
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return outputs, best / GREEDY.max_tokens


def _run(folder: Path, **engine) -> tuple[list, float]:
    llm = LLM(str(folder), **ENGINE, **engine)
    try:
        return _generate(llm)
    finally:
        llm.shutdown()


def _assert_same(reference: list, got: list, logprob_tol: float) -> None:
    for ref, out in zip(reference, got, strict=True):
        ref_out, got_out = ref.outputs[0], out.outputs[0]
        assert got_out.token_ids == ref_out.token_ids
        for ref_step, got_step in zip(ref_out.logprobs, got_out.logprobs, strict=True):
            for token, logprob in ref_step.items():
                assert got_step[token].logprob == pytest.approx(logprob.logprob, abs=logprob_tol)


def test_mp_at_tp1_gives_uni_tokens(llama_dir: Path) -> None:
    uni, uni_step = _run(llama_dir, distributed_executor_backend="uni")
    mp, mp_step = _run(llama_dir, distributed_executor_backend="mp")
    _assert_same(uni, mp, 1e-5)
    print(f"\nper decode step: uni {uni_step * 1e3:.3f} ms, mp {mp_step * 1e3:.3f} ms")


@pytest.mark.parametrize("batch_sharded", [False, True])
def test_tp2_on_one_gpu_over_gloo_gives_tp1_tokens(
    llama_dir: Path, batch_sharded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference, _ = _run(llama_dir, dtype="float32")
    monkeypatch.setenv("PAGEDLM_TP_ONE_DEVICE", "1")  # the workers inherit it
    tp, step = _run(
        llama_dir,
        dtype="float32",
        tensor_parallel_size=2,
        enable_batch_sharded_sampling=batch_sharded,
    )
    _assert_same(reference, tp, 1e-3)
    print(f"\ntp = 2 on one GPU over gloo: {step * 1e3:.3f} ms per decode step")


def test_tp2_speculation_on_one_gpu_gives_tp1_tokens(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n-gram speculation at tp = 2 (every rank verifies every row on CUDA): tp = 1's tokens."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}  # fmt: skip
    reference, _ = _run(llama_dir, dtype="float32", speculative_config=spec)
    monkeypatch.setenv("PAGEDLM_TP_ONE_DEVICE", "1")
    tp, _ = _run(llama_dir, dtype="float32", tensor_parallel_size=2, speculative_config=spec)
    _assert_same(reference, tp, 1e-3)
