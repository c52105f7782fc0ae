"""Triton varlen paged attention: one kernel for a ragged batch of prefill chunks and decodes.

Each query token attends causally to its own sequence's cached keys, found through the block
table (this step's K/V are already in the cache). Query heads sharing a KV head are processed
together, so every K/V tile is loaded once per group: a tile row is (query token, head in group).
Scores and the online softmax run in fp32, in the log2 domain (exp2 with scale * log2(e)).

Program mapping (no host sync): the grid is (cdiv(T, BLOCK_Q) + num_seqs - tile_base, num_kv_heads),
program p taking tile p + tile_base (tile_base is 0 but in a mixed batch's second launch, below).
Sequence b owns the tile indices [qsl[b] // BLOCK_Q + b, qsl[b+1] // BLOCK_Q + b + 1), which covers its
cdiv(query_len, BLOCK_Q) tiles; each program finds its sequence by a binary search of
query_start_loc and exits early if its tile is past the sequence's queries. Unlike a
num_seqs x cdiv(max_query_len, BLOCK_Q) grid, this launches ~T / BLOCK_Q programs for a mixed batch
with one long prefill, and the grid depends only on (T, num_seqs), which CUDA graphs keep fixed.
A decode-only batch (max_query_len <= 1, known on the host) skips the search: one program per
sequence and KV head (the search's ~log2(B) dependent loads were a visible part of a short decode).
A mixed batch whose first meta.num_decodes sequences have one query token each takes two launches:
those sequences as a decode batch, then sequences [first_seq = num_decodes, num_seqs) with the
search, from tile_base = first_seq // BLOCK_Q + first_seq (first_seq's first tile, as qsl[first_seq]
= first_seq). In one launch each decode would take a whole query tile (BLOCK_M rows, of which only a
group's heads of one token are real) and the prefill tiles' grid order (below); measured:
benchmarks/RESULTS.md, "Measured choices".

Decode launch order (ORDERED): a few decode tiles fill an SM's shared memory, so the SMs take the
programs in launch order, a few at a time, and a ragged batch ends when its last-started long sequence does
(makespan up to the mean load plus one long job). Given meta.decode_order (the host's permutation
of the sequences by decreasing seq_len), program i serves sequence decode_order[i]: longest first
(LPT scheduling), the short ones fill the gaps at the end. The result does not depend on the order.

Decode grid order: a decode batch's grid is (KV heads, sequences), and CUDA starts programs
x-fastest, so a sequence's heads run together (its blocks read whole, 2 KB a slot) and LPT order holds
over the whole launch. With (sequences, KV heads), as prefill tiles keep (neighbouring tiles of a head
share its keys in L2), a decode batch ran head by head: 256-byte rows of each block, and LPT order
only within a head's pass (measured: benchmarks/RESULTS.md, "Measured choices").

Decode-only batches take the flash-decoding path in triton_decode.py where their contexts can be long
enough to split.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.ops import pdl
from pagedlm.ops.triton_compat import patch_interpreter
from pagedlm.ops.warm_up import WarmUpRequest

patch_interpreter()
LOG2_E = 1.4426950408889634


@triton.jit
def key_tile_offsets(
    start,
    kv_hi,
    block_table_row_ptr,
    kv_head,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_h,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Key positions [start, start + BLOCK_N), which of them are < kv_hi, and their K and V row
    offsets in the cache through the block table ([BLOCK_N] each; block 0 where out of range)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    in_range = offs_n < kv_hi
    if MASKED:
        block_ids = tl.load(block_table_row_ptr + offs_n // BLOCK_SIZE, mask=in_range, other=0)
    else:
        block_ids = tl.load(block_table_row_ptr + offs_n // BLOCK_SIZE)
    block_ids = block_ids.to(tl.int64)
    slots = offs_n % BLOCK_SIZE
    k_offs = block_ids * stride_kc_blk + slots * stride_kc_slot + kv_head * stride_kc_h
    v_offs = block_ids * stride_vc_blk + slots * stride_vc_slot + kv_head * stride_vc_h
    return offs_n, in_range, k_offs, v_offs


@triton.jit
def online_softmax(s, m_i, l_i):
    """One tile of scores s [BLOCK_M, BLOCK_N] (log2 domain, -inf where hidden) into the running max
    and sum: -> (p [BLOCK_M, BLOCK_N], alpha [BLOCK_M] to rescale acc by, new max, new sum)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows that have seen no key yet
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def attend_keys(
    acc,
    m_i,
    l_i,  # [BLOCK_M, HEAD_DIM], [BLOCK_M], [BLOCK_M] fp32 running state
    q,  # [BLOCK_M, HEAD_DIM], cache dtype
    q_pos,  # [BLOCK_M] position of each row's query token
    kv_lo,
    kv_hi,  # key positions [kv_lo, kv_hi) to visit; all < seq_len, so all written
    k_cache_ptr,
    v_cache_ptr,
    block_table_row_ptr,
    kv_head,
    window,
    qk_scale,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Online softmax over the keys j in [kv_lo, kv_hi) with j <= q_pos (and q_pos - j < window).
    MASKED=False: the caller guarantees whole BLOCK_N tiles that every row sees in full (keys
    below the tile's first query, no window), so no bounds or visibility masks are computed."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(kv_lo, kv_hi, BLOCK_N):
        offs_n, in_range, k_offs, v_offs = key_tile_offsets(
            start,
            kv_hi,
            block_table_row_ptr,
            kv_head,
            stride_kc_blk,
            stride_kc_slot,
            stride_kc_h,
            stride_vc_blk,
            stride_vc_slot,
            stride_vc_h,
            BLOCK_N,
            BLOCK_SIZE,
            MASKED,
        )
        if MASKED:
            k = tl.load(
                k_cache_ptr + k_offs[None, :] + offs_d[:, None], mask=in_range[None, :], other=0.0
            )
        else:
            k = tl.load(k_cache_ptr + k_offs[None, :] + offs_d[:, None])
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if MASKED:
            visible = in_range[None, :] & (offs_n[None, :] <= q_pos[:, None])
            if USE_WINDOW:
                visible = visible & (q_pos[:, None] - offs_n[None, :] < window)
            s = tl.where(visible, s, float("-inf"))
        p, alpha, m_i, l_i = online_softmax(s, m_i, l_i)
        if MASKED:
            v = tl.load(
                v_cache_ptr + v_offs[:, None] + offs_d[None, :], mask=in_range[:, None], other=0.0
            )
        else:
            v = tl.load(v_cache_ptr + v_offs[:, None] + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def attend_key_range(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    kv_lo,
    kv_mid,
    kv_hi,
    k_cache_ptr,
    v_cache_ptr,
    block_table_row_ptr,
    kv_head,
    window,
    qk_scale,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """attend_keys over [kv_lo, kv_hi): unmasked tiles [kv_lo, kv_mid), then masked ones."""
    acc, m_i, l_i = attend_keys(
        acc,
        m_i,
        l_i,
        q,
        q_pos,
        kv_lo,
        kv_mid,
        k_cache_ptr,
        v_cache_ptr,
        block_table_row_ptr,
        kv_head,
        window,
        qk_scale,
        stride_kc_blk,
        stride_kc_slot,
        stride_kc_h,
        stride_vc_blk,
        stride_vc_slot,
        stride_vc_h,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_SIZE,
        USE_WINDOW,
        DOT_PRECISION,
        False,
    )
    return attend_keys(
        acc,
        m_i,
        l_i,
        q,
        q_pos,
        kv_mid,
        kv_hi,
        k_cache_ptr,
        v_cache_ptr,
        block_table_row_ptr,
        kv_head,
        window,
        qk_scale,
        stride_kc_blk,
        stride_kc_slot,
        stride_kc_h,
        stride_vc_blk,
        stride_vc_slot,
        stride_vc_h,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_SIZE,
        USE_WINDOW,
        DOT_PRECISION,
        True,
    )


@triton.jit
def find_seq(query_start_loc_ptr, first_seq, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """The largest b in [first_seq, num_seqs) with qsl[b] // BLOCK_Q + b <= tile (strictly
    increasing in b)."""
    lo = (
        tl.program_id(0) * 0 + first_seq
    )  # an int32 tensor from the start: lo and hi are loop-carried
    hi = lo - first_seq + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit(do_not_specialize=["num_seqs", "first_seq", "tile_base", "window", "stride_bt"])
def paged_attention_kernel(
    out_ptr,  # [T, num_heads, HEAD_DIM]
    q_ptr,  # [T, num_heads, HEAD_DIM]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_table_ptr,  # [B, max_blocks_per_seq] int32
    query_start_loc_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32
    decode_order_ptr,  # [num_seqs] int32, a permutation of range(num_seqs), read when ORDERED; else None
    num_seqs,
    first_seq,
    tile_base,  # not DECODE: sequences [first_seq, num_seqs), tiles from tile_base
    qk_scale,
    window,
    stride_q_t,
    stride_q_h,
    stride_o_t,
    stride_o_h,
    stride_bt,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_h,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DECODE: tl.constexpr,
    ORDERED: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program: BLOCK_Q query tokens of one sequence x the GROUP query heads of one KV head.
    DECODE (sequences [0, num_seqs) have at most one query token each): program i is sequence i,
    no search, or sequence decode_order[i] when ORDERED (longest first: see the module notes)."""
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
    if DECODE:  # grid (KV heads, tiles): see the module notes
        tile = tl.program_id(1)
        kv_head = tl.program_id(0)
        if ORDERED:
            seq = tl.load(decode_order_ptr + tile)
        else:
            seq = tile
    else:  # grid (tiles, KV heads)
        tile = tl.program_id(0) + tile_base
        kv_head = tl.program_id(1)
        seq = find_seq(query_start_loc_ptr, first_seq, num_seqs, tile, BLOCK_Q)
    q_seq_start = tl.load(query_start_loc_ptr + seq)
    q_seq_end = tl.load(query_start_loc_ptr + seq + 1)
    q_first = q_seq_start
    if not DECODE:
        q_first += (tile - q_seq_start // BLOCK_Q - seq) * BLOCK_Q
    pdl.wait_for_producers(
        PDL
    )  # above: step inputs only; q and this step's keys come from prepare_qkv
    if q_first >= q_seq_end:
        return
    first_pos = tl.load(seq_lens_ptr + seq) - (
        q_seq_end - q_seq_start
    )  # position of token q_seq_start

    rows = tl.arange(0, BLOCK_M)
    tokens = q_first + rows // GROUP_PAD  # [BLOCK_M]
    heads = kv_head * GROUP + rows % GROUP_PAD  # [BLOCK_M]
    row_ok = (tokens < q_seq_end) & (rows % GROUP_PAD < GROUP)
    q_pos = first_pos + tokens - q_seq_start  # [BLOCK_M]
    offs_d = tl.arange(0, HEAD_DIM)
    q_offs = (
        tokens.to(tl.int64)[:, None] * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :]
    )
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0).to(k_cache_ptr.dtype.element_ty)

    kv_hi = (
        first_pos + tl.minimum(q_first + BLOCK_Q, q_seq_end) - q_seq_start
    )  # last query position + 1
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    table_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    if (
        USE_WINDOW or DECODE
    ):  # every tile masked, in one pipelined loop (decode: the partial last tile
        kv_lo = (
            0  # joins the pipeline, measured faster than full tiles unmasked and a masked last one)
        )
        if USE_WINDOW:
            kv_lo = tl.maximum(first_pos + q_first - q_seq_start - window + 1, 0)
        acc, m_i, l_i = attend_keys(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            kv_lo,
            kv_hi,
            k_cache_ptr,
            v_cache_ptr,
            table_row,
            kv_head,
            window,
            qk_scale,
            stride_kc_blk,
            stride_kc_slot,
            stride_kc_h,
            stride_vc_blk,
            stride_vc_slot,
            stride_vc_h,
            HEAD_DIM,
            BLOCK_N,
            BLOCK_SIZE,
            USE_WINDOW,
            DOT_PRECISION,
            True,
        )
    else:  # whole tiles of keys up to the tile's first query position are seen by every row
        kv_mid = tl.minimum((first_pos + q_first - q_seq_start + 1) // BLOCK_N * BLOCK_N, kv_hi)
        acc, m_i, l_i = attend_key_range(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            0,
            kv_mid,
            kv_hi,
            k_cache_ptr,
            v_cache_ptr,
            table_row,
            kv_head,
            window,
            qk_scale,
            stride_kc_blk,
            stride_kc_slot,
            stride_kc_h,
            stride_vc_blk,
            stride_vc_slot,
            stride_vc_h,
            HEAD_DIM,
            BLOCK_N,
            BLOCK_SIZE,
            USE_WINDOW,
            DOT_PRECISION,
        )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_offs = (
        tokens.to(tl.int64)[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :]
    )
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def kernel_constexprs(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    sliding_window: int | None,
) -> dict:
    """The compile-time parameters shared by the varlen and the split-decode kernels."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // kv_cache.shape[3]
    return dict(
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_N=32 if head_dim > 128 else 64,
        BLOCK_SIZE=kv_cache.shape[2],
        USE_WINDOW=sliding_window is not None,
        DOT_PRECISION="ieee" if kv_cache.dtype == torch.float32 else "tf32",
    )


# Decode tiles (head_dim <= 128, 2-byte KV): 64 keys, 2 stages, one masked loop read the KV cache fastest
# on T1's and T2's decode shapes (benchmarks/attention_kernels.py --decode; benchmarks/RESULTS.md,
# "Measured choices").
DECODE_BLOCK_N = 64
DECODE_NUM_WARPS = 4
DECODE_NUM_STAGES = 2
PREFILL_BLOCK_M = 64  # rows (query tokens x heads of a group) per prefill tile
PREFILL_BLOCK_N = 64  # keys per step of a prefill tile (head_dim <= 128)
PREFILL_NUM_WARPS = 4
PREFILL_NUM_STAGES = 2


def varlen_block_m(max_query_len: int, group_pad: int) -> int:
    """Rows per tile: 16 when every sequence's queries fit a small tile (decode), else
    PREFILL_BLOCK_M."""
    return max(group_pad, 16 if max_query_len * group_pad <= 16 else PREFILL_BLOCK_M)


# the tiles above and the launches of varlen_attention (ops/warm_up.py); with piecewise graphs these
# prompts replay them, and the attention between the pieces compiles here
WARM_UP_REQUESTS = (
    WarmUpRequest(
        2,
        "the small tile for every GQA group up to 8 (very short prompts and the last few "
        "tokens of a chunked one)",
    ),
    WarmUpRequest(
        32,
        "the prefill tile for every GQA group (the profile step has it too, but not with "
        "num_gpu_blocks_override, which skips the profile)",
    ),
    WarmUpRequest(
        2,
        "the decode launch of a mixed step's leading decodes (decode-only steps replay graphs, "
        "and where every capture size takes the split decode nothing else launches it)",
        mixed_with=2,
    ),
)


def cache_strides(kv_cache: torch.Tensor) -> tuple[int, ...]:
    """(block, slot, head) strides of the key half, then of the value half."""
    return tuple(kv_cache[0].stride()[:3]) + tuple(kv_cache[1].stride()[:3])


def decode_order(meta: AttentionMetadata, num_decodes: int) -> torch.Tensor | None:
    """meta.decode_order ([num_decodes] int32) after a shape check; None when the batch has none."""
    order = meta.decode_order
    if order is not None and (order.shape != (num_decodes,) or order.dtype != torch.int32):
        raise ValueError(
            f"decode_order must be [num_decodes={num_decodes}] int32; "
            f"got {tuple(order.shape)} {order.dtype}"
        )
    return order


def varlen_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor | None = None,  # [T, num_heads, head_dim], like q; allocated when None
) -> (
    torch.Tensor
):  # [T, num_heads, head_dim]; rows past query_start_loc[num_seqs] are left unwritten
    """A decode batch in one launch; a mixed one as its leading decodes, then the rest (module notes)."""
    out = torch.empty_like(q) if out is None else out
    num_decodes = meta.num_seqs if meta.max_query_len <= 1 else meta.num_decodes
    if not 0 <= num_decodes <= meta.num_seqs:
        raise ValueError(f"num_decodes must be in [0, num_seqs={meta.num_seqs}]; got {num_decodes}")
    if (
        num_decodes
        and meta.max_query_len > 1
        and int(meta.query_start_loc_cpu[num_decodes]) != num_decodes
    ):
        raise ValueError(
            f"num_decodes={num_decodes}: the first num_decodes sequences must have one query "
            f"token each; they have {int(meta.query_start_loc_cpu[num_decodes])} in all"
        )
    order = decode_order(meta, num_decodes)
    if num_decodes:
        _launch(q, kv_cache, meta, scale, sliding_window, out, num_decodes, order=order)
    if num_decodes < meta.num_seqs:
        _launch(q, kv_cache, meta, scale, sliding_window, out, meta.num_seqs, first_seq=num_decodes)
    return out


def _launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
    num_seqs: int,
    order: torch.Tensor | None = None,
    first_seq: int | None = None,
) -> None:
    """Sequences [0, num_seqs) as a decode batch (first_seq None; in `order` if given), or
    sequences [first_seq, num_seqs) with query tiles, the first first_seq having one token each."""
    constexprs = kernel_constexprs(q, kv_cache, sliding_window)
    group_pad = triton.next_power_of_2(constexprs["GROUP"])
    decode = first_seq is None
    seq_base, tile_base = 0, 0
    block_m = varlen_block_m(1 if decode else meta.max_query_len, group_pad)
    prefill = block_m > 16
    if prefill and q.shape[2] <= 128:
        constexprs["BLOCK_N"] = PREFILL_BLOCK_N
    elif (
        q.shape[2] <= 128 and kv_cache.element_size() == 2
    ):  # fp32 tiles would overflow shared memory
        constexprs["BLOCK_N"] = DECODE_BLOCK_N
    if decode:  # grid (KV heads, sequences): see the module notes
        grid = (kv_cache.shape[3], num_seqs)
    else:
        block_q = block_m // group_pad
        seq_base, tile_base = first_seq, first_seq // block_q + first_seq  # (module notes)
        grid = (triton.cdiv(q.shape[0], block_q) + num_seqs - tile_base, kv_cache.shape[3])
    paged_attention_kernel[grid](
        out,
        q,
        kv_cache[0],
        kv_cache[1],
        meta.block_table,
        meta.query_start_loc,
        meta.seq_lens,
        order,
        num_seqs,
        seq_base,
        tile_base,
        scale * LOG2_E,
        sliding_window or 0,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        meta.block_table.stride(0),
        *cache_strides(kv_cache),
        GROUP_PAD=group_pad,
        BLOCK_M=block_m,
        DECODE=decode,
        ORDERED=order is not None,
        **constexprs,
        num_warps=PREFILL_NUM_WARPS if prefill else DECODE_NUM_WARPS,
        num_stages=PREFILL_NUM_STAGES if prefill else DECODE_NUM_STAGES,
        **pdl.launch_args(q.device),
    )
