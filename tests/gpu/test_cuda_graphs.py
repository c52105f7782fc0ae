"""CUDA graphs for pure-decode batches, on the GPU with the Triton backend: tiny random Llama and
Qwen3 in fp32 and bf16 (and in fp32 a Qwen2 of sliding and full layers: KV cache groups), decode
batches whose sizes are mostly not capture sizes (padding rows).

- Every replay is checked against an eager forward of the same batch on the same inputs, run just
  before it (teacher-forced: the same KV history): logits close, greedy picks equal; the small
  graphs' own argmax equals torch.argmax of their own logits, and is what last_sampled holds.
- fp32: whole-run greedy tokens with graphs equal enforce_eager and transformers, the greedy
  decode steps of up to MAX_LOGITS_ROWS sequences taking the graph's ids (no sampler run); a
  batch asking for logprobs is sampled from the graph's logits: tokens equal, logprobs close.
- bf16: no whole-run token equality. bf16 GEMMs are not batch-size invariant (a padded replay
  multiplies `size` rows, eager `num_seqs`), and these tiny random models have near-ties (top-2
  logit gaps down to 3e-4 of the largest logit, below bf16's resolution): one flipped pick would
  make the two runs diverge for a reason that is not the graphs. The per-replay check covers
  bf16, a pick may differ only where the eager top-2 gap is within the logits tolerance.
- KV sizing reserves what the graphs take (all 51 sizes captured, against the trial capture),
  every term logged.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field

import pytest
import torch
from tiny_hf_models import hf_greedy, random_prompts

from pagedlm import LLM, SamplingParams
from pagedlm.attention.backend import AttentionMetadata
from pagedlm.worker.cuda_graphs import MAX_LOGITS_ROWS, TIMED_ROUNDS, DecodeGraphs
from pagedlm.worker.group_tables import group_metadata
from pagedlm.worker.model_runner import ModelRunner

pytestmark = pytest.mark.gpu

# max_num_seqs 16: sizes 1, 2, 4, 8, 16; 11 prompts with ragged max_tokens make decode batches of
# 10, 9, 7, 5, 4, 2, 1 sequences as requests finish (padded to 16, 8, 4, 2). max_model_len 512:
# the graphs take the split-decode kernel (2 splits), eager the varlen one.
ENGINE_ARGS = dict(
    skip_tokenizer_init=True,
    device="cuda",
    attention_backend="triton",
    max_model_len=512,
    max_num_seqs=16,
    max_num_batched_tokens=64,
    num_gpu_blocks_override=256,
    async_scheduling=True,
)
PROMPTS = random_prompts(11, 2, 40, seed=3)
MAX_TOKENS = [4 + (3 * i) % 13 for i in range(len(PROMPTS))]  # 4..16
LOGITS_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}  # of the largest |logit|


@dataclass
class ReplayCheck:
    num_seqs: int
    size: int
    logits: torch.Tensor  # [num_seqs, vocab] from the replay
    expected: torch.Tensor  # [num_seqs, vocab] from the eager forward


@dataclass
class Run:
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[dict]] = field(default_factory=list)
    replays: list[ReplayCheck] = field(default_factory=list)
    num_argmax_checks: int = 0
    num_graph_ids_taken: int = 0  # steps that took a graph's argmax (sampler.count_sampled)
    num_staged: int = 0  # replays of graphs that staged their inputs in


def _generate(
    folder, dtype: str, enforce_eager: bool, logprobs: int | None = None, **engine_args
) -> Run:
    llm = LLM(
        str(folder), dtype=dtype, enforce_eager=enforce_eager, **{**ENGINE_ARGS, **engine_args}
    )
    runner: ModelRunner = llm.llm_engine.engine_core.model_runner
    assert (runner.graphs is None) == enforce_eager
    for kv_cache in runner.kv_caches:  # in place: the graphs keep the cache's address
        kv_cache.fill_(float("nan"))
    run = Run()
    if runner.graphs is not None:
        _check_each_replay(runner, run)
    count_sampled = runner.sampler.count_sampled

    def counted(rows_np) -> None:
        run.num_graph_ids_taken += 1
        count_sampled(rows_np)

    runner.sampler.count_sampled = counted
    params = [
        SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=logprobs)
        for m in MAX_TOKENS
    ]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    run.tokens = [out.outputs[0].token_ids for out in outputs]
    run.logprobs = [out.outputs[0].logprobs for out in outputs]
    return run


def _eager_decode(runner: ModelRunner, size: int, num_seqs: int) -> torch.Tensor:
    """[num_seqs, hidden_size]: the runner's eager forward of the decode batch now in its input
    buffers (unpadded: num_seqs rows, the batch's own max_seq_len), with the input ids the graph
    is about to gather and the block table it holds."""
    inputs = runner._inputs.sections(size, size).tensors
    seq_lens = inputs["seq_lens"][:num_seqs]
    meta = AttentionMetadata(
        num_tokens=num_seqs,
        num_seqs=num_seqs,
        max_query_len=1,
        max_seq_len=int(seq_lens.max().item()),
        query_start_loc=inputs["query_start_loc"][: num_seqs + 1],
        seq_lens=seq_lens,
        slot_mapping=inputs["slot_mapping"][:num_seqs],
        block_table=runner.graphs.block_table[:num_seqs],
        query_start_loc_cpu=inputs["query_start_loc"][: num_seqs + 1].cpu(),
        seq_lens_cpu=seq_lens.cpu(),
    )
    tables = runner.graphs.block_tables[:, :num_seqs]
    meta.groups = group_metadata(meta, inputs, len(runner.kv_groups), tables)
    input_ids = inputs["ids_table"][inputs["input_src"][:num_seqs]]
    return runner.model(input_ids, inputs["positions"][:num_seqs], runner.kv_caches, meta)


def _check_each_replay(runner: ModelRunner, run: Run) -> None:
    """Before each replay, the eager forward of the same batch (it writes this step's KV, which
    the replay then writes again: the run goes on with the graph's values); checked against it:
    the logits of the replay's hidden states and, where the graph computes them, its own logits,
    whose argmax must be the graph's and be in last_sampled at the rows of the samples."""
    graphs = runner.graphs
    replay, compute_logits = graphs.replay, runner.model.compute_logits

    def checked_replay(size: int, slot: int | None = None) -> torch.Tensor:
        if (
            slot is not None
        ):  # a staged graph's first step, run eagerly: the inputs are then in place
            graphs.stage_in(size, slot)
            run.num_staged += 1
        num_seqs = len(runner.input_batch._previous.req_ids)
        expected = compute_logits(_eager_decode(runner, size, num_seqs))
        graphs._outputs[size, slot].fill_(
            float("nan")
        )  # the replay must write every real row again
        if (
            slot is not None
        ):  # the staged graph must copy its inputs again and write the ids to the host
            staged_inputs = runner._inputs.words.clone()
            runner._inputs.words[
                : int(runner._staging[slot].head[0])
            ] = -1  # the words its header names
            runner._sampled_cpu[slot].fill_(-1)
        hidden = replay(size, slot)
        if slot is not None:
            assert torch.equal(runner._inputs.words, staged_inputs)
        run.replays.append(ReplayCheck(num_seqs, size, compute_logits(hidden[:num_seqs]), expected))
        graph_logits = graphs.logits(
            size, slot
        )  # the graph's own LM head, up to MAX_LOGITS_ROWS rows
        assert (graph_logits is None) == (size > MAX_LOGITS_ROWS)
        if graph_logits is not None:
            run.replays.append(
                ReplayCheck(num_seqs, size, graph_logits[:num_seqs].clone(), expected)
            )
            argmax = graphs.argmax(size, slot)
            assert torch.equal(argmax, torch.argmax(graph_logits, dim=-1))
            sample_rows = runner._inputs.sections(size, size).tensors["sample_rows"]
            assert torch.equal(runner._last_sampled[sample_rows], argmax)
            if slot is not None:
                torch.cuda.synchronize()
                assert runner._sampled_cpu[slot][:size].tolist() == argmax.tolist()
            run.num_argmax_checks += 1
        return hidden

    graphs.replay = checked_replay


def _assert_replays_match(run: Run, dtype: str) -> None:
    sizes = {check.size for check in run.replays}
    assert len(run.replays) >= 10 and len(sizes) >= 3, [(c.num_seqs, c.size) for c in run.replays]
    assert sum(check.num_seqs < check.size for check in run.replays) >= 5  # padded batches
    for step, check in enumerate(run.replays):
        logits, expected = check.logits, check.expected
        assert torch.isfinite(logits).all() and torch.isfinite(expected).all(), step
        tolerance = LOGITS_TOLERANCE[dtype] * expected.abs().max().item()
        error = (logits - expected).abs().max().item()
        assert error <= tolerance, (step, check.num_seqs, check.size, error, tolerance)
        top2 = expected.topk(2, dim=-1).values  # [num_seqs, 2]
        near_tie = top2[:, 0] - top2[:, 1] <= tolerance
        same_pick = logits.argmax(dim=-1) == expected.argmax(dim=-1)
        assert (same_pick | near_tie).all(), (step, check.num_seqs, check.size)


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen2-mixed"])
def test_fp32_graph_tokens_equal_eager_and_transformers(checkpoints, family):
    """qwen2-mixed: four KV cache groups (conftest.MIXED_WINDOW), prompts and outputs past the
    window, so the sliding layers attend within it through tables with freed blocks."""
    folder, hf_model = checkpoints[family]
    graphed = _generate(folder, "float32", enforce_eager=False)
    eager = _generate(folder, "float32", enforce_eager=True)
    reference = hf_greedy(hf_model, PROMPTS, max(MAX_TOKENS))
    assert [len(tokens) for tokens in graphed.tokens] == MAX_TOKENS
    assert graphed.tokens == eager.tokens
    assert graphed.tokens == [ref[:num] for ref, num in zip(reference, MAX_TOKENS)]
    assert not eager.replays and eager.num_graph_ids_taken == 0
    assert graphed.num_argmax_checks >= 5 and graphed.num_graph_ids_taken >= 5, vars(graphed)
    # Staged graphs take only steps that copy no block table; here most small steps bring one (a
    # request finished and the rows moved, or a sequence crossed into a new 16-token block): 2 of
    # 10 on the H200. The CPU test counts them exactly on a steady decode.
    assert graphed.num_staged >= 2, vars(graphed)
    _assert_replays_match(graphed, "float32")


def test_fp32_a_slow_size_gives_way_to_the_larger_graph(checkpoints, monkeypatch):
    """max_num_seqs 24 (sizes up to 8, then 16 and 24, the two timed); the real replay times, with
    16's made the slowest: batches of 9 to 16 sequences replay the 24 graph, their padding rows laid
    out for it; tokens equal transformers'."""
    folder, hf_model = checkpoints["llama"]
    replay_times = DecodeGraphs.replay_times

    def slow_16(graphs: DecodeGraphs, sizes: list[int]) -> dict[int, float]:
        assert sizes == [16, 24], sizes  # the others hold the LM head
        logits_rows: list[
            int
        ] = []  # the timed window holds the LM head the runner runs after a replay
        compute_logits = graphs._model.compute_logits
        graphs._model.compute_logits = lambda hidden: (
            logits_rows.append(hidden.shape[0]) or compute_logits(hidden)
        )
        try:
            times = replay_times(graphs, sizes)
        finally:
            del graphs._model.compute_logits
        assert sorted(logits_rows) == sorted(sizes * (TIMED_ROUNDS + 1)), logits_rows
        assert set(times) == {16, 24} and all(t > 0 for t in times.values()), times
        return {**times, 16: 2 * max(times.values()) + 1.0}

    monkeypatch.setattr(DecodeGraphs, "replay_times", slow_16)
    graphed = _generate(folder, "float32", enforce_eager=False, max_num_seqs=24)
    reference = hf_greedy(hf_model, PROMPTS, max(MAX_TOKENS))
    assert graphed.tokens == [ref[:num] for ref, num in zip(reference, MAX_TOKENS)]
    sizes_taken = {check.num_seqs: check.size for check in graphed.replays}
    assert {size for num_seqs, size in sizes_taken.items() if num_seqs > 8} == {24}, sizes_taken
    _assert_replays_match(graphed, "float32")


def test_fp32_logprobs_batches_sample_from_graph_logits(checkpoints):
    """Greedy with logprobs: not a plain argmax batch, so the sampler runs on the graph's logits
    (the argmax checks still hold); tokens equal enforce_eager's, logprobs close."""
    folder, _ = checkpoints["qwen3"]
    graphed = _generate(folder, "float32", enforce_eager=False, logprobs=2)
    eager = _generate(folder, "float32", enforce_eager=True, logprobs=2)
    assert graphed.tokens == eager.tokens and graphed.num_graph_ids_taken == 0
    assert graphed.num_argmax_checks >= 5
    for tokens, got_seq, want_seq in zip(graphed.tokens, graphed.logprobs, eager.logprobs):
        assert len(got_seq) == len(want_seq) == len(tokens)
        for token_id, got, want in zip(tokens, got_seq, want_seq):  # the sampled token's entry
            assert abs(got[token_id].logprob - want[token_id].logprob) < 1e-4, (token_id, got, want)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_graph_replays_match_eager(checkpoints, family):
    folder, _ = checkpoints[family]
    graphed = _generate(folder, "bfloat16", enforce_eager=False)
    assert [len(tokens) for tokens in graphed.tokens] == MAX_TOKENS
    _assert_replays_match(graphed, "bfloat16")


@pytest.mark.parametrize("max_num_seqs, num_sizes", [(512, 51), (1024, 67)])  # 1,024: the default
def test_kv_sizing_reserves_graph_memory(checkpoints, caplog, max_num_seqs, num_sizes):
    """All the capture sizes up to max_num_seqs; the KV cache sized from gpu_memory_utilization."""
    folder, _ = checkpoints["qwen3"]
    gc.collect()
    torch.cuda.empty_cache()
    with caplog.at_level(logging.INFO, logger="pagedlm"):
        llm = LLM(
            str(folder),
            dtype="bfloat16",
            skip_tokenizer_init=True,
            device="cuda",
            max_model_len=256,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=0.3,
        )
    runner: ModelRunner = llm.llm_engine.engine_core.model_runner
    assert (
        runner.graphs.max_size == max_num_seqs
    )  # all captured (the log), the slower ones dropped after timing
    reserved, taken = runner.graph_bytes_reserved, runner.graph_bytes
    assert reserved is not None and 0 < taken <= reserved + (16 << 20), (taken, reserved)
    assert "CUDA graphs (trial capture)" in caplog.text and "left for the KV cache" in caplog.text
    assert (
        f"{num_sizes} pure-decode batch sizes (1..{max_num_seqs}), piecewise 36 token counts (16..2048), "
        "captured in"
    ) in caplog.text
    assert "CUDA graphs: replays timed in" in caplog.text
    outputs = llm.generate(
        PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )
    assert [len(out.outputs[0].token_ids) for out in outputs] == [8, 8, 8]
