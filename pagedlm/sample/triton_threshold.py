"""min-p, top-k and top-p's threshold (filters.top_k_top_p_threshold) in one Triton kernel.

The torch path finds each cut by a radix select over the values' bits: per level a histogram
(index_add_ with float atomics into 2^15 bins a row), cumulative sums and searches, ~10 kernels a
level. Here one program per row runs the same search from the top bit down, RADIX_BITS bits a pass
over the row: each pass sums the weight of the values at or above each of the 2^RADIX_BITS
candidate values (the bits found so far with each pattern of the next RADIX_BITS bits) and keeps
the largest candidate whose sum still reaches the target. Seven passes of 4 bits and one of 2 (its
16 candidates span 4 bits; only the first 4 can reach the target) cover a probability's 30 bits; a value in [0, 1] orders as its int32 bits. No histogram, no
atomics, one launch.

The kernel is far from its bytes: at many rows the per-candidate sums bound it (a block of 1,024
values skips them only when none of its values lies between the first and last candidate, and near
the cut of a flat distribution most blocks hold one until the fourth pass); at one row one program
walks the row's blocks one after another. Cheaper sums (a weighted histogram in shared memory) would
be the next step. Where every row has a top-k of at most filters.TOP_K_LIMIT, torch.topk's path is
faster and the sampler keeps it. Measured against the torch radix select, and the split passes
tried and not kept: benchmarks/RESULTS.md, "Measured choices".

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

from pagedlm.ops.triton_compat import patch_interpreter
from pagedlm.sample.filters import TopKTopP

patch_interpreter()  # the block loops' bounds are run-time values

RADIX_BITS: tl.constexpr = tl.constexpr(4)
NUM_CANDIDATES: tl.constexpr = tl.constexpr(16)  # 2^RADIX_BITS
TOP_SHIFT: tl.constexpr = tl.constexpr(
    26
)  # the first pass's bits: [26, 30); 1.0 is 0x3F800000 < 2^30
BLOCK = 1024  # values a program reads at a time: [BLOCK, NUM_CANDIDATES] float32 running sums
NUM_WARPS = 8
TINY_F32: tl.constexpr = tl.constexpr(
    torch.finfo(torch.float32).tiny
)  # a top_p that rounds to 0 keeps one id


@triton.jit
def _sums_at_or_above(
    row_ptr, vocab_size, found, shift, floor_bits, WEIGHTED: tl.constexpr, BLOCK: tl.constexpr
):
    """[NUM_CANDIDATES] float32: for each j, the weight of the row's values whose bits are >= found +
    (j << shift): the value itself (WEIGHTED) or 1, counted only for values whose bits are >=
    floor_bits. A value above every candidate adds to all of them (one running sum), one below
    none; only a block holding a value between the first and the last candidate pays for the
    per-candidate sums, and after the first pass or two few blocks do."""
    candidates = found + (tl.arange(0, NUM_CANDIDATES) << shift)  # [C] int32
    window_end = found + (
        NUM_CANDIDATES << shift
    )  # <= 2^30 + 2^30 - 1 (found < 2^30, shift 26: found 0)
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
def _candidate_0(sums):
    """The sum of candidate 0 (the bits found so far with zeros below): of every value the pass counts."""
    return tl.sum(tl.where(tl.arange(0, NUM_CANDIDATES) == 0, sums, 0.0))


@triton.jit
def _pick(sums, target, found, shift):
    """found with the next bits from shift up: the largest candidate j whose sum reaches the target.
    Candidate 0 did at the level above, but each pass sums in another order: with a target within
    rounding of the whole weight (top_p ~ 1 - 1e-7) it may now fall a few ulps short, so the target
    is capped at its sum (else j = 0 by default, and the search ran on under a cut it had passed)."""
    target = tl.minimum(target, _candidate_0(sums))
    j = tl.max(tl.where(sums >= target, tl.arange(0, NUM_CANDIDATES), 0))
    return found + (j << shift)


@triton.jit
def _largest_reaching(
    row_ptr,
    vocab_size,
    target,
    floor_bits,
    WEIGHTED: tl.constexpr,
    IS_FRACTION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The bits of the largest value v of the row with sum(weight of values >= v) >= target (the
    weights of _sums_at_or_above). IS_FRACTION: target is that fraction of the whole weight (at
    least TINY). Passes over bits [26, 30), [22, 26), ..., [2, 6), then [0, 2)."""
    found = tl.zeros([], tl.int32)
    sums = _sums_at_or_above(row_ptr, vocab_size, found, TOP_SHIFT, floor_bits, WEIGHTED, BLOCK)
    if IS_FRACTION:  # candidate 0 is the value 0: its sum is the whole weight
        target = tl.maximum(target * _candidate_0(sums), TINY_F32)
    found = _pick(sums, target, found, TOP_SHIFT)
    for level in tl.static_range(1, 7):
        shift = TOP_SHIFT - RADIX_BITS * level
        sums = _sums_at_or_above(row_ptr, vocab_size, found, shift, floor_bits, WEIGHTED, BLOCK)
        found = _pick(sums, target, found, shift)
    sums = _sums_at_or_above(row_ptr, vocab_size, found, 0, floor_bits, WEIGHTED, BLOCK)
    return _pick(sums, target, found, 0)


