"""The profiling step that sizes the KV cache (pagedlm/worker/memory.py): the runner's largest batch,
run once on a KV cache of its own, with every costly sampling feature on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlm.sampling_params import MAX_LOGPROBS, SamplingParams
from pagedlm.worker.input_batch import cdiv

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner


def profile_run(runner: ModelRunner) -> int:
    """One step of the largest batch (max_num_batched_tokens tokens over up to max_num_seqs
    sampling requests, with top-k/top-p and logprobs) on a KV cache of its own; returns that
    cache's bytes."""
    model = runner.config.model
    num_tokens = min(runner.max_num_tokens, runner.max_num_reqs * model.max_model_len)
    num_seqs = min(runner.max_num_reqs, num_tokens)
    seq_lens = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
    num_blocks = sum(cdiv(seq_len, runner.block_size) for seq_len in seq_lens)
    # a fixed seed: the sampler draws no seed from its generator for these requests
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, logprobs=MAX_LOGPROBS, seed=0)
    with runner.dummy_steps(kv_cache_blocks=num_blocks) as steps:  # eager, on that cache
        req_ids = [steps.add(seq_len, params, num_decodes=0) for seq_len in seq_lens]
        steps.step(dict(zip(req_ids, seq_lens)))
    return steps.kv_cache_bytes
