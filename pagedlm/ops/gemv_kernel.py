"""The small-batch GEMV's Triton kernel (host side, configs and the rules: pagedlm/ops/gemv.py).

Program (pid_n, pid_k) owns BLOCK_N output rows and one of split_k slices of K, streaming the weight
in [BLOCK_N, BLOCK_K] tiles (16-byte loads along K). The multiply-accumulate is either fp32 FMAs
with a tl.sum over K (one x row at a time) or, with USE_DOT, tl.dot on the transposed problem
(weight tile as the A operand, x padded to 16 rows as B). With split K each program writes an fp32
partial and the last slice of each row block to finish (an atomic counter) sums them in slice
order: deterministic, and one launch. x's prologue may apply silu_and_mul (SILU_MUL) or RMSNorm
with a residual add (NORM, FMA tiles only). With PDL the first weight tile is read before the wait
for x's producer (pagedlm/ops/pdl.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

from pagedlm.ops import pdl


@triton.jit
def _load_x(x_ptr, rows, offs_k, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, rstd,
            SILU_MUL: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """[R, BLOCK_K]: rows `rows` [R] of x at columns offs_k as the product sees them, in x's dtype (0
    past M and K). SILU_MUL: silu(gate) * up in fp32, rounded. NORM: rms_norm(x (+ residual)) with
    each row's rstd [R], rounded where pagedlm.ops.norm rounds."""
    dtype = x_ptr.dtype.element_ty
    mask = (rows < M)[:, None] & (offs_k < K)[None, :]
    ptrs = x_ptr + rows[:, None] * stride_x + offs_k[None, :]
    x = tl.load(ptrs, mask=mask, other=0.0)
    if SILU_MUL:
        gate = x.to(tl.float32)
        up = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        x = (gate / (1.0 + tl.exp(-gate)) * up).to(dtype)
    if NORM:
        x = _add_residual(x, res_ptr + rows[:, None] * stride_r + offs_k[None, :], mask, HAS_RESIDUAL)
        w = tl.load(norm_w_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        x = ((x.to(tl.float32) * rstd[:, None]).to(dtype).to(tl.float32) * w[None, :]).to(dtype)
    return x


@triton.jit
def _add_residual(x, res_ptrs, mask, HAS_RESIDUAL: tl.constexpr):
    """x + residual rounded to x's dtype (as torch adds them); x without HAS_RESIDUAL."""
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _row_rstd(x_ptr, M, K, stride_x, res_ptr, stride_r, res_out_ptr, eps, write_residual,
              BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """[BLOCK_M] fp32: rsqrt(mean(h^2) + eps) of each row h of x (+ residual), which the program with
    write_residual also stores to res_out ([M, K], contiguous rows)."""
    rows = tl.arange(0, BLOCK_M)
    sum_sq = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_R):
        offs_k = k0 + tl.arange(0, BLOCK_R)
        mask = (rows < M)[:, None] & (offs_k < K)[None, :]
        h = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :], mask=mask, other=0.0)
        h = _add_residual(h, res_ptr + rows[:, None] * stride_r + offs_k[None, :], mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(res_out_ptr + rows[:, None] * K + offs_k[None, :], h, mask=mask & write_residual)
        h = h.to(tl.float32)
        sum_sq += tl.sum(h * h, 1)
    return tl.rsqrt(sum_sq / K + eps)


@triton.jit
def _fma_accumulate(acc, w, x_ptr, offs_k, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, rstd,
                    FMA_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, SILU_MUL: tl.constexpr,
                    NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """acc[:, m] += w @ x[m] for each of the FMA_ROWS rows, fp32 multiply + tl.sum over K."""
    w = w.to(tl.float32)  # [BLOCK_N, BLOCK_K]
    cols = tl.arange(0, BLOCK_M)
    for m in tl.static_range(FMA_ROWS):
        row = tl.arange(0, 1) + m  # [1]
        row_rstd = tl.zeros([1], tl.float32) + tl.sum(tl.where(cols == m, rstd, 0.0), 0)
        x = _load_x(x_ptr, row, offs_k, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, row_rstd,
                    SILU_MUL, NORM, HAS_RESIDUAL)  # [1, BLOCK_K]
        part = tl.sum(w * x.to(tl.float32), axis=1)  # [BLOCK_N]
        acc = tl.where(cols[None, :] == m, acc + part[:, None], acc)
    return acc


@triton.jit
def _load_weight_tile(w_rows, mask_n, k0, K, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K] of the weight at columns [k0, k0 + BLOCK_K); 0 past K."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :], other=0.0)


@triton.jit
def _accumulate(acc, w, x_ptr, k0, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, rstd,
                FMA_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                SILU_MUL: tl.constexpr, USE_DOT: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] += w [BLOCK_N, BLOCK_K] @ x[:, k0:k0 + BLOCK_K].T"""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if USE_DOT:
        x = _load_x(x_ptr, tl.arange(0, BLOCK_M), offs_k, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, rstd,
                    SILU_MUL, NORM, HAS_RESIDUAL)
        return tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    return _fma_accumulate(acc, w, x_ptr, offs_k, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, rstd,
                           FMA_ROWS, BLOCK_M, SILU_MUL, NORM, HAS_RESIDUAL)


@triton.jit(do_not_specialize=["M"])
def gemv_kernel(
    out_ptr,  # [M, N] in x's dtype (float32 with OUT_FP32)
    partial_ptr,  # [num_splits, M, N] float32 (with PARTIAL)
    counters_ptr,  # [>= cdiv(N, BLOCK_N)] int32, zero at launch and at its end (with PARTIAL)
    x_ptr,  # [M, K] rows at stride_x ([M, 2K] gate then up with SILU_MUL)
    weight_ptr,  # [N, K] rows at stride_w
    bias_ptr,  # [N] (read only if HAS_BIAS)
    res_ptr,  # [M, K] rows at stride_r: added to x before the norm (HAS_RESIDUAL)
    res_out_ptr,  # [M, K] contiguous: x + residual (written with HAS_RESIDUAL)
    norm_w_ptr,  # [K] the RMSNorm weight (NORM)
    M, N, K, stride_x, stride_w, stride_r, k_per_split, eps,
    FMA_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, USE_DOT: tl.constexpr,
    NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NORM_BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """Program (pid_n, pid_k): rows [pid_n * BLOCK_N, +BLOCK_N) of y over K slice pid_k. M is a
    run-time value on the dot path (one compile for every M it takes); the FMA path unrolls its
    FMA_ROWS (= M) rows. With PARTIAL (split K), the last slice of a row block to finish sums the
    block's partials and writes y (the counter protocol of attention/triton_decode.py). With NORM
    (FMA path only), every program first computes the rows' RMS over all of K (the x rows are in L2),
    and program (0, 0) writes x + residual."""
    tl.static_assert(not (NORM and USE_DOT), "the fused norm is on the FMA path only")
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
    rstd = tl.zeros([BLOCK_M], tl.float32)
    if NORM:
        rstd = _row_rstd(x_ptr, M, K, stride_x, res_ptr, stride_r, res_out_ptr, eps, (pid_n == 0) & (pid_k == 0),
                         BLOCK_M, NORM_BLOCK, HAS_RESIDUAL)
    acc = _accumulate(acc, w, x_ptr, k_start, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, rstd,
                      FMA_ROWS, BLOCK_M, BLOCK_K, SILU_MUL, USE_DOT, NORM, HAS_RESIDUAL)
    for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
        w = _load_weight_tile(w_rows, mask_n, k0, K, BLOCK_K)
        acc = _accumulate(acc, w, x_ptr, k0, M, K, stride_x, res_ptr, stride_r, norm_w_ptr, rstd,
                          FMA_ROWS, BLOCK_M, BLOCK_K, SILU_MUL, USE_DOT, NORM, HAS_RESIDUAL)
    out_mask = mask_n[:, None] & (offs_m[None, :] < M)
    if PARTIAL:
        part_offs = offs_m[None, :] * N + offs_n[:, None]  # [BLOCK_N, BLOCK_M] within one slice
        tl.store(partial_ptr + pid_k * M * N + part_offs, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial stores before the (one-thread) release below
        counter_ptr = counters_ptr + pid_n
        num_splits = tl.num_programs(1)
        if tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(num_splits):  # in slice order: deterministic
                acc += tl.load(partial_ptr + s * M * N + part_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
            _store_y(out_ptr, bias_ptr, acc, offs_n, offs_m, mask_n, out_mask, N, HAS_BIAS)
            tl.store(counter_ptr, 0)
    else:
        _store_y(out_ptr, bias_ptr, acc, offs_n, offs_m, mask_n, out_mask, N, HAS_BIAS)


@triton.jit
def _store_y(out_ptr, bias_ptr, acc, offs_n, offs_m, mask_n, out_mask, N, HAS_BIAS: tl.constexpr):
    """y.T tile acc [BLOCK_N, BLOCK_M] (+ bias), rounded once to out's dtype."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + offs_m[None, :] * N + offs_n[:, None], acc.to(out_ptr.dtype.element_ty), mask=out_mask)
