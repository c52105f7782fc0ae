"""The small-batch GEMV's Triton kernel (host side, configs and the rules: pagedlm/ops/gemv.py).

Program (pid_n, pid_k) owns BLOCK_N output rows and one of split_k slices of K, streaming the weight
in [BLOCK_N, BLOCK_K] tiles (16-byte loads along K). The multiply-accumulate is either fp32 FMAs
with a tl.sum over K (one x row at a time) or, with USE_DOT, tl.dot on the transposed problem
(weight tile as the A operand, x padded to 16 rows as B). With split K each program writes an fp32
partial and the last slice of each row block to finish (an atomic counter) sums them in slice
order: deterministic, and one launch. x's prologue may apply silu_and_mul (SILU_MUL). With PDL the
first weight tile is read before the wait for x's producer (pagedlm/ops/pdl.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

from pagedlm.ops import pdl
from pagedlm.ops.counters import last_to_arrive


@triton.jit
def _load_x(ptrs, mask, K, SILU_MUL: tl.constexpr):
    """x at ptrs in x's dtype; with SILU_MUL, silu(gate at ptrs) * (up at ptrs + K) in fp32, rounded."""
    x = tl.load(ptrs, mask=mask, other=0.0)
    if SILU_MUL:
        gate = x.to(tl.float32)
        up = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        x = (gate / (1.0 + tl.exp(-gate)) * up).to(ptrs.dtype.element_ty)
    return x


@triton.jit
def _fma_accumulate(acc, w, x_ptr, offs_k, mask_k, K, stride_x,
                    FMA_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, SILU_MUL: tl.constexpr):
    """acc[:, m] += w @ x[m] for each of the FMA_ROWS rows, fp32 multiply + tl.sum over K."""
    w = w.to(tl.float32)  # [BLOCK_N, BLOCK_K]
    cols = tl.arange(0, BLOCK_M)
    for m in tl.static_range(FMA_ROWS):
        x = _load_x(x_ptr + m * stride_x + offs_k[None, :], mask_k[None, :], K, SILU_MUL)  # [1, BLOCK_K]
        part = tl.sum(w * x.to(tl.float32), axis=1)  # [BLOCK_N]
        acc = tl.where(cols[None, :] == m, acc + part[:, None], acc)
    return acc


@triton.jit
def _load_weight_tile(w_rows, mask_n, k0, K, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K] of the weight at columns [k0, k0 + BLOCK_K); 0 past K."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :], other=0.0)


@triton.jit
def _accumulate(acc, w, x_ptr, k0, M, K, stride_x,
                FMA_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                SILU_MUL: tl.constexpr, USE_DOT: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] += w [BLOCK_N, BLOCK_K] @ x[:, k0:k0 + BLOCK_K].T"""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask_k = offs_k < K  # slices hold whole chunks: only K cuts one
    if USE_DOT:
        offs_m = tl.arange(0, BLOCK_M)
        x_mask = (offs_m[:, None] < M) & mask_k[None, :]
        x = _load_x(x_ptr + offs_m[:, None] * stride_x + offs_k[None, :], x_mask, K, SILU_MUL)
        return tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    return _fma_accumulate(acc, w, x_ptr, offs_k, mask_k, K, stride_x, FMA_ROWS, BLOCK_M, SILU_MUL)


@triton.jit(do_not_specialize=["M"])
def gemv_kernel(
    out_ptr,  # [M, N] in x's dtype, or float32 (the LM head's logits)
    partial_ptr,  # [num_splits, M, N] float32 (with PARTIAL)
    counters_ptr,  # [>= cdiv(N, BLOCK_N)] int32, zero at launch and at its end (with PARTIAL)
    x_ptr,  # [M, K] rows at stride_x ([M, 2K] gate then up with SILU_MUL)
    weight_ptr,  # [N, K] rows at stride_w
    bias_ptr,  # [N] (read only if HAS_BIAS)
    M, N, K, stride_x, stride_w, k_per_split,
    FMA_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, USE_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (pid_n, pid_k): rows [pid_n * BLOCK_N, +BLOCK_N) of y over K slice pid_k. M is a
    run-time value on the dot path (one compile for every M it takes); the FMA path unrolls its
    FMA_ROWS (= M) rows. With PARTIAL (split K), the last slice of a row block to finish sums the
    block's partials and writes y (pagedlm.ops.counters.last_to_arrive)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    w_rows = weight_ptr + offs_n[:, None].to(tl.int64) * stride_w  # [BLOCK_N, 1]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # y.T tile
    # the first weight tile is read before waiting for x's producer (weights are never written);
    # every launched slice has at least one chunk (launch_split_k)
    w = _load_weight_tile(w_rows, mask_n, k_start, K, BLOCK_K)
    pdl.wait_for_producers(PDL)
    acc = _accumulate(acc, w, x_ptr, k_start, M, K, stride_x, FMA_ROWS, BLOCK_M, BLOCK_K, SILU_MUL, USE_DOT)
    for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
        w = _load_weight_tile(w_rows, mask_n, k0, K, BLOCK_K)
        acc = _accumulate(acc, w, x_ptr, k0, M, K, stride_x, FMA_ROWS, BLOCK_M, BLOCK_K, SILU_MUL, USE_DOT)
    out_mask = mask_n[:, None] & (offs_m[None, :] < M)
    if PARTIAL:
        part_offs = offs_m[None, :] * N + offs_n[:, None]  # [BLOCK_N, BLOCK_M] within one slice
        tl.store(partial_ptr + pid_k * M * N + part_offs, acc, mask=out_mask)
        num_splits = tl.num_programs(1)
        if last_to_arrive(counters_ptr + pid_n, num_splits):
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(num_splits):  # in slice order: deterministic
                acc += tl.load(partial_ptr + s * M * N + part_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
            _store_y(out_ptr, bias_ptr, acc, offs_n, offs_m, mask_n, out_mask, N, HAS_BIAS)
    else:
        _store_y(out_ptr, bias_ptr, acc, offs_n, offs_m, mask_n, out_mask, N, HAS_BIAS)


@triton.jit
def _store_y(out_ptr, bias_ptr, acc, offs_n, offs_m, mask_n, out_mask, N, HAS_BIAS: tl.constexpr):
    """y.T tile acc [BLOCK_N, BLOCK_M] (+ bias), rounded once to out's dtype."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + offs_m[None, :] * N + offs_n[:, None], acc.to(out_ptr.dtype.element_ty), mask=out_mask)
