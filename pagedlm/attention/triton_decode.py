"""Flash-decoding: a decode-only batch (every query_len <= 1) whose long contexts are split across
programs.

Each split sequence's visible keys are cut into up to num_splits contiguous chunks of whole key
tiles: one program per (sequence, KV head, split) writes an unnormalised partial output with its
running max and sum, and the last program of a (sequence, KV head) group to finish merges the
group's partials into the output rows, all in one launch. A sequence whose keys fit one split (a
short one, or one that does not split) has one live split, which writes its output directly:
no partials, no counter, no merge.

Which sequences split (host ints only, so the grid is fixed per CUDA graph size):
- a small batch (fewer (sequence, KV head) pairs than SMs): every sequence, into enough splits for
  ~2 waves over the SMs, so a few sequences still fill the GPU;
- a large batch: the longest cdiv(B, LARGE_BATCH_SPLIT_SHARE) in decode_order (the host's
  permutation by decreasing seq_len), into up to LARGE_BATCH_MAX_SPLITS chunks of at least one
  tile, as many as its keys over the longest unsplit sequence's (balanced_splits, on the device:
  a batch of like lengths splits nothing); the others take one program each. Without it one long context among many short ones was
  walked by one program per KV head long after the rest of the batch had finished (issue 31: T4's
  decode steps lost 1.2 ms per 1,000 keys of the longest context). A grid of splits for every
  sequence would launch mostly empty programs, each holding shared memory until its PDL wait.
The grid is (KV heads, programs), x-fastest as the varlen decode's (a sequence's heads together),
program p being rank p // num_splits's split p % num_splits for p < split_seqs * num_splits, then
one program per remaining rank: in decode_order, the longest sequence's splits start first (LPT).

Who merges: each split sequence's (rank, KV head) group has an int32 counter
(pagedlm.ops.counters), zero at every launch. A live split (one with keys) of a sequence with
several stores its partial, then adds 1 to the counter; the program that reads num_live - 1 is the
last and merges. Empty splits (short contexts: num_live < num_splits) store nothing and do not
count, so the merge never reads them. The merging program resets the counter to 0: no other
program of this launch touches it again, and the next launch on the stream touches counters only
after its PDL wait, when this one has ended, so every launch (and every CUDA graph replay) starts
from zeros.

In a small batch (every sequence splits: EARLY_FIRST_TILE) each program reads its split's first
tile of keys and values before its PDL wait, all but the newest key (which prepare_qkv, the kernel
before, writes in this step): the other keys were written by earlier steps (pagedlm/ops/pdl.py,
rule 1). At batch 1 a split is one tile up to 32 x 64 keys, so the wait then only holds back q, the
newest key and the math (reading the tile after the wait was measured slower: benchmarks/RESULTS.md,
"Measured choices"). So the scheduler keeps a one-token query off a block that another sequence
fills in the same step (core/kv_cache_manager.py), a constraint of its output (core/sched_output.py).
In a large batch most programs walk a whole short context: they wait first, then run the varlen
decode's one masked, pipelined loop over their keys. With the early tile (held across the wait) the
kernel took 168 registers a thread against the varlen decode's 96, so fewer programs per SM, and
uniform batches ran 9-11% slower than in the varlen kernel; without it 92, and T0's batch runs as
fast (benchmarks/RESULTS.md, "Large decode batches split").

The counter protocol and its memory ordering: pagedlm.ops.counters.last_to_arrive; the merge
reads the partials with the .cg cache modifier, as it asks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.triton_paged import (
    LOG2_E,
    attend_key_range,
    attend_keys,
    cache_strides,
    decode_order,
    kernel_constexprs,
    key_tile_offsets,
    online_softmax,
)
from pagedlm.ops import pdl
from pagedlm.ops.counters import last_to_arrive, zeroed_counters
from pagedlm.ops.warm_up import WarmUpRequest

DEFAULT_NUM_SMS = 132  # H100/H200; used where no CUDA device can be asked
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32
# A large batch (issue 31: one long context among many short ones walked its keys in one program per
# KV head while the rest of the GPU idled) splits its longest LARGE_BATCH_SPLIT_SHARE-th of sequences
# into chunks of about LARGE_BATCH_SPLIT_KEYS keys of the longest possible context, at most
# LARGE_BATCH_MAX_SPLITS. 4 splits of the longest eighth were the best of 3 x 4 tried on uniform and
# skewed batches of 256-448 rows (benchmarks/split_decode.py; its s21 sweep in
# benchmarks/results/2026-12-02-h200-s21/split/); batches of 24-64 rows gain from 8-16 splits.
LARGE_BATCH_SPLIT_KEYS = 1024
LARGE_BATCH_MAX_SPLITS = 4
LARGE_BATCH_SPLIT_SHARE = 8
SPLIT_BLOCK_N = (
    64  # keys per tile; at batch 1 also per split (MIN_KEYS_PER_SPLIT spreads them wider)
)
SPLIT_NUM_WARPS = 4
# A one-tile split (batch 1 up to 32 x 64 keys) skips the loop, so its stages cost nothing there; longer
# splits are pipelined, 2 stages fastest at long contexts (benchmarks/RESULTS.md, "Measured choices").
SPLIT_NUM_STAGES = 2


@triton.jit
def split_key_range(
    seq_len, window, num_splits, split, BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr
):
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
def visible_keys(seq_len, window, USE_WINDOW: tl.constexpr):
    if USE_WINDOW:
        return tl.minimum(seq_len, window)
    return seq_len


@triton.jit
def balanced_splits(
    seq_len,
    seq_splits,
    split_seqs,
    seq_lens_ptr,
    decode_order_ptr,
    window,
    USE_WINDOW: tl.constexpr,
    ORDERED: tl.constexpr,
):
    """A large batch's split count for a sequence of seq_len: its visible keys over those of the
    longest sequence that does not split (rank split_seqs), rounded, in [1, seq_splits]: chunks about
    as long as the unsplit programs' longest walk, so a batch of like lengths splits nothing (its
    partials and merge would be pure cost, and its chunks would start before the longer unsplit
    programs), and a long context among short ones splits in full. Padding sequences sort last (no
    keys: counted as one)."""
    next_seq = split_seqs
    if ORDERED:
        next_seq = tl.load(decode_order_ptr + split_seqs)
    next_keys = tl.maximum(visible_keys(tl.load(seq_lens_ptr + next_seq), window, USE_WINDOW), 1)
    keys = visible_keys(seq_len, window, USE_WINDOW)
    return tl.minimum(tl.maximum((2 * keys + next_keys) // (2 * next_keys), 1), seq_splits)


@triton.jit
def merge_head_splits(
    out_row_ptr,  # [HEAD_DIM] this head's output row
    part_row,  # row of split 0 of this (sequence, head) in the partial buffers
    num_live,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """out = sum_s acc_s 2^(m_s - m) / sum_s l_s 2^(m_s - m) over the live splits s, m = max_s m_s."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    live = offs_s < num_live
    rows = part_row + offs_s  # [SPLITS_PAD]
    maxes = tl.load(part_max_ptr + rows, mask=live, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(part_sum_ptr + rows, mask=live, other=0.0, cache_modifier=".cg")
    acc = tl.load(
        part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
        mask=live[:, None],
        other=0.0,
        cache_modifier=".cg",
    )  # [SPLITS_PAD, HEAD_DIM]
    weights = tl.exp2(maxes - tl.max(maxes, 0))  # [SPLITS_PAD]; unvisited splits (max -inf) weigh 0
    out = tl.sum(acc * weights[:, None], 0) / tl.sum(sums * weights, 0)  # [HEAD_DIM]
    tl.store(out_row_ptr + offs_d, out.to(out_row_ptr.dtype.element_ty))


@triton.jit
def program_split(p, split_seqs, num_splits):
    """Program p's (rank in launch order, split, splits of that sequence): the first split_seqs ranks
    take num_splits programs each, the others one."""
    tiered = p < split_seqs * num_splits
    rank = tl.where(tiered, p // num_splits, p - split_seqs * (num_splits - 1))
    split = tl.where(tiered, p % num_splits, 0)
    return rank, split, tl.where(tiered, num_splits, 1)


@triton.jit(do_not_specialize=["window", "num_splits", "split_seqs", "stride_bt"])
def decode_split_kernel(
    out_ptr,  # [T, num_heads, HEAD_DIM]
    part_out_ptr,  # [split_seqs, num_heads, num_splits, HEAD_DIM] fp32, unnormalised
    part_max_ptr,
    part_sum_ptr,  # [split_seqs, num_heads, num_splits] fp32 (max in the log2 domain)
    counters_ptr,  # [>= split_seqs * num_kv_heads] int32, zero at launch; zero again at its end
    q_ptr,  # [T, num_heads, HEAD_DIM]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_table_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    decode_order_ptr,  # [B] int32, a permutation of range(B), read when ORDERED; else None
    qk_scale,
    window,
    num_splits,
    split_seqs,
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
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ORDERED: tl.constexpr,
    EARLY_FIRST_TILE: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program: one split of one sequence's keys x the GROUP query heads of one KV head. A
    sequence with one live split writes its output; else the group's last live split to finish
    merges (see the module notes for the ordering). Grid (KV heads, programs): program_split."""
    kv_head = tl.program_id(0)
    num_kv_heads = tl.num_programs(0)
    rank, split, seq_splits = program_split(tl.program_id(1), split_seqs, num_splits)
    seq = rank
    if ORDERED:
        seq = tl.load(decode_order_ptr + rank)
    q_token = tl.load(query_start_loc_ptr + seq)
    has_query = tl.load(query_start_loc_ptr + seq + 1) > q_token  # else a padding sequence
    seq_len = tl.load(seq_lens_ptr + seq)
    if not EARLY_FIRST_TILE:  # a large batch: its split sequences split only as far as they pay
        seq_splits = balanced_splits(
            seq_len,
            seq_splits,
            split_seqs,
            seq_lens_ptr,
            decode_order_ptr,
            window,
            USE_WINDOW,
            ORDERED,
        )
    kv_lo, kv_hi, num_live = split_key_range(
        seq_len, window, seq_splits, split, BLOCK_N, USE_WINDOW
    )
    offs_d = tl.arange(0, HEAD_DIM)
    table_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    if EARLY_FIRST_TILE:
        # The split's first tile of keys [kv_lo, first_hi), read before the wait except the newest
        # key (position seq_len - 1), which prepare_qkv writes in this step: the cache's other keys
        # come from earlier steps. Empty (every mask false) for a padding sequence or an empty split.
        first_hi = tl.minimum(kv_lo + BLOCK_N, kv_hi)
        offs_n, in_first, k_offs, v_offs = key_tile_offsets(
            kv_lo,
            first_hi,
            table_row,
            kv_head,
            stride_kc_blk,
            stride_kc_slot,
            stride_kc_h,
            stride_vc_blk,
            stride_vc_slot,
            stride_vc_h,
            BLOCK_N,
            BLOCK_SIZE,
            True,
        )
        older = in_first & (offs_n < seq_len - 1)
        k = tl.load(k_cache_ptr + k_offs[None, :] + offs_d[:, None], mask=older[None, :], other=0.0)
        v = tl.load(v_cache_ptr + v_offs[:, None] + offs_d[None, :], mask=older[:, None], other=0.0)
    # above: step inputs and keys of earlier steps (a one-token query never shares a block another
    # sequence fills in this step: kv_cache_manager); below: q and the newest key, from prepare_qkv
    pdl.wait_for_producers(PDL)
    if not has_query or split >= num_live:  # no keys: stores nothing, does not count
        return
    rows = tl.arange(0, BLOCK_M)
    heads = kv_head * GROUP + rows  # [BLOCK_M]
    row_ok = rows < GROUP
    q_offs = q_token.to(tl.int64) * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0).to(k_cache_ptr.dtype.element_ty)
    q_pos = tl.full([BLOCK_M], 0, tl.int32) + seq_len - 1
    if EARLY_FIRST_TILE:
        newest = in_first & (offs_n == seq_len - 1)  # in the last live split's first tile, or later
        k = tl.where(
            newest[None, :],
            tl.load(
                k_cache_ptr + k_offs[None, :] + offs_d[:, None], mask=newest[None, :], other=0.0
            ),
            k,
        )
        v = tl.where(
            newest[:, None],
            tl.load(
                v_cache_ptr + v_offs[:, None] + offs_d[None, :], mask=newest[:, None], other=0.0
            ),
            v,
        )
        # every key of the split is visible to the query (the window starts at kv_lo at the earliest)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        p, alpha, m_i, l_i = online_softmax(
            tl.where(in_first[None, :], s, float("-inf")),
            tl.full([BLOCK_M], float("-inf"), tl.float32),
            tl.zeros([BLOCK_M], tl.float32),
        )
        acc = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)  # [BLOCK_M, HEAD_DIM] fp32
        # the remaining keys [first_hi, kv_hi): whole tiles unmasked (no window), then a partial one
        kv_mid = first_hi
        if not USE_WINDOW:
            kv_mid = first_hi + (kv_hi - first_hi) // BLOCK_N * BLOCK_N
        if kv_hi > first_hi:  # skipped where the split is one tile (no pipeline prologue to pay)
            acc, m_i, l_i = attend_key_range(
                acc,
                m_i,
                l_i,
                q,
                q_pos,
                first_hi,
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
    else:  # the varlen decode's loop: every tile masked, in one pipeline (triton_paged's notes)
        acc, m_i, l_i = attend_keys(
            tl.zeros([BLOCK_M, HEAD_DIM], tl.float32),
            tl.full([BLOCK_M], float("-inf"), tl.float32),
            tl.zeros([BLOCK_M], tl.float32),
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
    if num_live == 1:  # the whole sequence in this program: no partials, no merge
        o_offs = q_token.to(tl.int64) * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :]
        out = acc / l_i[:, None]  # l_i >= 1: the row's max key contributes 2^0
        tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        return
    # num_live > 1 only for the first split_seqs ranks, which own the partial rows of their rank
    part_rows = ((rank * num_kv_heads * GROUP + heads) * num_splits + split).to(
        tl.int64
    )  # [BLOCK_M]
    tl.store(
        part_out_ptr + part_rows[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None]
    )
    tl.store(part_max_ptr + part_rows, m_i, mask=row_ok)
    tl.store(part_sum_ptr + part_rows, l_i, mask=row_ok)

    if last_to_arrive(counters_ptr + rank * num_kv_heads + kv_head, num_live):
        for h in tl.static_range(GROUP):
            head = kv_head * GROUP + h
            merge_head_splits(
                out_ptr + q_token.to(tl.int64) * stride_o_t + head * stride_o_h,
                (rank * num_kv_heads * GROUP + head).to(tl.int64) * num_splits,
                num_live,
                part_out_ptr,
                part_max_ptr,
                part_sum_ptr,
                HEAD_DIM,
                SPLITS_PAD,
            )


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int = DEFAULT_NUM_SMS
) -> int:
    """Splits per split sequence of a decode-only batch; 1 means: don't split (the varlen kernel).
    A small batch (fewer (sequence, KV head) pairs than SMs): enough programs for ~2 waves over the
    SMs, each split at least MIN_KEYS_PER_SPLIT keys, at most MAX_SPLITS. A large batch: splits of
    about LARGE_BATCH_SPLIT_KEYS keys of the longest context, at most LARGE_BATCH_MAX_SPLITS (for
    choose_split_seqs' longest sequences only)."""
    num_programs = num_seqs * num_kv_heads
    if num_programs >= num_sms:
        return min(triton.cdiv(max_seq_len, LARGE_BATCH_SPLIT_KEYS), LARGE_BATCH_MAX_SPLITS)
    by_occupancy = triton.cdiv(2 * num_sms, num_programs)
    by_length = triton.cdiv(max_seq_len, MIN_KEYS_PER_SPLIT)
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


def choose_split_seqs(num_seqs: int, num_kv_heads: int, num_sms: int = DEFAULT_NUM_SMS) -> int:
    """How many of a decode-only batch's sequences split, the longest (decode_order): every one in a
    small batch, the longest 1 / LARGE_BATCH_SPLIT_SHARE in a large one."""
    if num_seqs * num_kv_heads >= num_sms:
        return triton.cdiv(num_seqs, LARGE_BATCH_SPLIT_SHARE)
    return num_seqs


# ops/warm_up.py: its decode step reads more than MIN_KEYS_PER_SPLIT keys of one sequence, so it splits
WARM_UP_REQUESTS = (
    WarmUpRequest(
        MIN_KEYS_PER_SPLIT + 1,
        "the split decode, which a decode over a short context never "
        "takes (with CUDA graphs the capture launched it already)",
    ),
)


def split_decode_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]; sequence b's query (if any) at row query_start_loc[b]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    num_splits: int,
    out: torch.Tensor | None = None,  # [T, num_heads, head_dim], like q; allocated when None
    split_seqs: int | None = None,  # the first this many in decode_order split; None: all of them
) -> torch.Tensor:  # [T, num_heads, head_dim]; rows of no sequence's query are left unwritten
    split_seqs = meta.num_seqs if split_seqs is None else split_seqs
    if (
        meta.max_query_len > 1 or not 1 <= num_splits <= MAX_SPLITS
    ):  # the merge reads SPLITS_PAD = MAX_SPLITS
        raise ValueError(
            f"split decode needs max_query_len <= 1 and 1 <= num_splits <= {MAX_SPLITS}; "
            f"got {meta.max_query_len}, {num_splits}"
        )
    if not 0 <= split_seqs <= meta.num_seqs:
        raise ValueError(f"split_seqs must be in [0, num_seqs={meta.num_seqs}]; got {split_seqs}")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = kv_cache.shape[3]
    out = torch.empty_like(q) if out is None else out
    part_out = torch.empty(
        split_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    part_max = torch.empty(split_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    counters = zeroed_counters(q.device, split_seqs * num_kv_heads)
    order = decode_order(meta, meta.num_seqs)
    constexprs = kernel_constexprs(q, kv_cache, sliding_window)
    if head_dim <= 128:
        constexprs["BLOCK_N"] = SPLIT_BLOCK_N
    num_programs = split_seqs * num_splits + meta.num_seqs - split_seqs  # per KV head
    decode_split_kernel[(num_kv_heads, num_programs)](
        out,
        part_out,
        part_max,
        part_sum,
        counters,
        q,
        kv_cache[0],
        kv_cache[1],
        meta.block_table,
        meta.query_start_loc,
        meta.seq_lens,
        order,
        scale * LOG2_E,
        sliding_window or 0,
        num_splits,
        split_seqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        meta.block_table.stride(0),
        *cache_strides(kv_cache),
        SPLITS_PAD=MAX_SPLITS,  # not from num_splits: one compile for all
        BLOCK_M=max(16, triton.next_power_of_2(constexprs["GROUP"])),
        ORDERED=order is not None,
        EARLY_FIRST_TILE=split_seqs == meta.num_seqs,  # a small batch: every sequence splits
        **constexprs,
        num_warps=SPLIT_NUM_WARPS,
        num_stages=SPLIT_NUM_STAGES,
        **pdl.launch_args(q.device),
    )
    return out
