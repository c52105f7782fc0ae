"""min-p, top-k and top-p's threshold (filters.top_k_top_p_threshold) by Triton kernels.

The torch path finds each cut by a radix select over the values' bits: per level a histogram
(index_add_ with float atomics into 2^15 bins a row), cumulative sums and searches, ~10 kernels a
level (5.2 ms a sampling step with top_p at [256, 151936] on the H200, session 17 run 4). Here the
same search runs from the top bit down, RADIX_BITS bits a pass: a pass sums, for each of the
2^RADIX_BITS candidate values (the bits found so far with each pattern of the next RADIX_BITS bits),
the weight of the values at or above it, and keeps the largest candidate whose sum still reaches
the target. Seven passes of 4 bits and one of 2 cover a probability's 30 bits (a value in [0, 1]
orders as its int32 bits). No histogram, no float atomics.

A pass is one launch over (rows, chunks of CHUNK values): each program stores its chunk's sums, and
the last of a row's programs to finish (ops/counters.last_to_arrive) adds them up in chunk order
and picks. The first version ran a row in one program, all passes in one launch: latency-bound
(one block after another, each waiting for its load; 2.3 ms a step at 256 rows, 0.70 ms at one row
of 128,256, session 17 runs 5-6). Within a pass only blocks holding a value between the first and
last candidate pay for the per-candidate sums; after the first pass or two few do.

Per row, with p = exp((logit - max) / T) in [0, 1] (1 at the top) and the search
largest(weight, target) = the largest value v with sum(weight of values >= v) >= target (always
one of the row's values):
- min-p: the floor (0 without);
- top-k (k > 0): the k-th largest value, largest(1, k); the threshold is the larger of the two;
- top-p (p < 1): largest(the values at or above the threshold, max(top_p x their sum, tiny)).
The same cuts as filters.top_k_top_p_threshold, which tests/sample/test_triton_threshold.py holds it
to (and to a sort). Sums are float32 in a fixed order; where a cut's partial mass lands within
rounding of its target, the two may pick neighbouring values.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.ops.counters import last_to_arrive, zeroed_counters
from pagedlm.sample.filters import TopKTopP

NUM_CANDIDATES: tl.constexpr = tl.constexpr(16)  # 2^RADIX_BITS, RADIX_BITS = 4
# each pass's lowest bit: bits [26, 30) (1.0 is 0x3F800000 < 2^30), [22, 26), ..., [2, 6), then [0, 2)
SHIFTS = (26, 22, 18, 14, 10, 6, 2, 0)
CHUNK = 4096  # values a program of a pass sums: 38 programs a row of 151,936
BLOCK = 1024  # values it reads at a time: [BLOCK, NUM_CANDIDATES] float32 running sums
NUM_WARPS = 4
TINY_F32: tl.constexpr = tl.constexpr(torch.finfo(torch.float32).tiny)  # a top_p that rounds to 0 keeps one id


@triton.jit
def _sums_at_or_above(row_ptr, vocab_size, found, shift, floor_bits,
                      WEIGHTED: tl.constexpr, BLOCK: tl.constexpr):
    """[NUM_CANDIDATES] float32: for each j, the weight of the row's values whose bits are >= found +
    (j << shift): the value itself (WEIGHTED) or 1, counted only for values whose bits are >=
    floor_bits. A value above every candidate adds to all of them (one running sum), one below
    none; only a block holding a value between the first and the last candidate pays for the
    per-candidate sums, and after the first pass or two few blocks do."""
    candidates = found + (tl.arange(0, NUM_CANDIDATES) << shift)  # [C] int32
    window_end = found + (NUM_CANDIDATES << shift)  # < 2^31: found is 0 at shift 26, < 2^30 after
    sums = tl.zeros([BLOCK, NUM_CANDIDATES], tl.float32)
    above = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_row = offs < vocab_size
        values = tl.load(row_ptr + offs, mask=in_row, other=0.0)  # [BLOCK]
        bits = values.to(tl.int32, bitcast=True)
        counted = in_row & (bits >= floor_bits)
        if WEIGHTED:
            weights = tl.where(counted, values, 0.0)
        else:
            weights = tl.where(counted, 1.0, 0.0)
        above += tl.where(bits >= window_end, weights, 0.0)
        in_window = counted & (bits >= found) & (bits < window_end)
        if tl.max(in_window.to(tl.int32)) > 0:
            window_weights = tl.where(in_window, weights, 0.0)
            sums += tl.where(bits[:, None] >= candidates[None, :], window_weights[:, None], 0.0)
    return tl.sum(sums, axis=0) + tl.sum(above, axis=0)


@triton.jit
def _pick(sums, target, found, shift):
    """found with the next bits from shift up: the largest candidate j whose sum reaches the target
    (j = 0 always does: it did at the level above)."""
    j = tl.max(tl.where(sums >= target, tl.arange(0, NUM_CANDIDATES), 0))
    return found + (j << shift)


@triton.jit(do_not_specialize=["shift"])
def search_pass_kernel(probs_ptr, stride_row, vocab_size, active_ptr, found_ptr, target_ptr, floor_bits_ptr,
                       partial_ptr, counters_ptr, shift, WEIGHTED: tl.constexpr, FIRST: tl.constexpr,
                       CHUNK: tl.constexpr, CHUNKS_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, chunk) of one pass of the search of rows whose active flag is set: the chunk's
    sums into partial [M, CHUNKS_PAD, NUM_CANDIDATES]; the row's last program then moves found [M]
    (int32 bits) on by the next bits from shift up. FIRST and WEIGHTED: target [M] holds top_p, and
    becomes top_p x the whole weight (at least TINY_F32)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    if tl.load(active_ptr + row) == 0:
        return
    found = tl.load(found_ptr + row)
    first = chunk * CHUNK
    row_ptr = probs_ptr + row.to(tl.int64) * stride_row + first
    sums = _sums_at_or_above(row_ptr, tl.minimum(vocab_size - first, CHUNK), found, shift,
                             tl.load(floor_bits_ptr + row), WEIGHTED, BLOCK)
    index = tl.arange(0, NUM_CANDIDATES)
    row_partial = partial_ptr + row.to(tl.int64) * CHUNKS_PAD * NUM_CANDIDATES
    tl.store(row_partial + chunk * NUM_CANDIDATES + index, sums)
    num_chunks = tl.num_programs(1)
    if last_to_arrive(counters_ptr + row, num_chunks):
        chunks = tl.arange(0, CHUNKS_PAD)
        parts = tl.load(row_partial + chunks[:, None] * NUM_CANDIDATES + index[None, :],
                        mask=chunks[:, None] < num_chunks, other=0.0, cache_modifier=".cg")
        sums = tl.sum(parts, axis=0)  # [C]
        target = tl.load(target_ptr + row)
        if FIRST and WEIGHTED:  # candidate 0 is the value 0: its sum is the whole weight
            target = tl.maximum(target * tl.sum(tl.where(index == 0, sums, 0.0)), TINY_F32)
            tl.store(target_ptr + row, target)
        tl.store(found_ptr + row, _pick(sums, target, found, shift))


def triton_top_k_top_p_threshold(probs: torch.Tensor, floor: torch.Tensor | None,
                                 params: TopKTopP) -> torch.Tensor:
    """filters.top_k_top_p_threshold by the search passes: probs [M, V] float32 in [0, 1] (top value 1),
    floor [M] (min-p; None: 0) -> [M]: keep the ids with probs >= it. Per row: the floor; with a
    top-k (k > 0), the larger of it and the k-th largest value (the largest v with k values >= v);
    with top-p (p < 1), the largest v whose values >= v, among those at or above that, hold p of
    their weight."""
    if probs.stride(-1) != 1:
        probs = probs.contiguous()
    threshold = (torch.zeros(probs.shape[0], device=probs.device) if floor is None
                 else floor.to(torch.float32, copy=True))  # [M]
    if probs.shape[0] == 0:
        return threshold
    if params.max_top_k > 0:
        top_k = params.top_k
        kth = _search(probs, top_k > 0, top_k.to(torch.float32), torch.zeros_like(top_k, dtype=torch.int32),
                      weighted=False)
        threshold = torch.where(top_k > 0, torch.maximum(threshold, kth), threshold)
    if params.any_top_p:
        top_p = params.top_p.to(torch.float32)
        nucleus = _search(probs, top_p < 1.0, top_p.clone(), threshold.view(torch.int32), weighted=True)
        threshold = torch.where(top_p < 1.0, nucleus, threshold)
    return threshold


def _search(probs: torch.Tensor, active: torch.Tensor, target: torch.Tensor, floor_bits: torch.Tensor,
            weighted: bool) -> torch.Tensor:
    """[M] float32: on active rows the largest value v of the row with sum(weight of values >= v) >=
    target (the weight: the value, or 1; only values whose bits are >= floor_bits count; weighted:
    target is a fraction of the whole weight, consumed); elsewhere 0."""
    num_rows, vocab_size = probs.shape
    num_chunks = triton.cdiv(vocab_size, CHUNK)
    chunks_pad = triton.next_power_of_2(num_chunks)
    found = torch.zeros(num_rows, dtype=torch.int32, device=probs.device)
    partial = torch.empty(num_rows, chunks_pad, NUM_CANDIDATES.value, device=probs.device)
    counters = zeroed_counters(probs.device, num_rows)
    active = active.to(torch.int8)
    for level, shift in enumerate(SHIFTS):
        search_pass_kernel[(num_rows, num_chunks)](
            probs, probs.stride(0), vocab_size, active, found, target, floor_bits.contiguous(), partial, counters,
            shift, WEIGHTED=weighted, FIRST=level == 0, CHUNK=CHUNK, CHUNKS_PAD=chunks_pad, BLOCK=BLOCK,
            num_warps=NUM_WARPS)
    return found.view(torch.float32)
