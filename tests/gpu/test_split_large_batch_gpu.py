"""The split decode of a large batch on a real GPU (issue 31): one long context among many short ones,
the longest sequences split, in LPT order as the runner launches them, against an fp32 reference, and
over repeated launches (the counters' reset under real concurrency). Skipped without CUDA."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from test_kernels_gpu import assert_rel_error, helpers

from pagedlm.attention import triton_backend
from pagedlm.attention.triton_backend import TritonAttentionBackend, decode_split
from pagedlm.attention.triton_decode import split_decode_attention
from pagedlm.ops.counters import zeroed_counters

pytestmark = pytest.mark.gpu


def skewed_batch(dtype: torch.dtype, window: int | None):
    """300 sequences of 5-400 keys, one of 7,800 and one of 3,000, shuffled; llama3-8b heads."""
    rng = random.Random(f"skewed-{dtype}-{window}")
    ctx_lens = [rng.randint(5, 400) for _ in range(300)]
    ctx_lens[rng.randrange(300)], ctx_lens[rng.randrange(300)] = 7800, 3000
    batch = helpers.make_batch(
        ctx_lens,
        [1] * len(ctx_lens),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=dtype,
        num_pad_tokens=3,
        device="cuda",
    )
    helpers.write_cache(batch)
    order = helpers.lpt_order(batch.meta.seq_lens_cpu).cuda()
    return batch, dataclasses.replace(batch.meta, decode_order=order)


@pytest.mark.parametrize("window", [None, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_large_skewed_batch_splits_its_longest(
    dtype: torch.dtype, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triton_backend, "SPLIT_LARGE_BATCHES", True)  # PAGEDLM_SPLIT_LARGE_DECODE=1
    batch, meta = skewed_batch(dtype, window)
    graph_meta = dataclasses.replace(meta, max_seq_len=8192)  # as a CUDA graph captures it
    split = decode_split(meta.num_seqs, batch.kv_cache, graph_meta.max_seq_len)
    assert split.num_splits == 4 and split.split_seqs == 38, split
    scale = 128**-0.5
    ref = helpers.reference_attention(batch, scale, window, dtype=torch.float32)
    num_real = meta.num_seqs
    first = None
    for _ in range(3):  # the same launch again: every counter back at zero in between
        out = TritonAttentionBackend().attend(
            batch.q,
            batch.kv_cache,
            graph_meta,
            scale,
            window,
            out=torch.full_like(batch.q, math.nan),
        )
        assert out[:num_real].isfinite().all() and out[num_real:].isnan().all()
        assert_rel_error(out[:num_real], ref[:num_real])
        assert not zeroed_counters(batch.q.device, 0).any()
        first = out if first is None else first
        assert torch.equal(out[:num_real], first[:num_real])  # the merge order does not matter
    unsplit = split_decode_attention(batch.q, batch.kv_cache, meta, scale, window, 1)
    assert_rel_error(unsplit[:num_real], ref[:num_real])
