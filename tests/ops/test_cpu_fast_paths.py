"""The CPU's fewer-call forms of rotary and the KV-cache write against their references, bit for
bit, on fresh random inputs (the cache poisoned with NaN beforehand)."""

from __future__ import annotations

import pytest
import torch

from pagedlm.attention.torch_ref import write_kv_cache, write_kv_cache_cpu
from pagedlm.ops.rotary import rotary_embedding_torch, rotate_heads_cpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 7])
def test_rotate_heads_is_the_reference_bit_for_bit(dtype: torch.dtype, num_tokens: int) -> None:
    gen = torch.Generator().manual_seed(num_tokens)
    num_heads, num_kv_heads, head_dim = 9, 3, 64
    # q, k and v heads side by side, as prepare_qkv's qkv rows hold them
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=gen).to(dtype)
    freqs = torch.rand(256, head_dim // 2, generator=gen) * 100
    cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # [256, head_dim] float32
    positions = torch.randint(0, 256, (num_tokens,), generator=gen)
    qk = qkv[:, : num_heads + num_kv_heads]
    want_q, want_k = rotary_embedding_torch(
        positions, qk[:, :num_heads], qk[:, num_heads:], cos_sin_cache
    )
    got = rotate_heads_cpu(positions, qk, cos_sin_cache)
    assert got.dtype == dtype
    assert torch.equal(got[:, :num_heads], want_q) and torch.equal(got[:, num_heads:], want_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding", [False, True])
def test_cache_write_is_the_reference(dtype: torch.dtype, padding: bool) -> None:
    gen = torch.Generator().manual_seed(int(padding))
    num_tokens, num_kv_heads, head_dim, num_blocks, block_size = 6, 2, 16, 4, 8
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    if padding:
        slots[-2:] = -1
    want = torch.full(
        (2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype
    )
    got = want.clone()
    write_kv_cache(k, v, want, slots)
    write_kv_cache_cpu(k, v, got, slots)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert got.isnan().sum() == want.numel() - 2 * (num_tokens - 2 * padding) * k[0].numel()
