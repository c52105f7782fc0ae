"""Triton kernel: scatter this step's K/V rows into the paged KV cache through slot_mapping.

Cache layout (pagedlm.attention.backend): [2, num_blocks, block_size, num_kv_heads, head_dim];
token t goes to slot s = slot_mapping[t]: block s // block_size, offset s % block_size. s < 0 is a
padding row and is skipped.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def kv_write_kernel(
    k_ptr, v_ptr,  # [T, num_kv_heads, head_dim]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [T] int64
    num_kv_heads,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_kc_blk, stride_kc_slot, stride_kc_h,
    stride_vc_blk, stride_vc_slot, stride_vc_h,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """One program per token: copies all its KV heads (a [BLOCK_H, HEAD_DIM] tile) for K and V."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (offs_h < num_kv_heads)[:, None]  # [BLOCK_H, 1]
    k = tl.load(k_ptr + token * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_t + offs_h[:, None] * stride_v_h + offs_d[None, :], mask=mask)
    k_dst = k_cache_ptr + block * stride_kc_blk + offset * stride_kc_slot + offs_h[:, None] * stride_kc_h
    v_dst = v_cache_ptr + block * stride_vc_blk + offset * stride_vc_slot + offs_h[:, None] * stride_vc_h
    tl.store(k_dst + offs_d[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst + offs_d[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_write(
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64, -1 = skip
) -> None:
    """Write k[t], v[t] into kv_cache at slot_mapping[t] for every t with a slot >= 0."""
    _check_kv_write(k, v, kv_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, num_kv_heads,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_SIZE=kv_cache.shape[2],
    )


def _check_kv_write(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, num_kv_heads, head_dim]; got {tuple(k.shape)}, {tuple(v.shape)}")
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or kv_cache.shape[3:] != k.shape[1:]:
        raise ValueError(f"kv_cache must be [2, num_blocks, block_size, {k.shape[1]}, {k.shape[2]}]; "
                         f"got {tuple(kv_cache.shape)}")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [{k.shape[0]}]; got {tuple(slot_mapping.shape)}")
    head_dim = k.shape[2]
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(f"head_dim must be a power of two in [16, 256]; got {head_dim}")
    if k.stride(2) != 1 or v.stride(2) != 1 or kv_cache.stride(4) != 1:
        raise ValueError("k, v and kv_cache must be contiguous in head_dim (stride 1)")
