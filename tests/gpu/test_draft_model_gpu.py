"""The draft_model proposer on CUDA (Triton attention, float32): no host sync in `propose`
(set_sync_debug_mode("error")), the drafts of the CPU run over the same steps, and with its
CUDA graphs (draft_graphs.py) the eager proposer's drafts; the engine with the
draft's graphs gives the tokens of enforce_eager and of plain decoding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from spec_decode.test_draft_graphs import (
    KS,
    SHAPES,
    count_draft_replays,
    expected_replays,
    request_steps,
    two_request_steps,
)
from spec_decode.test_draft_model import K, spec_args, verified_step
from tiny_hf_models import random_prompts, save_tiny_model

from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.sampler import RandomParams
from pagedlm.spec_decode.draft_graphs import DraftGraphs
from pagedlm.spec_decode.draft_model import DraftModelProposer, ModelVerifiedStep

pytestmark = pytest.mark.gpu
NUM_COLS = 8


def _proposer(target, draft, device: str, **spec) -> DraftModelProposer:
    args = replace(spec_args(target, draft, **spec), device=device)
    proposer = DraftModelProposer(args.create_engine_config())
    proposer.load_model()
    proposer.allocate_kv_cache(64)
    return proposer


def _on(step: ModelVerifiedStep, device: str, sampling: RandomParams | None) -> ModelVerifiedStep:
    meta = step.attn_metadata
    moved = replace(
        meta,
        query_start_loc=meta.query_start_loc.to(device),
        seq_lens=meta.seq_lens.to(device),
        slot_mapping=meta.slot_mapping.to(device),
        block_table=meta.block_table.to(device),
    )
    return replace(
        step,
        rows=step.rows.to(device),
        input_ids=step.input_ids.to(device),
        token_ids=step.token_ids.to(device),
        num_accepted=step.num_accepted.to(device),
        first_positions=step.first_positions.to(device),
        attn_metadata=moved,
        sampling=sampling,
    )


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_draft_model_proposals_make_no_sync(tmp_path, method: str) -> None:
    target, draft = tmp_path / "target", tmp_path / "draft"
    save_tiny_model(target, "llama", seed=1)
    save_tiny_model(draft, "qwen3", seed=2)
    on_gpu = _proposer(target, draft, "cuda", draft_sample_method=method)
    on_cpu = _proposer(target, draft, "cpu", draft_sample_method=method)
    prompts = random_prompts(2, 6, 14, seed=3)
    table = torch.arange(1, 1 + 2 * NUM_COLS, dtype=torch.int32).view(2, NUM_COLS)
    keys = torch.from_numpy(row_keys_np(np.arange(2, dtype=np.uint64), np.zeros(2)))
    temperature = torch.tensor([0.7, 1.3])
    for proposer in (on_gpu, on_cpu):
        for row, prompt in enumerate(prompts):
            proposer.add_request(row, prompt)
    for i, chunks in enumerate(two_request_steps(prompts)):
        step = verified_step(chunks, table)
        gpu_params = RandomParams(noise_keys=keys.cuda(), temperature=temperature.cuda())
        cpu_params = RandomParams(noise_keys=keys, temperature=temperature)
        gpu_step = _on(step, "cuda", gpu_params)
        if i == 0:  # the first call compiles and allocates
            drafts = on_gpu.propose(gpu_step)
        else:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                drafts = on_gpu.propose(gpu_step)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        expected = on_cpu.propose(_on(step, "cpu", cpu_params))
        assert torch.equal(drafts.token_ids.cpu(), expected.token_ids), f"step {i}"
        assert drafts.num_drafts.tolist() == [K, K]
        if method == "probabilistic":
            torch.testing.assert_close(drafts.probs.cpu(), expected.probs, atol=1e-5, rtol=1e-4)


def _captured(proposer: DraftModelProposer, shapes: list[tuple[int, int]]) -> DraftGraphs:
    """The proposer's graphs of these shapes over its cache, captured as the runner does (a side
    stream, inference mode)."""
    graphs = proposer.new_graphs(proposer.kv_caches, shapes)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(stream):
        graphs.capture(torch.cuda.graph_pool_handle())
    torch.cuda.current_stream().wait_stream(stream)
    return graphs


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
@pytest.mark.parametrize("num_requests", [2, 3], ids=["unpadded", "padded"])
def test_graph_replays_draft_as_the_eager_proposer(tmp_path, method: str, num_requests: int):
    """Two proposers of the same draft over the same steps (ragged ones, then uniform ones,
    whose first forward replays too; 2 requests replay the graphs of 2 sequences, 3 those of
    4), k 3, 3, 2, 3: the one replaying its graphs of SHAPES drafts the eager one's tokens (and
    q), with no host sync after the first proposal; every single step replays."""
    target, draft = tmp_path / "target", tmp_path / "draft"
    save_tiny_model(target, "llama", seed=1)
    save_tiny_model(draft, "qwen3", seed=2)
    eager = _proposer(target, draft, "cuda", draft_sample_method=method)
    replayed = _proposer(target, draft, "cuda", draft_sample_method=method)
    graphs = _captured(replayed, SHAPES)
    replays = count_draft_replays(graphs)
    prompts = random_prompts(num_requests, 6, 14, seed=3)
    table = torch.arange(1, 1 + num_requests * NUM_COLS, dtype=torch.int32)
    table = table.view(num_requests, NUM_COLS)
    rows = np.arange(num_requests, dtype=np.uint64)
    keys = torch.from_numpy(row_keys_np(rows, np.zeros(num_requests))).cuda()
    temperature = torch.linspace(0.7, 1.3, num_requests).cuda()
    for proposer in (eager, replayed):
        for row, prompt in enumerate(prompts):
            proposer.add_request(row, prompt)
    steps = request_steps(num_requests, prompts)
    for i, (chunks, k) in enumerate(zip(steps, KS, strict=True)):
        params = RandomParams(noise_keys=keys, temperature=temperature)
        step = _on(verified_step(chunks, table), "cuda", params)
        expected = eager.propose(step, k)
        torch.cuda.synchronize()
        if i > 0:  # the first call allocates
            torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.inference_mode():
                drafts = replayed.propose(replace(step, graphs=graphs), k)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(drafts.token_ids, expected.token_ids), f"step {i}"
        assert torch.equal(drafts.num_drafts, expected.num_drafts), f"step {i}"
        if method == "probabilistic":
            torch.testing.assert_close(drafts.probs, expected.probs, atol=1e-5, rtol=1e-4)
    assert replays == expected_replays(num_requests), replays


def _tokens(llm, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("draft_family", ["target", "qwen3"])
def test_engine_with_draft_graphs_gives_eager_and_plain_tokens(tmp_path, draft_family: str):
    """float32 on CUDA, k = 3, batches of 1 and 3 (the draft's graphs of 4 rows): greedy tokens
    with the draft's graphs equal those under enforce_eager and without speculation, with the
    same drafts accepted as the eager engine (the drafts are the same); the draft's graphs
    replay. draft "target": the target drafts for itself (every draft accepted: uniform
    steps); "qwen3": another tiny model (most rejected)."""
    from pagedlm import LLM, SamplingParams

    target = tmp_path / "target"
    save_tiny_model(target, "llama", seed=1)
    draft = target
    if draft_family != "target":
        draft = tmp_path / "draft"
        save_tiny_model(draft, draft_family, seed=2)
    kwargs = dict(skip_tokenizer_init=True, dtype="float32", device="cuda", max_model_len=256,
                  num_gpu_blocks_override=256, max_num_seqs=8)  # fmt: skip
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 9, 40, seed=4)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(target), **kwargs)
    want = [_tokens(plain, prompts[:1], params), _tokens(plain, prompts, params)]
    plain.shutdown()
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": K}
    accepted = {}
    for eager in (True, False):
        llm = LLM(str(target), speculative_config=spec, enforce_eager=eager, **kwargs)
        runner = llm.llm_engine.engine_core.model_runner
        replays = [] if eager else count_draft_replays(runner.graphs.draft)
        got = [_tokens(llm, prompts[:1], params), _tokens(llm, prompts, params)]
        assert got == want, f"enforce_eager={eager}"
        counters = llm.llm_engine.engine_core.scheduler.spec.counters
        accepted[eager] = (counters.num_draft_tokens, counters.num_accepted_tokens)
        if not eager:  # single steps and uniform first forwards, of 1 and 4 sequences
            assert {(1, 1), (4, 1), (1, K + 2), (4, K + 2)} <= set(replays), replays
        llm.shutdown()
    assert accepted[False] == accepted[True], accepted
    if draft_family == "target":
        assert accepted[True][0] == accepted[True][1] > 0, accepted
