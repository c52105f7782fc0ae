"""prepare_qkv: the fused Triton kernel (interpreter here, the real one on CUDA) against the torch
path (split, pagedlm.ops norm and rotary, torch_ref's cache write), which the model parity tests
check against transformers. Caches are NaN-poisoned: unwritten slots must stay NaN."""

from __future__ import annotations

import pytest
import torch
from row_errors import row_rel_errors

from pagedlm.attention.prepare_qkv import prepare_qkv, prepare_qkv_torch, prepare_qkv_triton
from pagedlm.model.layers import RotaryEmbedding

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


def make_inputs(
    num_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    device: str = "cpu",
) -> dict:
    gen = torch.Generator().manual_seed(seed)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    num_blocks = 2 * num_tokens // block_size + 3
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1  # padding rows
    rotary = RotaryEmbedding(head_dim, 512, 10000.0, None, torch.float32)
    weights = (torch.rand(head_dim, generator=gen) + 0.5, torch.rand(head_dim, generator=gen) + 0.5)
    return dict(
        qkv=(torch.randn(num_tokens, width, generator=gen) * 3).to(dtype).to(device),
        positions=torch.randint(512, (num_tokens,), generator=gen).to(device),
        cos_sin_cache=rotary.cos_sin_cache.to(device),
        qk_norm=tuple(w.to(dtype).to(device) for w in weights),
        eps=1e-6,
        kv_cache=torch.full(
            (2, num_blocks, block_size, num_kv_heads, head_dim),
            float("nan"),
            dtype=dtype,
            device=device,
        ),
        slot_mapping=slots.to(device),
        num_heads=num_heads,
    )


def run_both(
    inputs: dict,
    fused,
    reference_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_fused, cache_fused, q_torch, cache_torch): each path on its own poisoned cache; the torch
    path in reference_dtype when given (its inputs are the same values, upcast)."""
    dtype = reference_dtype or inputs["qkv"].dtype
    torch_inputs = dict(
        inputs,
        qkv=inputs["qkv"].to(dtype),
        kv_cache=inputs["kv_cache"].to(dtype, copy=True),
        qk_norm=None
        if inputs["qk_norm"] is None
        else tuple(w.to(dtype) for w in inputs["qk_norm"]),
    )
    q_fused = fused(**inputs)
    q_torch = prepare_qkv_torch(**torch_inputs)
    return q_fused, inputs["kv_cache"], q_torch, torch_inputs["kv_cache"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize(
    "heads", [(4, 2, 16), (8, 1, 64), (2, 2, 128)]
)  # (num_heads, num_kv_heads, head_dim)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.usefixtures("nan_poisoned_empty")  # q's output starts as NaN (tests/conftest.py)
def test_triton_matches_torch(
    dtype: torch.dtype, qk_norm: bool, heads: tuple[int, int, int], block_size: int
) -> None:
    num_heads, num_kv_heads, head_dim = heads
    inputs = make_inputs(
        9, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=head_dim + block_size
    )
    if not qk_norm:
        inputs["qk_norm"] = None
    q, cache, q_ref, cache_ref = run_both(inputs, prepare_qkv_triton)
    assert q.shape == (9, num_heads, head_dim) and q.dtype == dtype
    torch.testing.assert_close(q, q_ref, **TOL[dtype])
    torch.testing.assert_close(cache, cache_ref, equal_nan=True, **TOL[dtype])
    written = inputs["slot_mapping"] >= 0
    assert (
        cache.view(2, -1, num_kv_heads, head_dim)[:, inputs["slot_mapping"][written]]
        .isfinite()
        .all()
    )
    assert (
        cache.isnan().sum()
        == 2 * (cache.shape[1] * block_size - written.sum()) * num_kv_heads * head_dim
    )


def test_values_are_copied_unchanged_and_keys_rotated() -> None:
    """v goes to the cache bit for bit; k at position 0 only gets the norm (cos 1, sin 0)."""
    inputs = make_inputs(5, 4, 2, 16, 16, torch.float32, seed=3)
    inputs["positions"].zero_()
    inputs["slot_mapping"] = torch.arange(5)
    prepare_qkv_triton(**inputs)
    qkv, cache = inputs["qkv"], inputs["kv_cache"]
    values = qkv[:, 6 * 16 :].view(5, 2, 16)
    torch.testing.assert_close(cache[1].view(-1, 2, 16)[:5], values, rtol=0, atol=0)
    keys = qkv[:, 4 * 16 : 6 * 16].view(5, 2, 16)
    want = keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True) + 1e-6) * inputs["qk_norm"][1]
    torch.testing.assert_close(cache[0].view(-1, 2, 16)[:5], want)


def test_rejects_bad_input() -> None:
    inputs = make_inputs(4, 4, 2, 16, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="qkv must be"):
        prepare_qkv(**dict(inputs, qkv=inputs["qkv"][:, :-16]))
    with pytest.raises(ValueError, match="positions and slot_mapping"):
        prepare_qkv(**dict(inputs, slot_mapping=inputs["slot_mapping"][:3]))
    with pytest.raises(ValueError, match="cos_sin_cache"):
        prepare_qkv(**dict(inputs, cos_sin_cache=inputs["cos_sin_cache"][:, :8]))
    odd = make_inputs(4, 2, 1, 24, 16, torch.float32, seed=2)
    with pytest.raises(ValueError, match="power of two"):
        prepare_qkv_triton(**odd)
    prepare_qkv(**odd)  # the torch path takes any even head_dim


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [(16, 8, 128, True), (32, 8, 128, False), (9, 3, 64, False)])
def test_prepare_qkv_gpu(dtype: torch.dtype, heads: tuple[int, int, int, bool]) -> None:
    num_heads, num_kv_heads, head_dim, qk_norm = heads
    inputs = make_inputs(
        4096, num_heads, num_kv_heads, head_dim, 16, dtype, seed=num_heads, device="cuda"
    )
    if not qk_norm:
        inputs["qk_norm"] = None
    q, cache, q_ref, cache_ref = run_both(inputs, prepare_qkv, reference_dtype=torch.float32)
    assert q_ref.dtype == cache_ref.dtype == torch.float32
    assert (
        cache.isnan() == cache_ref.isnan()
    ).all()  # the slots nobody writes stay poisoned in both
    for out, ref in ((q, q_ref), (cache, cache_ref)):
        written = ~ref.isnan().any(dim=-1)  # [...]: rows (a token's head)
        errors = row_rel_errors(
            out[written], ref[written]
        )  # per row: a whole-tensor norm hides a few wrong ones
        assert written.sum() >= 4096 and (errors <= 1e-2).all(), errors.max()
