"""CUDA graphs for pure-decode batches, on the GPU with the Triton backend: tiny random Llama and
Qwen3 in fp32 and bf16. Greedy tokens with graph replay equal enforce_eager (and transformers in
fp32) for batches whose sizes are mostly not capture sizes (padding rows exercised), the logits of
every step, replayed ones included, close to eager; the KV sizing reserves what the graphs take
(all 51 sizes captured, measured against the trial capture, every term logged)."""
from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field

import pytest
import torch
from tiny_hf_models import hf_greedy, random_prompts, save_tiny_model

from pagedlm import LLM, SamplingParams
from pagedlm.worker.model_runner import ModelRunner

pytestmark = pytest.mark.gpu

# max_num_seqs 16: sizes 1, 2, 4, 8, 16; 11 prompts with ragged max_tokens make decode batches of
# 11, 10, ..., 1 sequences as requests finish (padded to 16, 8, 4, 2).
ENGINE_ARGS = dict(skip_tokenizer_init=True, device="cuda", attention_backend="triton",
                   max_model_len=512, max_num_seqs=16, max_num_batched_tokens=64,
                   num_gpu_blocks_override=256, async_scheduling=True)
PROMPTS = random_prompts(11, 2, 40, seed=3)
MAX_TOKENS = [4 + (3 * i) % 13 for i in range(len(PROMPTS))]  # 4..16
LOGITS_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}  # of the largest |logit|


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_models")
    return {family: (root / family, save_tiny_model(root / family, family))
            for family in ("llama", "qwen3")}


@dataclass
class Run:
    tokens: list[list[int]]
    logits: list[torch.Tensor] = field(default_factory=list)  # per sampling step [N, vocab]
    replays: list[tuple[int, int]] = field(default_factory=list)  # (num_seqs, graph size)


def _generate(folder, dtype: str, enforce_eager: bool) -> Run:
    llm = LLM(str(folder), dtype=dtype, enforce_eager=enforce_eager, **ENGINE_ARGS)
    runner: ModelRunner = llm.llm_engine.engine_core.model_runner
    assert (runner.graphs is None) == enforce_eager
    for kv_cache in runner.kv_caches:  # in place: the graphs keep the cache's address
        kv_cache.fill_(float("nan"))
    run = Run(tokens=[])
    _record(runner, run)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    run.tokens = [out.outputs[0].token_ids for out in outputs]
    return run


def _record(runner: ModelRunner, run: Run) -> None:
    compute_logits = runner.model.compute_logits

    def recording_compute_logits(hidden: torch.Tensor) -> torch.Tensor:
        logits = compute_logits(hidden)
        run.logits.append(logits.clone())
        return logits

    runner.model.compute_logits = recording_compute_logits
    if runner.graphs is None:
        return
    runner.graphs._output.fill_(float("nan"))  # padding rows stay garbage, real rows are written
    replay = runner.graphs.replay

    def recording_replay(size: int, block_table: torch.Tensor) -> torch.Tensor:
        run.replays.append((block_table.shape[0], size))
        return replay(size, block_table)

    runner.graphs.replay = recording_replay


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_graph_replay_equals_eager(checkpoints, family, dtype):
    folder, hf_model = checkpoints[family]
    graphed = _generate(folder, dtype, enforce_eager=False)
    eager = _generate(folder, dtype, enforce_eager=True)
    assert graphed.tokens == eager.tokens
    assert [len(t) for t in graphed.tokens] == MAX_TOKENS
    if dtype == "float32":
        reference = hf_greedy(hf_model, PROMPTS, max(MAX_TOKENS))
        assert graphed.tokens == [ref[:m] for ref, m in zip(reference, MAX_TOKENS)]
    sizes = {size for _, size in graphed.replays}
    assert len(graphed.replays) >= 10 and len(sizes) >= 3
    assert sum(num_seqs < size for num_seqs, size in graphed.replays) >= 5  # padded batches
    assert not eager.replays and len(graphed.logits) == len(eager.logits)
    for step, (logits, expected) in enumerate(zip(graphed.logits, eager.logits)):
        assert torch.isfinite(logits).all() and logits.shape == expected.shape, step
        scale = expected.abs().max().item()
        error = (logits - expected).abs().max().item()
        assert error <= LOGITS_TOLERANCE[dtype] * scale, (step, error, scale)


def test_kv_sizing_reserves_graph_memory(checkpoints, caplog):
    """max_num_seqs 512: all 51 sizes; the KV cache sized from gpu_memory_utilization."""
    folder, _ = checkpoints["qwen3"]
    gc.collect()
    torch.cuda.empty_cache()
    with caplog.at_level(logging.INFO, logger="pagedlm"):
        llm = LLM(str(folder), dtype="bfloat16", skip_tokenizer_init=True, device="cuda",
                  max_model_len=256, max_num_seqs=512, gpu_memory_utilization=0.3)
    runner: ModelRunner = llm.llm_engine.engine_core.model_runner
    assert len(runner.graphs.sizes) == 51 and runner.graphs.max_size == 512
    reserved, taken = runner.graph_bytes_reserved, runner.graph_bytes
    assert reserved is not None and 0 < taken <= reserved + (16 << 20), (taken, reserved)
    assert "CUDA graphs (trial capture)" in caplog.text and "left for the KV cache" in caplog.text
    assert "51 pure-decode batch sizes (1..512) captured in" in caplog.text
    outputs = llm.generate(PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=8,
                                                       ignore_eos=True), use_tqdm=False)
    assert [len(out.outputs[0].token_ids) for out in outputs] == [8, 8, 8]
