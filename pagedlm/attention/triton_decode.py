"""Flash-decoding: a decode-only batch (every query_len <= 1) with long contexts split across programs.

Too few (sequence, KV head) pairs leave most of the GPU idle when each pair is one program, so each
sequence's visible keys are cut into num_splits contiguous chunks: one program per
(sequence, KV head, split) writes an unnormalised partial output with its running max and sum, and
the last program of a (sequence, KV head) group to finish merges the group's partials into the
output rows, all in one launch. num_splits comes from host-known shapes only.

Who merges: each (sequence, KV head) group has an int32 counter (pagedlm.ops.counters), zero at
every launch. A live split (one with keys) stores its partial, then adds 1 to the counter; the
program that reads num_live - 1 is the last and merges. Empty splits (short contexts: num_live <
num_splits) store nothing and do not count, so the merge never reads them. The merging program
resets the counter to 0: no other program of this launch touches it again, and the next launch on
the stream touches counters only after its PDL wait, when this one has ended, so every launch (and
every CUDA graph replay) starts from zeros.

The counter protocol and its memory ordering: pagedlm.ops.counters.last_to_arrive; the merge
reads the partials with the .cg cache modifier, as it asks.

Fused prepare_qkv (prepare_and_split_decode, FUSED_QKV): the kernel takes the QKV projection's
output instead of q and does prepare_qkv's work where it is needed, so a decode layer's attention
is one launch. Every program computes its GROUP query heads' q from the qkv row (norm, rotary,
rounded as prepare_qkv rounds them: the same load_heads). The split that holds position
seq_len - 1 (the last live one) also computes this step's k and v of its KV head, stores them at
slot_mapping[token] (not when slot < 0), and attends to that key from registers as a rank-1
online-softmax step; every cached key a program reads is older, so no program reads a slot this
launch writes (decode-only batches: the only new key of a sequence is its query's own).
With PDL, what the kernel reads before its wait (pagedlm.ops.pdl, rule 1): query_start_loc,
seq_lens, positions, slot_mapping and the block table (step inputs), the cos/sin row and the norm
weights, and its first BLOCK_N-key tile of cached keys and values (keys < seq_len - 1, written by
earlier steps; this step's key is masked out of that load). A split of one tile, i.e. every split of
a context up to num_splits * BLOCK_N keys, then reads nothing after the wait but the qkv row. Later
tiles of longer splits are loaded in the loop after the wait, as in the unfused kernel. So the
kernel launched right before this one must write none of those: the QKV GEMM writes only qkv.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention import triton_paged
from pagedlm.attention.prepare_qkv import (
    check_prepare_qkv, check_triton_head_dim, load_halves, load_heads, load_new_kv, store_new_kv,
)
from pagedlm.attention.triton_paged import (
    LOG2_E, attend_key_range, attend_tile, cache_strides, kernel_constexprs, load_kv_tile,
)
from pagedlm.ops import pdl
from pagedlm.ops.counters import last_to_arrive, zeroed_counters

DEFAULT_NUM_SMS = 132  # H100/H200; used where no CUDA device can be asked
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32


@triton.jit
def split_key_range(seq_len, window, num_splits, split, BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr):
    """Keys [kv_lo, kv_hi) of this split, and num_live: the splits with keys (the first num_live)."""
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(seq_len - window, 0)
    num_keys = seq_len - first_key
    chunk = tl.maximum(tl.cdiv(tl.cdiv(num_keys, num_splits), BLOCK_N), 1) * BLOCK_N
    kv_lo = first_key + split * chunk
    kv_hi = tl.minimum(kv_lo + chunk, seq_len)
    return kv_lo, kv_hi, tl.cdiv(num_keys, chunk)


@triton.jit
def merge_head_splits(
    out_row_ptr,  # [HEAD_DIM] this head's output row
    part_row,  # row of split 0 of this (sequence, head) in the partial buffers
    num_live, part_out_ptr, part_max_ptr, part_sum_ptr,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """out = sum_s acc_s 2^(m_s - m) / sum_s l_s 2^(m_s - m) over the live splits s, m = max_s m_s."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    live = offs_s < num_live
    rows = part_row + offs_s  # [SPLITS_PAD]
    maxes = tl.load(part_max_ptr + rows, mask=live, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(part_sum_ptr + rows, mask=live, other=0.0, cache_modifier=".cg")
    acc = tl.load(part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=live[:, None], other=0.0,
                  cache_modifier=".cg")  # [SPLITS_PAD, HEAD_DIM]
    weights = tl.exp2(maxes - tl.max(maxes, 0))  # [SPLITS_PAD]; unvisited splits (max -inf) weigh 0
    out = tl.sum(acc * weights[:, None], 0) / tl.sum(sums * weights, 0)  # [HEAD_DIM]
    tl.store(out_row_ptr + offs_d, out.to(out_row_ptr.dtype.element_ty))


@triton.jit
def store_and_merge(
    acc, m_i, l_i,  # [BLOCK_M, HEAD_DIM], [BLOCK_M], [BLOCK_M]: this split's unnormalised state
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, counters_ptr,  # as decode_split_kernel's
    seq, kv_head, split, q_token, num_live, num_splits, stride_o_t, stride_o_h,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Store the split's partial; the group's last live split to arrive merges all of them."""
    num_kv_heads = tl.num_programs(1)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    part_rows = ((seq * num_kv_heads * GROUP + kv_head * GROUP + rows) * num_splits + split).to(tl.int64)
    tl.store(part_out_ptr + part_rows[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
    tl.store(part_max_ptr + part_rows, m_i, mask=row_ok)
    tl.store(part_sum_ptr + part_rows, l_i, mask=row_ok)
    if last_to_arrive(counters_ptr + seq * num_kv_heads + kv_head, num_live):
        for h in tl.static_range(GROUP):
            head = kv_head * GROUP + h
            merge_head_splits(
                out_ptr + q_token.to(tl.int64) * stride_o_t + head * stride_o_h,
                (seq * num_kv_heads * GROUP + head).to(tl.int64) * num_splits,
                num_live, part_out_ptr, part_max_ptr, part_sum_ptr, HEAD_DIM, SPLITS_PAD,
            )


@triton.jit
def join_halves(x1, x2, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """[BLOCK_H, 2 * HALF]: x1 then x2 ([BLOCK_H, HALF] each) along the last dim."""
    return tl.reshape(tl.permute(tl.join(x1, x2), (0, 2, 1)), (BLOCK_H, 2 * HALF))


@triton.jit
def attend_new_key(
    acc, m_i, l_i, q,  # the running state and q, as attend_tile's
    k1, k2, v,  # this step's key of one KV head (load_new_kv: normed and rotated halves) and value
    k_dst_ptr, v_dst_ptr,  # that KV head's row of the token's cache slot; written unless slot < 0
    slot, qk_scale, HEAD_DIM: tl.constexpr,
):
    """Store this step's key and value into the cache and attend to them from registers: one
    online-softmax step that every row sees (the key is at the query's own position)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    if slot >= 0:
        store_new_kv(k_dst_ptr, v_dst_ptr, 1, k1, k2, v, HALF, 1)
    cache_ty = k_dst_ptr.dtype.element_ty  # rounded as the cache holds them
    k_new = tl.reshape(join_halves(k1, k2, 1, HALF), (HEAD_DIM,)).to(cache_ty).to(tl.float32)
    v_new = tl.reshape(v, (HEAD_DIM,)).to(cache_ty).to(tl.float32)
    s = tl.sum(q.to(tl.float32) * k_new[None, :], 1) * qk_scale  # [BLOCK_M]
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    return acc * alpha[:, None] + p[:, None] * v_new[None, :], m_new, l_i * alpha + p


@triton.jit
def attend_split_keys(
    acc, m_i, l_i, q, q_pos, kv_lo, kv_hi,
    k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head, window, qk_scale,
    stride_kc_blk, stride_kc_slot, stride_kc_h, stride_vc_blk, stride_vc_slot, stride_vc_h,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """The cached keys [kv_lo, kv_hi) of a split (none if kv_hi <= kv_lo), all below the query's
    position: with a window every tile is masked; without, all but a partial last one."""
    kv_mid = kv_lo
    if not USE_WINDOW:
        kv_mid = kv_lo + tl.maximum(kv_hi - kv_lo, 0) // BLOCK_N * BLOCK_N
    return attend_key_range(
        acc, m_i, l_i, q, q_pos, kv_lo, kv_mid, kv_hi, k_cache_ptr, v_cache_ptr, block_table_row_ptr,
        kv_head, window, qk_scale, stride_kc_blk, stride_kc_slot, stride_kc_h, stride_vc_blk, stride_vc_slot,
        stride_vc_h, HEAD_DIM, BLOCK_N, BLOCK_SIZE, USE_WINDOW, DOT_PRECISION,
    )


@triton.jit(do_not_specialize=["window", "num_splits", "stride_bt"])
def decode_split_kernel(
    out_ptr,  # [T, num_heads, HEAD_DIM]
    part_out_ptr,  # [B, num_heads, num_splits, HEAD_DIM] fp32, unnormalised
    part_max_ptr, part_sum_ptr,  # [B, num_heads, num_splits] fp32 (max in the log2 domain)
    counters_ptr,  # [>= B * num_kv_heads] int32, zero at launch; zero again when the launch ends
    q_ptr,  # [T, num_heads, HEAD_DIM]; FUSED_QKV: qkv [T, (num_heads + 2 * num_kv_heads) * HEAD_DIM]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_table_ptr, query_start_loc_ptr, seq_lens_ptr,
    qk_scale, window, num_splits,
    stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_bt,
    stride_kc_blk, stride_kc_slot, stride_kc_h, stride_vc_blk, stride_vc_slot, stride_vc_h,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
    # FUSED_QKV only: prepare_qkv's inputs
    positions_ptr=None, slot_mapping_ptr=None,  # [T]
    cos_sin_ptr=None,  # [max_position, HEAD_DIM]: cos, then sin
    q_norm_ptr=None, k_norm_ptr=None,  # [HEAD_DIM]; any readable [HEAD_DIM] when QK_NORM is off (unused)
    eps=0.0, stride_cs=0,
    FUSED_QKV: tl.constexpr = False, QK_NORM: tl.constexpr = False,
):
    """One program: one split of one sequence's keys x the GROUP query heads of one KV head; the
    group's last live split to finish also merges (see the module notes for the ordering).
    FUSED_QKV: q, and in the split that holds position seq_len - 1 this step's k and v, come from
    the qkv row as prepare_qkv makes them (module notes: what is read before the wait)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_token = tl.load(query_start_loc_ptr + seq)
    has_query = tl.load(query_start_loc_ptr + seq + 1) > q_token  # else a padding sequence
    seq_len = tl.load(seq_lens_ptr + seq)
    kv_lo, kv_hi, num_live = split_key_range(seq_len, window, num_splits, split, BLOCK_N, USE_WINDOW)
    block_table_row_ptr = block_table_ptr + seq.to(tl.int64) * stride_bt
    if FUSED_QKV:  # all but the qkv row, before the wait: step inputs, weights, keys of earlier steps
        slot = tl.load(slot_mapping_ptr + q_token, mask=has_query, other=-1)
        pos = tl.load(positions_ptr + q_token, mask=has_query, other=0).to(tl.int64)
        cos, sin = load_halves(cos_sin_ptr + pos * stride_cs, HALF)
        q_w1, q_w2 = load_halves(q_norm_ptr, HALF)
        k_w1, k_w2 = load_halves(k_norm_ptr, HALF)
        old_hi = tl.where(has_query, tl.minimum(kv_hi, seq_len - 1), kv_lo)  # this step's key: not cached yet
        k_first, v_first = load_kv_tile(kv_lo, old_hi, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head,
                                        stride_kc_blk, stride_kc_slot, stride_kc_h, stride_vc_blk, stride_vc_slot,
                                        stride_vc_h, HEAD_DIM, BLOCK_N, BLOCK_SIZE, True)
    pdl.wait_for_producers(PDL)  # after it: q or qkv from the kernel before (prepare_qkv or the QKV GEMM)
    if not has_query or split >= num_live:  # no keys: stores nothing, does not count
        return

    q_pos = tl.full([BLOCK_M], 0, tl.int32) + seq_len - 1
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    q_row_ptr = q_ptr + q_token.to(tl.int64) * stride_q_t
    if FUSED_QKV:
        round_ty = q_ptr.dtype.element_ty  # q rounded as prepare_qkv stores it, then as the unfused path reads it
        q1, q2 = load_heads(q_row_ptr + kv_head * GROUP * HEAD_DIM, GROUP, cos, sin, q_w1, q_w2, eps,
                            HALF, BLOCK_M, QK_NORM, round_ty)
        # this step's k and v of the KV head, loaded with q (no second round trip after the dot); a split
        # that does not hold position seq_len - 1 masks every load
        holds_new_key = kv_hi == seq_len
        k1, k2, v = load_new_kv(q_row_ptr, tl.num_programs(1) * GROUP, tl.num_programs(1), kv_head,
                                holds_new_key.to(tl.int32), cos, sin, k_w1, k_w2, eps, HALF, 1, QK_NORM, round_ty)
        q = join_halves(q1, q2, BLOCK_M, HALF).to(round_ty).to(k_cache_ptr.dtype.element_ty)
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, q_pos, k_first, v_first, kv_lo, old_hi, window, qk_scale,
                                    BLOCK_N, USE_WINDOW, DOT_PRECISION, True)
        if holds_new_key:
            block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
            acc, m_i, l_i = attend_new_key(
                acc, m_i, l_i, q, k1, k2, v,
                k_cache_ptr + block * stride_kc_blk + offset * stride_kc_slot + kv_head * stride_kc_h,
                v_cache_ptr + block * stride_vc_blk + offset * stride_vc_slot + kv_head * stride_vc_h,
                slot, qk_scale, HEAD_DIM)
        kv_lo, kv_hi = kv_lo + BLOCK_N, old_hi  # the split's later tiles, loaded as they come
    else:
        rows = tl.arange(0, BLOCK_M)
        q_offs = (kv_head * GROUP + rows)[:, None] * stride_q_h + tl.arange(0, HEAD_DIM)[None, :]
        q = tl.load(q_row_ptr + q_offs, mask=(rows < GROUP)[:, None], other=0.0).to(k_cache_ptr.dtype.element_ty)
    acc, m_i, l_i = attend_split_keys(
        acc, m_i, l_i, q, q_pos, kv_lo, kv_hi, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head, window,
        qk_scale, stride_kc_blk, stride_kc_slot, stride_kc_h, stride_vc_blk, stride_vc_slot, stride_vc_h,
        HEAD_DIM, BLOCK_N, BLOCK_SIZE, USE_WINDOW, DOT_PRECISION,
    )
    store_and_merge(acc, m_i, l_i, out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, counters_ptr, seq, kv_head,
                    split, q_token, num_live, num_splits, stride_o_t, stride_o_h, GROUP, HEAD_DIM, SPLITS_PAD, BLOCK_M)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int = DEFAULT_NUM_SMS) -> int:
    """Splits per sequence for a decode-only batch: enough programs for ~2 waves over the SMs,
    each split at least MIN_KEYS_PER_SPLIT keys, at most MAX_SPLITS; 1 means: don't split."""
    num_programs = num_seqs * num_kv_heads
    if num_programs >= num_sms:
        return 1
    by_occupancy = triton.cdiv(2 * num_sms, num_programs)
    by_length = triton.cdiv(max_seq_len, MIN_KEYS_PER_SPLIT)
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


def split_decode_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]; sequence b's query (if any) at row query_start_loc[b]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    num_splits: int,
    out: torch.Tensor | None = None,  # [T, num_heads, head_dim], like q; allocated when None
) -> torch.Tensor:  # [T, num_heads, head_dim]; rows of no sequence's query are left unwritten
    out = torch.empty_like(q) if out is None else out
    _launch(out, q, (q.stride(0), q.stride(1)), kv_cache, meta, scale, sliding_window, num_splits, {})
    return out


def prepare_and_split_decode(
    qkv: torch.Tensor,  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
    positions: torch.Tensor,  # [T] int
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None,  # (q_norm, k_norm) weights [head_dim], or None
    eps: float,
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    num_heads: int,
    scale: float,
    sliding_window: int | None,
    num_splits: int,
) -> torch.Tensor:  # [T, num_heads, head_dim]; rows of no sequence's query are left unwritten
    """prepare_qkv (at meta.slot_mapping), then split_decode_attention, in one launch. Only the
    sequences' query rows are prepared: a row of no sequence must have slot -1 (or it is not written)."""
    check_prepare_qkv(qkv, positions, cos_sin_cache, kv_cache, meta.slot_mapping, num_heads)
    head_dim = kv_cache.shape[4]
    check_triton_head_dim(head_dim)
    out = torch.empty(qkv.shape[0], num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    q_norm, k_norm = qk_norm if qk_norm is not None else (cos_sin_cache, cos_sin_cache)  # unused
    prologue = dict(positions_ptr=positions, slot_mapping_ptr=meta.slot_mapping, cos_sin_ptr=cos_sin_cache,
                    q_norm_ptr=q_norm, k_norm_ptr=k_norm, eps=eps, stride_cs=cos_sin_cache.stride(0),
                    FUSED_QKV=True, QK_NORM=qk_norm is not None)
    _launch(out, qkv, (qkv.stride(0), head_dim), kv_cache, meta, scale, sliding_window, num_splits, prologue)
    return out


def _launch(
    out: torch.Tensor,  # [T, num_heads, head_dim]
    q_src: torch.Tensor,  # q [T, num_heads, head_dim], or qkv with prologue's FUSED_QKV
    q_strides: tuple[int, int],  # (token, head) strides of q in q_src
    kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, sliding_window: int | None,
    num_splits: int, prologue: dict,  # decode_split_kernel's FUSED_QKV arguments, {} without
) -> None:
    if meta.max_query_len > 1 or not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"split decode needs max_query_len <= 1 and 1 <= num_splits <= {MAX_SPLITS}; "
                         f"got {meta.max_query_len}, {num_splits}")
    num_heads, head_dim = out.shape[1], out.shape[2]
    num_kv_heads = kv_cache.shape[3]
    part_out = torch.empty(meta.num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=out.device)
    part_max = torch.empty(meta.num_seqs, num_heads, num_splits, dtype=torch.float32, device=out.device)
    part_sum = torch.empty_like(part_max)
    counters = zeroed_counters(out.device, meta.num_seqs * num_kv_heads)
    constexprs = kernel_constexprs(out, kv_cache, sliding_window)
    decode_split_kernel[(meta.num_seqs, num_kv_heads, num_splits)](
        out, part_out, part_max, part_sum, counters, q_src, kv_cache[0], kv_cache[1],
        meta.block_table, meta.query_start_loc, meta.seq_lens, scale * LOG2_E, sliding_window or 0, num_splits,
        *q_strides, out.stride(0), out.stride(1), meta.block_table.stride(0),
        *cache_strides(kv_cache), SPLITS_PAD=MAX_SPLITS,  # not from num_splits: one compile for all
        BLOCK_M=max(16, triton.next_power_of_2(constexprs["GROUP"])), **constexprs,
        num_warps=triton_paged.DECODE_NUM_WARPS, num_stages=triton_paged.DECODE_NUM_STAGES,
        **pdl.launch_args(out.device), **prologue,
    )
