"""A small seeded fuzz of the Triton kernels against their references (TRITON_INTERPRET=1 on CPU):
random ragged batches mixing decodes and unaligned prefill chunks (GQA 1-8 and 3, windows narrower
and wider than the context, shuffled block tables, padding rows that must stay NaN, marked leading
decodes in a random launch order), the split decode around its chunking, prepare_qkv with padding
slots, and the GEMV at M 1-8 with K off the block (split K, SiLU prologue, residual epilogue, norm
prologue). Each case is a fresh random draw from a fixed seed, so a failure names its reproducer.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from test_triton_paged import DEVICE, check_output, make_batch, write_cache

from pagedlm.attention.prepare_qkv import prepare_qkv_torch, prepare_qkv_triton
from pagedlm.attention.triton_backend import TritonAttentionBackend
from pagedlm.attention.triton_decode import split_decode_attention
from pagedlm.attention.triton_paged import varlen_attention
from pagedlm.model.layers import RotaryEmbedding
from pagedlm.ops.gemv import GemvConfig, PendingNorm, gemv_torch, gemv_triton

NUM_VARLEN_CASES = 14
NUM_SPLIT_CASES = 6
NUM_GEMV_CASES = 10


pytestmark = pytest.mark.usefixtures("nan_poisoned_empty")  # tests/conftest.py


def random_varlen_case(seed: int) -> dict:
    """Leading decodes (one query each, some marked as num_decodes), then prefill chunks of 2..40
    tokens starting anywhere in a block, then a few sequences with no query (graph padding)."""
    rng = random.Random(seed)
    num_kv_heads = rng.choice([1, 2])
    group = rng.choice([1, 2, 3, 4, 8])
    num_decodes, num_chunks = rng.randint(0, 4), rng.randint(0 if seed % 3 else 1, 3)
    ctx_lens = [rng.randint(0, 90) for _ in range(num_decodes + num_chunks)]
    query_lens = [1] * num_decodes + [rng.randint(2, 40) for _ in range(num_chunks)]
    if num_decodes + num_chunks == 0 or rng.random() < 0.3:  # trailing padding sequences
        ctx_lens += [0]
        query_lens += [0]
    seq_lens = [c + n for c, n in zip(ctx_lens, query_lens)]
    window = rng.choice([None, rng.randint(1, 12), rng.randint(20, 200)])
    return dict(
        ctx_lens=ctx_lens,
        query_lens=query_lens,
        num_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=rng.choice([32, 64, 128]),
        block_size=rng.choice([16, 32]),
        dtype=rng.choice([torch.float32, torch.float16]),
        num_pad_tokens=rng.randint(0, 3),
        window=window if window is None or window < max(seq_lens) or rng.random() < 0.5 else None,
        num_marked=rng.randint(0, num_decodes),
        shuffle_order=rng.random() < 0.5,
    )


@pytest.mark.parametrize("seed", range(NUM_VARLEN_CASES))
def test_fuzz_varlen_attention(seed: int) -> None:
    case = random_varlen_case(seed)
    torch.manual_seed(seed)
    batch = make_batch(
        case["ctx_lens"],
        case["query_lens"],
        num_heads=case["num_heads"],
        num_kv_heads=case["num_kv_heads"],
        head_dim=case["head_dim"],
        block_size=case["block_size"],
        dtype=case["dtype"],
        num_pad_tokens=case["num_pad_tokens"],
    )
    write_cache(batch)
    meta, scale = batch.meta, case["head_dim"] ** -0.5
    num_marked = meta.num_seqs if meta.max_query_len <= 1 else case["num_marked"]
    if num_marked:
        order = torch.randperm(num_marked) if case["shuffle_order"] else torch.arange(num_marked)
        meta = dataclasses.replace(
            meta, num_decodes=num_marked, decode_order=order.to(torch.int32).to(DEVICE)
        )
    out = varlen_attention(
        batch.q, batch.kv_cache, meta, scale, case["window"], out=torch.full_like(batch.q, math.nan)
    )
    check_output(out, batch, scale, case["window"])


@pytest.mark.parametrize("seed", range(NUM_SPLIT_CASES))
def test_fuzz_split_decode(seed: int) -> None:
    """Decode-only batches with contexts around the split's tile chunking (64 keys), 1-32 splits."""
    rng = random.Random(1000 + seed)
    num_seqs = rng.randint(1, 4)
    num_kv_heads, group = rng.choice([1, 2]), rng.choice([1, 2, 3, 4, 8])
    ctx_lens = [
        rng.choice([0, 1, 62, 63, 64, 127, 128, rng.randint(0, 300)]) for _ in range(num_seqs)
    ]
    query_lens = [1 if rng.random() < 0.85 else 0 for _ in range(num_seqs)]
    query_lens[0] = 1
    window = rng.choice([None, rng.randint(1, 70), 1000])
    torch.manual_seed(1000 + seed)
    batch = make_batch(
        ctx_lens,
        query_lens,
        num_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=rng.choice([32, 64, 128]),
        block_size=rng.choice([16, 32]),
        dtype=rng.choice([torch.float32, torch.float16]),
        num_pad_tokens=rng.randint(0, 2),
    )
    write_cache(batch)
    out = split_decode_attention(
        batch.q,
        batch.kv_cache,
        batch.meta,
        0.3,
        window,
        rng.choice([1, 2, 3, 5, 32]),
        out=torch.full_like(batch.q, math.nan),
    )
    check_output(out, batch, 0.3, window)


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_prepare_qkv_padding_slots(seed: int) -> None:
    """The fused kernel writes exactly the torch path's slots (the pool's last block included) and
    nothing for slot -1; q matches on every row, padding rows included."""
    rng = random.Random(2000 + seed)
    num_tokens, num_kv_heads, group = (
        rng.randint(1, 12),
        rng.choice([1, 2, 3]),
        rng.choice([1, 2, 4]),
    )
    num_kv_heads = (
        3 if seed == 0 else num_kv_heads
    )  # a count that is not a power of two, always once
    head_dim, block_size = rng.choice([32, 64, 128]), rng.choice([16, 32])
    dtype = rng.choice([torch.float32, torch.float16])
    gen = torch.Generator().manual_seed(seed)
    num_blocks = num_tokens + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[0] = num_blocks * block_size - 1  # the pool's last slot
    slots[torch.rand(num_tokens, generator=gen) < 0.4] = -1
    rotary = RotaryEmbedding(head_dim, 256, 10000.0, None, torch.float32)
    width = (group * num_kv_heads + 2 * num_kv_heads) * head_dim
    qk_norm = (
        None
        if seed % 2
        else tuple((torch.rand(head_dim, generator=gen) + 0.5).to(dtype) for _ in range(2))
    )
    inputs = dict(
        qkv=torch.randn(num_tokens, width, generator=gen).to(dtype),
        positions=torch.randint(256, (num_tokens,), generator=gen),
        cos_sin_cache=rotary.cos_sin_cache,
        qk_norm=qk_norm,
        eps=1e-6,
        slot_mapping=slots,
        num_heads=group * num_kv_heads,
    )
    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), math.nan, dtype=dtype)
    cache_ref = cache.clone()
    q = prepare_qkv_triton(kv_cache=cache, **inputs)
    q_ref = prepare_qkv_torch(kv_cache=cache_ref, **inputs)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(q, q_ref, **tol)
    torch.testing.assert_close(cache, cache_ref, equal_nan=True, **tol)
    assert cache.isnan().sum() == cache_ref.isnan().sum()


