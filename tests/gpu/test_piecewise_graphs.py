"""Piecewise CUDA graphs (prefill and mixed steps) on the GPU with the Triton backend: tiny random
Llama, Qwen3, Mistral (sliding window) and a Qwen2 of sliding and full layers (KV cache groups),
ragged prompts chunked over mixed steps with decodes.

- Each replay is checked against an eager forward of the same step on the same inputs, run just
  before it: hidden states close (fp32 1e-4, bf16 2e-2 of the largest), with the pieces' output
  and the static attention output poisoned (NaN) before the replay, so it must write every real row.
- fp32: whole-run greedy tokens equal FULL_DECODE_ONLY's (eager prefill and mixed steps) and
  transformers'. The KV cache starts as NaN: a padding row whose K/V landed in a real slot would
  poison a sequence.
- A step above the largest piecewise size (2,048 tokens) runs eagerly, and its tokens still agree.
- Also through the pieces: decode-only steps above the largest decode graph (513+ sequences), a
  token budget of 8 (one size, whose GEMMs are the batch <= 8 GEMVs with their fused norms), and
  seeded sampling with logprobs and prompt_logprobs (the hidden states read after the replay).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from tiny_hf_models import hf_greedy, random_prompts

from pagedlm import LLM, RequestOutput, SamplingParams
from pagedlm.worker import cuda_graphs
from pagedlm.worker.model_runner import ModelRunner
from pagedlm.worker.sizes import MAX_PIECEWISE_SIZE

pytestmark = pytest.mark.gpu

# max_num_batched_tokens 96: piecewise sizes 16, 32, 64, 96; max_num_seqs 4: each prompt (2..120
# tokens, in chunks of the budget) is admitted as an earlier request finishes, beside the decodes of
# the others (mixed steps of every padding; with more rows, every step was a full 96)
ENGINE_ARGS = dict(
    skip_tokenizer_init=True,
    device="cuda",
    attention_backend="triton",
    max_model_len=512,
    max_num_seqs=4,
    max_num_batched_tokens=96,
    num_gpu_blocks_override=512,
    async_scheduling=True,
)
PROMPTS = random_prompts(12, 2, 120, seed=5)
MAX_TOKENS = [3 + (5 * i) % 11 for i in range(len(PROMPTS))]  # 3..13
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}  # of the largest |hidden|


@dataclass
class ReplayCheck:
    num_tokens: int
    size: int
    max_query_len: int
    hidden: torch.Tensor  # [num_tokens, hidden_size] from the replay
    expected: torch.Tensor  # [num_tokens, hidden_size] from the eager forward


def _greedy(max_tokens: list[int]) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]


def _run(
    folder, dtype: str, mode: str, prompts=PROMPTS, params=None, **overrides
) -> tuple[list[RequestOutput], list[ReplayCheck]]:
    llm = LLM(str(folder), dtype=dtype, cudagraph_mode=mode, **{**ENGINE_ARGS, **overrides})
    runner: ModelRunner = llm.llm_engine.engine_core.model_runner
    assert (runner.piecewise is None) == (mode == "FULL_DECODE_ONLY")
    for kv_cache in runner.kv_caches:  # in place: the graphs keep the cache's address
        kv_cache.fill_(float("nan"))
    checks: list[ReplayCheck] = []
    if runner.piecewise is not None:
        _check_each_replay(runner, checks)
    outputs = llm.generate(prompts, params or _greedy(MAX_TOKENS), use_tqdm=False)
    return outputs, checks


def _generate(
    folder, dtype: str, mode: str, prompts=PROMPTS, max_tokens=MAX_TOKENS, **overrides
) -> tuple[list[list[int]], list[ReplayCheck]]:
    outputs, checks = _run(folder, dtype, mode, prompts, _greedy(max_tokens), **overrides)
    return [out.outputs[0].token_ids for out in outputs], checks


def _check_each_replay(runner: ModelRunner, checks: list[ReplayCheck]) -> None:
    """Before each replay, the eager forward of the same step (it writes this step's KV, which the
    replay writes again before its attention reads it)."""
    piecewise = runner.piecewise
    replay = piecewise.replay

    def checked_replay(size, input_ids, positions, meta):
        assert size == runner.sizes.piecewise_size(meta.num_tokens)
        expected = runner.model(input_ids, positions, runner.kv_caches, meta).clone()
        piecewise._pieces[size].hidden.fill_(float("nan"))
        piecewise._out.fill_(float("nan"))
        hidden = replay(size, input_ids, positions, meta)
        checks.append(
            ReplayCheck(meta.num_tokens, size, meta.max_query_len, hidden.clone(), expected)
        )
        return hidden

    piecewise.replay = checked_replay


def _assert_replays_match(checks: list[ReplayCheck], dtype: str) -> None:
    sizes = {check.size for check in checks}
    assert len(checks) >= 8 and len(sizes) >= 2, [(c.num_tokens, c.size) for c in checks]
    assert sum(check.num_tokens < check.size for check in checks) >= 4  # padded steps
    _assert_close(checks, dtype)


def _assert_close(checks: list[ReplayCheck], dtype: str) -> None:
    for step, check in enumerate(checks):
        hidden, expected = check.hidden, check.expected
        assert torch.isfinite(hidden).all() and torch.isfinite(expected).all(), step
        tolerance = TOLERANCE[dtype] * expected.abs().max().item()
        error = (hidden - expected).abs().max().item()
        assert error <= tolerance, (step, check.num_tokens, check.size, error, tolerance)


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "qwen2-mixed"])
def test_fp32_piecewise_tokens_equal_eager_and_transformers(checkpoints, family):
    """qwen2-mixed: four KV cache groups, each layer's KV written through its group's slots."""
    folder, hf_model = checkpoints[family]
    tokens, checks = _generate(folder, "float32", "FULL_AND_PIECEWISE")
    eager_tokens, _ = _generate(folder, "float32", "FULL_DECODE_ONLY")
    reference = hf_greedy(hf_model, PROMPTS, max(MAX_TOKENS))
    assert [len(t) for t in tokens] == MAX_TOKENS
    assert tokens == eager_tokens
    assert tokens == [ref[:num] for ref, num in zip(reference, MAX_TOKENS)]
    _assert_replays_match(checks, "float32")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_piecewise_replays_match_eager(checkpoints, family):
    folder, _ = checkpoints[family]
    tokens, checks = _generate(folder, "bfloat16", "FULL_AND_PIECEWISE")
    assert [len(t) for t in tokens] == MAX_TOKENS
    _assert_replays_match(checks, "bfloat16")


def test_fp32_a_slow_token_count_gives_way_to_the_larger_pieces(checkpoints, monkeypatch):
    """The pieces' real replay times (sizes 16, 32, 64, 96), with 32's made the slowest: steps of 17 to 32
    tokens replay the 64 pieces, padded; they equal the eager forward, and the tokens transformers'."""
    folder, hf_model = checkpoints["llama"]
    least_times_ms = cuda_graphs.least_times_ms
    timed: list[dict[int, float]] = []

    def slow_32(sizes: list[int], run, device) -> dict[int, float]:
        times = least_times_ms(sizes, run, device)
        if sizes != [16, 32, 64, 96]:  # the decode graphs' call
            return times
        timed.append(times)
        return {**times, 32: 2 * max(times.values()) + 1.0}

    monkeypatch.setattr(cuda_graphs, "least_times_ms", slow_32)
    tokens, checks = _generate(folder, "float32", "FULL_AND_PIECEWISE")
    assert len(timed) == 1 and all(ms > 0 for ms in timed[0].values()), timed
    reference = hf_greedy(hf_model, PROMPTS, max(MAX_TOKENS))
    assert tokens == [ref[:num] for ref, num in zip(reference, MAX_TOKENS)]
    moved = [check for check in checks if 16 < check.num_tokens <= 32]
    assert moved and {check.size for check in moved} == {64}, [
        (c.num_tokens, c.size) for c in checks
    ]
    _assert_close(checks, "float32")


