"""The profiling step that sizes the KV cache (pagedlm/worker/memory.py): the runner's largest batch,
run once on a KV cache of its own, with every costly sampling feature on."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pagedlm.core.sched_output import NewRequestData, SchedulerOutput
from pagedlm.sampling_params import MAX_LOGPROBS, SamplingParams
from pagedlm.worker.input_batch import cdiv

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner


def profile_run(runner: ModelRunner) -> int:
    """One step of the largest batch (max_num_batched_tokens tokens over up to max_num_seqs
    sampling requests, with top-k/top-p and logprobs) on a KV cache of its own; returns that
    cache's bytes."""
    max_model_len = runner.config.model.max_model_len
    num_tokens = min(runner.max_num_tokens, runner.max_num_reqs * max_model_len)
    num_seqs = min(runner.max_num_reqs, num_tokens)
    seq_lens = np.full(num_seqs, num_tokens // num_seqs)
    seq_lens[:num_tokens % num_seqs] += 1
    first_blocks = np.concatenate([[0], np.cumsum(cdiv(seq_lens, runner.block_size))])
    cache = runner._new_kv_cache(int(first_blocks[-1]))
    saved = runner.kv_caches, runner.input_batch.num_kv_blocks, runner.graphs, runner.piecewise
    runner.kv_caches, runner.graphs, runner.piecewise = [cache] * runner.config.model.num_layers, None, None  # eager
    runner.input_batch.num_kv_blocks = int(first_blocks[-1])
    # a fixed seed: the sampler draws no seed from its generator for these requests
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, logprobs=MAX_LOGPROBS, seed=0)
    req_ids = [f"_profile_{i}" for i in range(num_seqs)]
    new_reqs = [NewRequestData(req_id=req_id, prompt_token_ids=[0] * int(seq_len),
                               output_token_ids=[], sampling_params=params,
                               block_ids=list(range(first_blocks[i], first_blocks[i + 1])),
                               num_computed_tokens=0)
                for i, (req_id, seq_len) in enumerate(zip(req_ids, seq_lens.tolist()))]  # sync-ok: numpy
    sched = SchedulerOutput(new_reqs=new_reqs, cached_reqs=[],
                            num_scheduled_tokens=dict(zip(req_ids, seq_lens.tolist())),  # sync-ok: numpy
                            total_num_scheduled_tokens=num_tokens, sampling_req_ids=set(req_ids))
    runner.execute_model(sched).get_output()
    runner.execute_model(SchedulerOutput(new_reqs=[], cached_reqs=[], num_scheduled_tokens={},
                                       total_num_scheduled_tokens=0,
                                       finished_req_ids=set(req_ids)))
    runner.kv_caches, runner.input_batch.num_kv_blocks, runner.graphs, runner.piecewise = saved
    return cache.numel() * cache.element_size()
