"""From the fused QKV projection to attention's inputs, in one pass: split q/k/v, Qwen3's per-head
RMSNorm of q and k, rotary embedding of q and k, and the write of this step's k and v into the
paged KV cache. Returns q; attention then reads k and v from the cache.

One Triton kernel on CUDA (two programs per token: q, then k and v) instead of up to six launches (two copies, two
norms, rotary, KV write); plain torch elsewhere (the pieces in pagedlm.ops and torch_ref).
Rounding is the unfused path's: the norm rounds to the model dtype before the weight and after
it, rotary computes in float32 and rounds once (pagedlm.ops.norm, pagedlm.ops.rotary).
KV cache layout: pagedlm.attention.backend; slot_mapping < 0 marks a padding row (not written).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.attention.torch_ref import write_kv_cache_cpu
from pagedlm.ops import pdl
from pagedlm.ops.norm import rms_norm_torch
from pagedlm.ops.rotary import rotate_heads_cpu


@triton.jit
def load_heads(
    row_ptr,
    num_heads,
    cos,
    sin,
    norm_ptr,
    eps,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    QK_NORM: tl.constexpr,
    ROUND_TY: tl.constexpr,
):
    """[BLOCK_H, HALF] x2 fp32: the rotated halves of num_heads heads stored from row_ptr on."""
    offs_h = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, HALF)
    mask = (offs_h < num_heads)[:, None]
    src = row_ptr + offs_h[:, None] * (2 * HALF) + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:  # per-head RMSNorm, rounded as pagedlm.ops.norm rounds it
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)  # [BLOCK_H]
        w1 = tl.load(norm_ptr + offs).to(tl.float32)
        w2 = tl.load(norm_ptr + HALF + offs).to(tl.float32)
        x1 = (
            ((x1 * rstd[:, None]).to(ROUND_TY).to(tl.float32) * w1[None, :])
            .to(ROUND_TY)
            .to(tl.float32)
        )
        x2 = (
            ((x2 * rstd[:, None]).to(ROUND_TY).to(tl.float32) * w2[None, :])
            .to(ROUND_TY)
            .to(tl.float32)
        )
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :]


@triton.jit
def store_heads(dst_ptr, stride_h, num_heads, y1, y2, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Store [BLOCK_H, HALF] x2 as num_heads heads of 2 * HALF, head h at dst_ptr + h * stride_h."""
    offs_h = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, HALF)
    mask = (offs_h < num_heads)[:, None]
    dst = dst_ptr + offs_h[:, None] * stride_h + offs[None, :]
    tl.store(dst, y1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, y2.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def prepare_qkv_kernel(
    q_out_ptr,  # [T, num_heads, 2 * HALF]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, 2 * HALF]
    qkv_ptr,  # [T, (num_heads + 2 * num_kv_heads) * 2 * HALF]: q heads, k heads, v heads
    positions_ptr,
    slot_mapping_ptr,  # [T]
    cos_sin_ptr,  # [max_position, 2 * HALF]: cos, then sin
    q_norm_ptr,
    k_norm_ptr,  # [2 * HALF] (read only if QK_NORM)
    eps,
    num_heads,
    num_kv_heads,
    stride_qkv,
    stride_qo_t,
    stride_cs,
    stride_kc_blk,
    stride_kc_slot,
    stride_vc_blk,
    stride_vc_slot,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QK_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    """Two programs per token: part 0 rotates q, part 1 writes k and v (half the serial latency
    of one program per token, which is what a batch-1 decode step waits for)."""
    token = tl.program_id(0).to(tl.int64)
    round_ty = q_out_ptr.dtype.element_ty
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs = tl.arange(0, HALF)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs).to(tl.float32)
    pdl.wait_for_producers(PDL)  # positions and the table are step inputs; qkv is the GEMM's output
    row = qkv_ptr + token * stride_qkv
    if tl.program_id(1) == 0:
        q1, q2 = load_heads(
            row, num_heads, cos, sin, q_norm_ptr, eps, HALF, BLOCK_HQ, QK_NORM, round_ty
        )
        store_heads(q_out_ptr + token * stride_qo_t, 2 * HALF, num_heads, q1, q2, HALF, BLOCK_HQ)
        return
    slot = tl.load(slot_mapping_ptr + token)
    if slot >= 0:
        k_row = row + num_heads * 2 * HALF
        k1, k2 = load_heads(
            k_row, num_kv_heads, cos, sin, k_norm_ptr, eps, HALF, BLOCK_HK, QK_NORM, round_ty
        )
        block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        store_heads(
            k_cache_ptr + block * stride_kc_blk + offset * stride_kc_slot,
            2 * HALF,
            num_kv_heads,
            k1,
            k2,
            HALF,
            BLOCK_HK,
        )
        offs_h = tl.arange(0, BLOCK_HK)
        offs_d = tl.arange(0, 2 * HALF)
        mask = (offs_h < num_kv_heads)[:, None]
        v = tl.load(
            k_row + num_kv_heads * 2 * HALF + offs_h[:, None] * (2 * HALF) + offs_d[None, :],
            mask=mask,
        )
        v_dst = v_cache_ptr + block * stride_vc_blk + offset * stride_vc_slot
        tl.store(
            v_dst + offs_h[:, None] * (2 * HALF) + offs_d[None, :],
            v.to(v_cache_ptr.dtype.element_ty),
            mask=mask,
        )


def prepare_qkv(
    qkv: torch.Tensor,  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
    positions: torch.Tensor,  # [T] int
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
    qk_norm: tuple[torch.Tensor, torch.Tensor]
    | None,  # (q_norm, k_norm) weights [head_dim], or None
    eps: float,
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64, -1 = not written
    num_heads: int,
) -> torch.Tensor:  # q: [T, num_heads, head_dim], normed and rotated
    """Split, norm, rotate; write k and v into kv_cache at slot_mapping; return q."""
    _check_prepare_qkv(qkv, positions, cos_sin_cache, kv_cache, slot_mapping, num_heads)
    if qkv.is_cuda:
        return prepare_qkv_triton(
            qkv, positions, cos_sin_cache, qk_norm, eps, kv_cache, slot_mapping, num_heads
        )
    return prepare_qkv_torch(
        qkv, positions, cos_sin_cache, qk_norm, eps, kv_cache, slot_mapping, num_heads
    )


def prepare_qkv_torch(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None,
    eps: float,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    heads = qkv.view(qkv.shape[0], -1, head_dim)  # [T, num_heads + 2 * num_kv_heads, head_dim]
    qk, v = heads.split([num_heads + num_kv_heads, num_kv_heads], dim=1)
    if qk_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
        q, k = qk.split([num_heads, num_kv_heads], dim=1)
        qk = torch.cat((rms_norm_torch(q, qk_norm[0], eps), rms_norm_torch(k, qk_norm[1], eps)), 1)
    q, k = rotate_heads_cpu(positions, qk, cos_sin_cache).split([num_heads, num_kv_heads], dim=1)
    write_kv_cache_cpu(k, v, kv_cache, slot_mapping)
    return q


def prepare_qkv_triton(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None,
    eps: float,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    num_tokens = qkv.shape[0]
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(f"head_dim must be a power of two in [16, 256] on CUDA; got {head_dim}")
    q = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    q_norm, k_norm = qk_norm if qk_norm is not None else (cos_sin_cache, cos_sin_cache)  # unread
    prepare_qkv_kernel[(num_tokens, 2)](
        q,
        k_cache,
        v_cache,
        qkv,
        positions,
        slot_mapping,
        cos_sin_cache,
        q_norm,
        k_norm,
        eps,
        num_heads,
        num_kv_heads,
        qkv.stride(0),
        q.stride(0),
        cos_sin_cache.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        HALF=head_dim // 2,
        BLOCK_HQ=triton.next_power_of_2(num_heads),
        BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        BLOCK_SIZE=kv_cache.shape[2],
        QK_NORM=qk_norm is not None,
        num_warps=4,
        **pdl.launch_args(qkv.device),
    )
    return q


def _check_prepare_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
) -> None:
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            f"kv_cache must be [2, num_blocks, block_size, num_kv_heads, head_dim]; "
            f"got {tuple(kv_cache.shape)}"
        )
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1:
        raise ValueError(
            f"qkv must be [T, {width}] ((num_heads + 2 * num_kv_heads) * head_dim) with stride 1 "
            f"in its last dim; got {tuple(qkv.shape)}"
        )
    if positions.shape != (qkv.shape[0],) or slot_mapping.shape != (qkv.shape[0],):
        raise ValueError(
            f"positions and slot_mapping must be [{qkv.shape[0]}]; "
            f"got {tuple(positions.shape)}, {tuple(slot_mapping.shape)}"
        )
    if (
        cos_sin_cache.dim() != 2
        or cos_sin_cache.shape[1] != head_dim
        or cos_sin_cache.stride(1) != 1
    ):
        raise ValueError(
            f"cos_sin_cache must be [max_position, {head_dim}], contiguous rows; "
            f"got {tuple(cos_sin_cache.shape)}"
        )
    if kv_cache.stride(4) != 1 or kv_cache.stride(3) != head_dim:
        raise ValueError(
            "kv_cache must be contiguous in its last two dims (num_kv_heads, head_dim)"
        )