def test_a_step_above_the_largest_size_runs_eagerly(checkpoints):
    """10 prompts of 250 tokens in one 2,500-token step (budget 4,096): eager; then decode graphs;
    then an 11th prompt of 300 tokens, waiting for a free row (max_num_seqs 10): a piecewise replay."""
    folder, hf_model = checkpoints["qwen3"]
    prompts = random_prompts(10, 250, 250, seed=7) + random_prompts(1, 300, 300, seed=8)
    max_tokens = [4] * 10 + [6]
    args = dict(
        prompts=prompts, max_tokens=max_tokens, max_num_batched_tokens=4096, max_num_seqs=10
    )
    tokens, checks = _generate(folder, "float32", "FULL_AND_PIECEWISE", **args)
    eager_tokens, _ = _generate(folder, "float32", "FULL_DECODE_ONLY", **args)
    assert tokens == eager_tokens
    reference = hf_greedy(hf_model, prompts, 6)
    assert tokens == [ref[:num] for ref, num in zip(reference, max_tokens)]
    assert checks and all(check.num_tokens <= MAX_PIECEWISE_SIZE for check in checks)


def test_decode_steps_above_the_largest_decode_graph(checkpoints):
    """1,040 two-token prompts: one 2,080-token prefill step, then decode-only steps of 1,040 sequences
    (decode graphs stop at 1,024): piecewise replays of the varlen decode launch, in LPT order."""
    folder, _ = checkpoints["llama"]
    prompts = random_prompts(1040, 2, 2, seed=11)
    args = dict(
        prompts=prompts,
        max_tokens=[3] * 1040,
        max_num_seqs=1100,
        max_num_batched_tokens=4096,
        num_gpu_blocks_override=2048,
    )
    tokens, checks = _generate(folder, "float32", "FULL_AND_PIECEWISE", **args)
    eager_tokens, _ = _generate(folder, "float32", "FULL_DECODE_ONLY", **args)
    assert tokens == eager_tokens
    decode_checks = [c for c in checks if c.max_query_len == 1]
    assert len(decode_checks) >= 2 and all(
        c.num_tokens == 1040 and c.size == 1152 for c in decode_checks
    )
    _assert_close(checks, "float32")