# a one-row batch's min-p is a column of the sampling table, 8 bytes into a row; each parameter is read
# once per row: no alignment specialisation (one compile for every batch), as triton_draw's temperature
@triton.jit(do_not_specialize_on_alignment=["floor_ptr", "top_k_ptr", "top_p_ptr"])
def threshold_kernel(
    probs_ptr,
    stride_row,
    vocab_size,
    floor_ptr,
    top_k_ptr,
    top_p_ptr,
    out_ptr,
    HAS_FLOOR: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row of probs [M, V] (float32 in [0, 1]): out[row] = its threshold."""
    row = tl.program_id(0)
    row_ptr = probs_ptr + row.to(tl.int64) * stride_row
    threshold = tl.zeros([], tl.float32)
    if HAS_FLOOR:
        threshold = tl.load(floor_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    if top_k > 0:
        kth = _largest_reaching(row_ptr, vocab_size, top_k.to(tl.float32), 0, False, False, BLOCK)
        threshold = tl.maximum(threshold, kth.to(tl.float32, bitcast=True))
    top_p = tl.load(top_p_ptr + row)
    if top_p < 1.0:
        floor_bits = threshold.to(tl.int32, bitcast=True)
        nucleus = _largest_reaching(row_ptr, vocab_size, top_p, floor_bits, True, True, BLOCK)
        threshold = tl.maximum(
            threshold, nucleus.to(tl.float32, bitcast=True)
        )  # never under min-p or top-k
    tl.store(out_ptr + row, threshold)


def triton_top_k_top_p_threshold(
    probs: torch.Tensor, floor: torch.Tensor | None, params: TopKTopP
) -> torch.Tensor:
    """filters.top_k_top_p_threshold in one launch: probs [M, V] float32 in [0, 1] (top value 1, unit
    stride in V), floor [M] (min-p; None: 0) -> [M]: keep the ids with probs >= it."""
    if probs.stride(-1) != 1:
        probs = probs.contiguous()
    num_rows, vocab_size = probs.shape
    out = torch.empty(num_rows, dtype=torch.float32, device=probs.device)
    if num_rows == 0:
        return out
    floor_arg = (
        out if floor is None else floor.to(torch.float32).contiguous()
    )  # unread without a floor
    threshold_kernel[(num_rows,)](
        probs,
        probs.stride(0),
        vocab_size,
        floor_arg,
        params.top_k.contiguous(),
        params.top_p.to(torch.float32).contiguous(),
        out,
        HAS_FLOOR=floor is not None,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )
    return out