GEMV_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2)}


def random_gemv_config(rng: random.Random, dtype: torch.dtype) -> GemvConfig | None:
    if rng.random() < 0.3:
        return None  # default_config
    use_dot = rng.random() < 0.5
    return GemvConfig(
        block_n=rng.choice([16, 32]),
        block_k=rng.choice([16, 32, 64]),
        split_k=rng.choice([1, 2, 3, 8]),
        num_warps=rng.choice([1, 2, 4]),
        use_dot=use_dot,
    )


@pytest.mark.parametrize("seed", range(NUM_GEMV_CASES))
def test_fuzz_gemv(seed: int) -> None:
    """y = x @ W.T + b with a random fusion: against float64 (SiLU input rounded first) or, for the
    norm prologue, against gemv_torch; the residual epilogue's h and sumsq against their definitions."""
    rng = random.Random(3000 + seed)
    num_rows, n, k = rng.randint(1, 8), rng.randint(1, 70), rng.randint(1, 150)
    dtype = rng.choice([torch.float32, torch.float16])
    fusion = rng.choice(["none", "silu", "residual", "norm"])
    torch.manual_seed(3000 + seed)
    x = torch.randn(num_rows, 2 * k if fusion == "silu" else k).to(dtype)
    weight = (torch.randn(n, k) / math.sqrt(k)).to(dtype)
    bias = torch.randn(n).to(dtype) if rng.random() < 0.5 else None
    config = random_gemv_config(rng, dtype)
    if fusion == "norm":
        h = torch.randn(num_rows, k).to(dtype)
        cuts = sorted(rng.sample(range(1, k), min(rng.randint(0, 4), k - 1)))
        sumsq = torch.stack(
            [part.float().square().sum(1) for part in h.tensor_split(cuts, dim=1)], 1
        )
        x = PendingNorm(h, sumsq.contiguous(), (1 + torch.randn(k) / 4).to(dtype), 1e-5)
        out = gemv_triton(x, weight, bias, config=config)
        torch.testing.assert_close(out, gemv_torch(x, weight, bias), **GEMV_TOL[dtype])
        return
    act = "silu_and_mul" if fusion == "silu" else None
    residual = torch.randn(num_rows, n).to(dtype) if fusion == "residual" else None
    result = gemv_triton(x, weight, bias, act=act, residual=residual, config=config)
    ref_x = x
    if act:
        gate, up = x.double().chunk(2, dim=-1)
        ref_x = (torch.nn.functional.silu(gate) * up).to(dtype)
    ref = ref_x.double() @ weight.double().T + (0 if bias is None else bias.double())
    y = result if residual is None else result.h
    if residual is not None:
        ref = ref + residual.double()
        torch.testing.assert_close(
            result.sumsq.sum(1), result.h.float().square().sum(1), rtol=1e-4, atol=1e-4
        )
    assert not y.isnan().any()
    torch.testing.assert_close(y.double(), ref, **GEMV_TOL[dtype])


@pytest.mark.parametrize("head_dim", [80, 8, 512])
def test_triton_backend_refuses_head_dims_its_kernels_cannot_tile(head_dim: int) -> None:
    batch = make_batch(
        [5], [1], num_heads=2, num_kv_heads=1, head_dim=16, block_size=16, dtype=torch.float32
    )
    q = torch.zeros(1, 2, head_dim)
    kv_cache = torch.zeros(2, 4, 16, 1, head_dim)
    with pytest.raises(ValueError, match="head_dim must be a power of two in \\[16, 256\\]"):
        TritonAttentionBackend().attend(q, kv_cache, batch.meta, 0.1, None)