def test_a_budget_of_eight_tokens_replays_the_gemv_pieces(checkpoints):
    folder, hf_model = checkpoints["qwen3"]
    prompts, max_tokens = PROMPTS[:6], MAX_TOKENS[:6]
    tokens, checks = _generate(
        folder, "float32", "FULL_AND_PIECEWISE", prompts, max_tokens, max_num_batched_tokens=8
    )
    eager_tokens, _ = _generate(
        folder, "float32", "FULL_DECODE_ONLY", prompts, max_tokens, max_num_batched_tokens=8
    )
    reference = hf_greedy(hf_model, prompts, max(max_tokens))
    assert tokens == eager_tokens == [ref[:num] for ref, num in zip(reference, max_tokens)]
    assert checks and {c.size for c in checks} == {8}
    _assert_close(checks, "float32")


def test_seeded_sampling_with_logprobs_on_piecewise_steps(checkpoints):
    folder, _ = checkpoints["llama"]
    params = [
        SamplingParams(
            temperature=0.8,
            top_p=0.9,
            seed=i,
            max_tokens=m,
            ignore_eos=True,
            logprobs=2,
            prompt_logprobs=2,
        )
        for i, m in enumerate(MAX_TOKENS)
    ]
    outputs, checks = _run(folder, "float32", "FULL_AND_PIECEWISE", params=params)
    expected, _ = _run(folder, "float32", "FULL_DECODE_ONLY", params=params)
    assert len(checks) >= 8
    for got, want in zip(outputs, expected):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        got_prompt, want_prompt = got.prompt_logprobs, want.prompt_logprobs
        assert (
            len(got_prompt) == len(want_prompt) and got_prompt[0] is None and want_prompt[0] is None
        )
        for got_pos, want_pos in zip(got_prompt[1:], want_prompt[1:]):
            assert got_pos.keys() == want_pos.keys()
            for token_id, logprob in want_pos.items():
                assert abs(got_pos[token_id].logprob - logprob.logprob) < 1e-4, (
                    token_id,
                    got_pos,
                    want_pos,
                )
        for token_id, got_pos, want_pos in zip(
            got.outputs[0].token_ids, got.outputs[0].logprobs, want.outputs[0].logprobs
        ):
            assert abs(got_pos[token_id].logprob - want_pos[token_id].logprob) < 1e-4
