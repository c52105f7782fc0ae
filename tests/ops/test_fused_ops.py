"""Fused Triton ops (interpreter on CPU) and their torch fallbacks against transformers / torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from pagedlm.ops import activation, norm, rotary

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}
DTYPES = [torch.float32, torch.float16]


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    layer = LlamaRMSNorm(x.shape[-1], eps=eps).to(device=x.device, dtype=x.dtype)
    layer.weight.data.copy_(weight)
    return layer(x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 100])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_rms_norm(dtype: torch.dtype, hidden: int, impl: str) -> None:
    x = torch.randn(3, 5, hidden, device=DEVICE).to(dtype)
    weight = (1 + 0.5 * torch.randn(hidden, device=DEVICE)).to(dtype)
    out = getattr(norm, f"rms_norm_{impl}")(x, weight, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, hf_rms_norm(x, weight, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_fused_add_rms_norm(dtype: torch.dtype, impl: str) -> None:
    x = torch.randn(7, 96, device=DEVICE).to(dtype)
    residual = torch.randn(7, 96, device=DEVICE).to(dtype)
    weight = torch.randn(96, device=DEVICE).to(dtype)
    out, new_residual = getattr(norm, f"fused_add_rms_norm_{impl}")(x, residual, weight, 1e-5)
    torch.testing.assert_close(new_residual, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(out, hf_rms_norm(x + residual, weight, 1e-5), **TOL[dtype])


def test_rms_norm_rejects_bad_weight() -> None:
    with pytest.raises(ValueError, match="weight"):
        norm.rms_norm_triton(torch.randn(2, 8, device=DEVICE), torch.ones(4, device=DEVICE), 1e-6)


def hf_cos_sin(max_position: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF Llama's rotary tables in float32: [max_position, head_dim] each, halves repeated."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_position).float(), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 24])
def test_rotary_embedding(dtype: torch.dtype, head_dim: int) -> None:
    num_tokens, num_heads, num_kv_heads, max_position = 6, 3, 2, 50
    cos, sin = hf_cos_sin(max_position, head_dim)
    cos_sin_cache = torch.cat((cos[:, : head_dim // 2], sin[:, : head_dim // 2]), dim=-1).to(DEVICE)
    # q and k as views into one fused qkv projection output: rows strided, heads contiguous
    qkv = torch.randn(num_tokens, (num_heads + num_kv_heads) * head_dim + 8, device=DEVICE).to(
        dtype
    )
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : -8].view(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(max_position, (num_tokens,), device=DEVICE)
    q_out, k_out = rotary.rotary_embedding_torch(positions, q, k, cos_sin_cache)
    pos_cpu = positions.cpu()
    q_ref, k_ref = apply_rotary_pos_emb(
        q.float().cpu(), k.float().cpu(), cos[pos_cpu], sin[pos_cpu], unsqueeze_dim=1
    )
    assert q_out.dtype == dtype and k_out.shape == k.shape
    torch.testing.assert_close(q_out.float().cpu(), q_ref, **TOL[dtype])
    torch.testing.assert_close(k_out.float().cpu(), k_ref, **TOL[dtype])


def test_rotary_rejects_bad_cache() -> None:
    q, k = torch.randn(2, 2, 8, device=DEVICE), torch.randn(2, 1, 8, device=DEVICE)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rotary.rotary_embedding_torch(
            torch.zeros(2, dtype=torch.long, device=DEVICE), q, k, torch.zeros(10, 6, device=DEVICE)
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [40, 1500])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_silu_and_mul(dtype: torch.dtype, d: int, impl: str) -> None:
    x = (2 * torch.randn(2, 3, 2 * d, device=DEVICE)).to(dtype)
    out = getattr(activation, f"silu_and_mul_{impl}")(x)
    gate, up = x.double().chunk(2, dim=-1)
    assert out.dtype == dtype and out.shape == (2, 3, d)
    torch.testing.assert_close(out.double(), F.silu(gate) * up, **TOL[dtype])


def test_public_ops_dispatch_to_the_device() -> None:
    """On CPU the public functions are the torch fallbacks; on CUDA, the Triton kernels."""
    import pagedlm.ops as ops

    x = torch.randn(4, 32, device=DEVICE)
    weight = torch.randn(32, device=DEVICE)
    expected = (norm.rms_norm_triton if x.is_cuda else norm.rms_norm_torch)(x, weight, 1e-6)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6), expected, rtol=0, atol=0)
    torch.testing.assert_close(
        ops.silu_and_mul(x), activation.silu_and_mul_torch(x), atol=1e-6, rtol=1e-6
    )
