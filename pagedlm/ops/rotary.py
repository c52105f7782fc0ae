"""Rotary position embedding, neox / HF Llama (rotate-half) style, out of place.

cos_sin_cache: [max_position, head_dim]; row p holds cos(p * inv_freq) in its first head_dim / 2
columns and sin(p * inv_freq) in the rest (inv_freq: [head_dim / 2]). For x = [x1, x2] (halves):
out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin], computed in float32 and rounded once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def rotate_heads(
    out_ptr, x_ptr, token, num_heads, stride_x_t, stride_x_h, stride_o_t, stride_o_h,
    cos, sin,  # [HALF_PAD] fp32
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Rotate every head of one token: a [BLOCK_H, HALF_PAD] tile per half."""
    offs_h = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, HALF_PAD)
    mask = (offs_h < num_heads)[:, None] & (offs < HALF)[None, :]
    src = x_ptr + token * stride_x_t + offs_h[:, None] * stride_x_h + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + token * stride_o_t + offs_h[:, None] * stride_o_h + offs[None, :]
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rotary_kernel(
    q_out_ptr, k_out_ptr,  # like q, k
    q_ptr,  # [T, num_heads, head_dim]
    k_ptr,  # [T, num_kv_heads, head_dim]
    positions_ptr,  # [T]
    cos_sin_ptr,  # [max_position, head_dim]
    num_heads, num_kv_heads, stride_cs,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h,
    stride_qo_t, stride_qo_h, stride_ko_t, stride_ko_h,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    """One program per token: q and k heads share one load of cos/sin."""
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs = tl.arange(0, HALF_PAD)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    rotate_heads(q_out_ptr, q_ptr, token, num_heads, stride_q_t, stride_q_h, stride_qo_t, stride_qo_h,
                 cos, sin, HALF, HALF_PAD, BLOCK_HQ)
    rotate_heads(k_out_ptr, k_ptr, token, num_kv_heads, stride_k_t, stride_k_h, stride_ko_t, stride_ko_h,
                 cos, sin, HALF, HALF_PAD, BLOCK_HK)


def rotary_embedding(
    positions: torch.Tensor,  # [T] int
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by their token's position; new tensors in q's and k's dtypes."""
    if q.is_cuda:
        return rotary_embedding_triton(positions, q, k, cos_sin_cache)
    return rotary_embedding_torch(positions, q, k, cos_sin_cache)


def rotary_embedding_torch(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions].float()[:, None, :].chunk(2, dim=-1)  # [T, 1, head_dim / 2]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def rotary_embedding_triton(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_rotary(positions, q, k, cos_sin_cache)
    num_tokens, num_heads, head_dim = q.shape
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    rotary_kernel[(num_tokens,)](
        q_out, k_out, q, k, positions, cos_sin_cache, num_heads, k.shape[1], cos_sin_cache.stride(0),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        HALF=half, HALF_PAD=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HK=triton.next_power_of_2(k.shape[1]), num_warps=4,
    )
    return q_out, k_out


def _check_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"q and k must be [T, num_heads, head_dim] and [T, num_kv_heads, head_dim]; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}")
    head_dim = q.shape[2]
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"head_dim must be even and cos_sin_cache [max_position, {head_dim}]; "
                         f"got head_dim {head_dim}, cos_sin_cache {tuple(cos_sin_cache.shape)}")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [{q.shape[0]}]; got {tuple(positions.shape)}")
    if q.stride(2) != 1 or k.stride(2) != 1 or cos_sin_cache.stride(1) != 1:
        raise ValueError("q, k and cos_sin_cache must have stride 1 in their last dim")
