"""Rotary position embedding, neox / HF Llama (rotate-half) style, out of place, in torch (the
reference; on CUDA the rotation is fused into pagedlm.attention.prepare_qkv's kernel).

cos_sin_cache: [max_position, head_dim]; row p holds cos(p * inv_freq) in its first head_dim / 2
columns and sin(p * inv_freq) in the rest (inv_freq: [head_dim / 2]). For x = [x1, x2] (halves):
out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin], computed in float32 and rounded once.
"""

from __future__ import annotations

import torch


def rotary_embedding_torch(
    positions: torch.Tensor,  # [T] int
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by their token's position; new tensors in q's and k's dtypes."""
    _check_rotary(positions, q, k, cos_sin_cache)
    cos, sin = cos_sin_cache[positions].float()[:, None, :].chunk(2, dim=-1)  # [T, 1, head_dim / 2]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def _check_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"q and k must be [T, num_heads, head_dim] and [T, num_kv_heads, head_dim]; "
            f"got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    head_dim = q.shape[2]
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"head_dim must be even and cos_sin_cache [max_position, {head_dim}]; "
            f"got head_dim {head_dim}, cos_sin_cache {tuple(cos_sin_cache.shape)}"
        )
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [{q.shape[0]}]; got {tuple(positions.shape)}")
    if q.stride(2) != 1 or k.stride(2) != 1 or cos_sin_cache.stride(1) != 1:
        raise ValueError("q, k and cos_sin_cache must have stride 1 in their last dim")


def rotate_heads_cpu(
    positions: torch.Tensor,  # [T] int
    heads: torch.Tensor,  # [T, H, head_dim], stride 1 in its last dim (q and k heads side by side)
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim] float32
) -> torch.Tensor:  # [T, H, head_dim] in heads' dtype, a new tensor
    """rotary_embedding_torch's result, bit for bit, in 7 torch calls instead of ~24: q and k
    heads in one pass, the halves as a [2, head_dim / 2] view (no chunk, no cat), the products
    in float32 (a 16-bit operand times float32 promotes exactly as .float() does)."""
    num_tokens, num_heads, head_dim = heads.shape
    half = head_dim // 2
    table = cos_sin_cache.index_select(0, positions).view(num_tokens, 1, 2, half)
    cos, sin = table[:, :, :1], table[:, :, 1:]  # [T, 1, 1, half] each
    halves = heads.view(num_tokens, num_heads, 2, half)  # [x1, x2]
    out = halves * cos  # [x1 cos, x2 cos] float32
    swapped = halves.flip(2) * sin  # [x2 sin, x1 sin]
    out[:, :, 0].sub_(swapped[:, :, 0])
    out[:, :, 1].add_(swapped[:, :, 1])
    return out.view(num_tokens, num_heads, head_dim).to(heads.dtype)
