"""Speculative decoding's device pieces on CUDA: no host sync (set_sync_debug_mode("error")), and
the same verdicts as on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.sampler import RandomParams, SamplingBatch
from pagedlm.spec_decode.ngram_device import propose_ngram_device
from pagedlm.spec_decode.rejection_sampler import rejection_sample

pytestmark = pytest.mark.gpu


def _inputs(device: str) -> tuple:
    generator = torch.Generator().manual_seed(0)
    num_drafts = torch.tensor([0, 3, 1, 3, 2])
    cu = num_drafts.cumsum(0)
    num_rows = int(num_drafts.sum()) + len(num_drafts)
    logits = torch.randn(num_rows, 1000, generator=generator)
    drafts = logits.argmax(dim=-1)[: int(num_drafts.sum())].clone()
    drafts[::3] = 7
    keys = torch.from_numpy(row_keys_np(np.arange(num_rows, dtype=np.uint64), np.zeros(num_rows)))
    greedy = torch.tensor([i % 2 == 0 for i in range(num_rows)])
    batch = SamplingBatch(
        random=RandomParams(noise_keys=keys.to(device), is_greedy=greedy.to(device))
    )
    return logits.to(device), drafts.to(device), cu.to(device), batch


def test_rejection_sampling_and_device_ngram_make_no_sync() -> None:
    logits, drafts, cu, batch = _inputs("cuda")
    table = torch.randint(0, 5, (8, 256), device="cuda", dtype=torch.int32)
    lengths = torch.full((8,), 200, device="cuda", dtype=torch.int64)
    rejection_sample(logits.clone(), drafts, cu, 3, batch)  # warm caches and allocations
    propose_ngram_device(table, lengths, 4, 2, 5)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = rejection_sample(logits.clone(), drafts, cu, 3, batch)
        propose_ngram_device(table, lengths, 4, 2, 5)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu = rejection_sample(*_cpu(logits, drafts, cu, batch))
    assert torch.equal(out.token_ids.cpu(), cpu.token_ids)


def _cpu(logits, drafts, cu, batch) -> tuple:
    params = batch.random
    cpu_batch = SamplingBatch(
        random=RandomParams(noise_keys=params.noise_keys.cpu(), is_greedy=params.is_greedy.cpu())
    )
    return logits.cpu().clone(), drafts.cpu(), cu.cpu(), 3, cpu_batch


def test_engine_greedy_equals_plain_on_cuda(tmp_path) -> None:
    """float32 on CUDA: spec steps (piecewise graphs, the device n-gram, the Triton scan) give
    plain decoding's greedy tokens (decode graphs), sync and async."""
    from tiny_hf_models import save_tiny_model

    from pagedlm import LLM, SamplingParams

    save_tiny_model(tmp_path, "llama")
    kwargs = dict(skip_tokenizer_init=True, dtype="float32", device="cuda", max_model_len=256,
                  num_gpu_blocks_override=128, max_num_seqs=8)  # fmt: skip
    rng = np.random.default_rng(0)
    prompts = []
    for length in (40, 17, 56, 33, 9):
        phrase = rng.integers(3, 256, size=int(rng.integers(2, 6))).tolist()
        prompts.append({"prompt_token_ids": (phrase * length)[:length]})
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(str(tmp_path), **kwargs).generate(prompts, params)]
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}  # fmt: skip
    for async_scheduling in (False, True):
        llm = LLM(
            str(tmp_path), speculative_config=spec, async_scheduling=async_scheduling, **kwargs
        )
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert got == want
        counters = llm.llm_engine.engine_core.scheduler.spec.counters
        assert counters.num_drafts > 10 and counters.num_accepted_tokens > 0, counters


def test_uniform_steps_replay_full_graphs_as_eager(tmp_path) -> None:
    """float32 on CUDA: a draft model equal to the target drafts k = 3 tokens a step, all
    accepted, so decoding steps are uniform (1 + 3 tokens a request) and replay the full graphs
    (worker/spec_graphs.py; batch 3 pads to the graph of 4): greedy tokens equal plain
    decoding's; with synthetic acceptance (rejections: shorter tails, other shapes) the graphs
    give the tokens of the same engine run eagerly."""
    from tiny_hf_models import save_tiny_model

    from pagedlm import LLM, SamplingParams

    save_tiny_model(tmp_path, "llama")
    kwargs = dict(skip_tokenizer_init=True, dtype="float32", device="cuda", max_model_len=256,
                  num_gpu_blocks_override=256, max_num_seqs=8)  # fmt: skip
    rng = np.random.default_rng(1)
    prompts = [{"prompt_token_ids": rng.integers(3, 256, size=n).tolist()} for n in (21, 9, 40)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    def tokens(llm, batch) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]

    plain = LLM(str(tmp_path), **kwargs)
    want = {1: tokens(plain, prompts[:1]), 3: tokens(plain, prompts)}
    plain.shutdown()
    draft = {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3}
    llm = LLM(str(tmp_path), speculative_config=draft, **kwargs)
    replays = count_spec_replays(llm.llm_engine.engine_core.model_runner)
    assert tokens(llm, prompts[:1]) == want[1] and tokens(llm, prompts) == want[3]
    assert {(1, 4), (4, 4)} <= set(replays), replays
    counters = llm.llm_engine.engine_core.scheduler.spec.counters
    assert counters.num_accepted_tokens == counters.num_draft_tokens > 0, counters
    llm.shutdown()
    synthetic = {"method": "ngram", "num_speculative_tokens": 3,
                 "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": 0.6}  # fmt: skip
    got = {}
    for eager in (True, False):
        llm = LLM(str(tmp_path), speculative_config=synthetic, enforce_eager=eager, **kwargs)
        replays = [] if eager else count_spec_replays(llm.llm_engine.engine_core.model_runner)
        got[eager] = tokens(llm, prompts)
        llm.shutdown()
    assert got[False] == got[True]
    assert len(replays) >= 5, replays


def count_spec_replays(runner) -> list[tuple[int, int]]:
    """The shapes the runner's uniform speculative graphs replay from now on, appended."""
    spec_graphs = runner.graphs.spec
    replays, replay = [], spec_graphs.replay

    def counted(shape: tuple[int, int]) -> torch.Tensor:
        replays.append(shape)
        return replay(shape)

    spec_graphs.replay = counted
    return replays
