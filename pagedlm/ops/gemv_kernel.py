"""The small-batch GEMV's Triton kernel (host side, configs and the rules: pagedlm/ops/gemv.py).

Program (pid_n, pid_k) owns BLOCK_N output rows and one of split_k slices of K, streaming the weight
in [BLOCK_N, BLOCK_K] tiles (16-byte loads along K). The multiply-accumulate is either fp32 FMAs
with a tl.sum over K (one x row at a time) or, with USE_DOT, tl.dot on the transposed problem
(weight tile as the A operand, x padded to 16 rows as B). With split K each program writes an fp32
partial and the last slice of each row block to finish (an atomic counter) sums them in slice
order: deterministic, and one launch. With PDL the first weight tile is read before the wait for x's
producer (pagedlm/ops/pdl.py).

Fusions around the product, so that a batch-1 decoder layer needs no separate norm kernel:
- prologue SILU_MUL: x = silu(gate) * up;
- prologue NORM: x = rms_norm(h) * norm_weight, where the row's sum of squares comes as partial sums
  (one per row block of the GEMV that produced h, see ADD_RESIDUAL): each program adds up those
  few floats instead of re-reading the whole row;
- epilogue ADD_RESIDUAL: y = (x @ W.T + b) + residual (the residual stream's next value), and the
  sum of y**2 over the block's rows, per row, into sumsq_out[m, pid_n] for the next GEMV's NORM.
Rounding is the unfused ops': y rounds to the model dtype before the add and after it; the norm
rounds h * rstd and then the product with the weight (pagedlm/ops/norm.py).
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
def _load_parts(
    sumsq_ptr, M, BLOCK_M: tl.constexpr, NUM_PARTS: tl.constexpr, PARTS_PAD: tl.constexpr
):
    """[BLOCK_M, PARTS_PAD] fp32: each row's partial sums of h**2 (0 past M and NUM_PARTS)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_p = tl.arange(0, PARTS_PAD)
    mask = (offs_m[:, None] < M) & (offs_p[None, :] < NUM_PARTS)
    return tl.load(sumsq_ptr + offs_m[:, None] * NUM_PARTS + offs_p[None, :], mask=mask, other=0.0)


@triton.jit
def _normed(x, parts, K, eps, norm_w):
    """rms_norm of the x rows [R, BLOCK_K] (model dtype) with their partial sums of squares parts
    [R, PARTS_PAD], times norm_w [1, BLOCK_K] fp32: rounded after h * rstd and after the weight.
    The caller loads x before calling, so x's load and the parts' reduction overlap."""
    rstd = tl.rsqrt(tl.sum(parts, 1) / K + eps)  # [R]
    normed = (x.to(tl.float32) * rstd[:, None]).to(x.dtype).to(tl.float32)
    return (normed * norm_w).to(x.dtype)


@triton.jit
def _fma_accumulate(
    acc,
    w,
    x_ptr,
    offs_k,
    mask_k,
    M,
    K,
    stride_x,
    parts,
    eps,
    norm_w,
    FMA_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
):
    """acc[:, m] += w @ x[m] for each of the FMA_ROWS rows (x rows >= M read as 0), fp32 multiply
    + tl.sum over K."""
    w = w.to(tl.float32)  # [BLOCK_N, BLOCK_K]
    cols = tl.arange(0, BLOCK_M)
    for m in tl.static_range(FMA_ROWS):
        x = _load_x(
            x_ptr + m * stride_x + offs_k[None, :], mask_k[None, :] & (m < M), K, SILU_MUL
        )  # [1, BLOCK_K]
        if NORM:
            row_parts = tl.sum(tl.where(cols[:, None] == m, parts, 0.0), 0)  # row m's [PARTS_PAD]
            x = _normed(x, row_parts[None, :], K, eps, norm_w)
        part = tl.sum(w * x.to(tl.float32), axis=1)  # [BLOCK_N]
        acc = tl.where(cols[None, :] == m, acc + part[:, None], acc)
    return acc


@triton.jit
def _load_weight_tile(w_rows, mask_n, k0, K, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K] of the weight at columns [k0, k0 + BLOCK_K); 0 past K."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(
        w_rows + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :], other=0.0
    )


@triton.jit
def _accumulate(
    acc,
    w,
    x_ptr,
    k0,
    M,
    K,
    stride_x,
    parts,
    eps,
    norm_w_ptr,
    FMA_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    """acc [BLOCK_N, BLOCK_M] += w [BLOCK_N, BLOCK_K] @ x[:, k0:k0 + BLOCK_K].T"""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask_k = offs_k < K  # slices hold whole chunks: only K cuts one
    norm_w = tl.zeros([1, BLOCK_K], tl.float32)
    if NORM:
        norm_w = tl.load(norm_w_ptr + offs_k[None, :], mask=mask_k[None, :], other=0.0).to(
            tl.float32
        )
    if USE_DOT:
        offs_m = tl.arange(0, BLOCK_M)
        x_mask = (offs_m[:, None] < M) & mask_k[None, :]
        x = _load_x(x_ptr + offs_m[:, None] * stride_x + offs_k[None, :], x_mask, K, SILU_MUL)
        if NORM:
            x = _normed(x, parts, K, eps, norm_w)
        return tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    return _fma_accumulate(
        acc,
        w,
        x_ptr,
        offs_k,
        mask_k,
        M,
        K,
        stride_x,
        parts,
        eps,
        norm_w,
        FMA_ROWS,
        BLOCK_M,
        SILU_MUL,
        NORM,
    )


@triton.jit(do_not_specialize=["M"])
def gemv_kernel(
    out_ptr,  # [M, N] in x's dtype, or float32 (the LM head's logits)
    partial_ptr,  # [num_splits, M, N] float32 (with PARTIAL)
    counters_ptr,  # [>= cdiv(N, BLOCK_N)] int32, zero at launch and at its end (with PARTIAL)
    x_ptr,  # [M, K] rows at stride_x ([M, 2K] gate then up with SILU_MUL)
    weight_ptr,  # [N, K] rows at stride_w
    bias_ptr,  # [N] (read only if HAS_BIAS)
    residual_ptr,  # [M, N] contiguous (read only if ADD_RESIDUAL)
    sumsq_out_ptr,  # [M, cdiv(N, BLOCK_N)] float32 (written only if ADD_RESIDUAL)
    sumsq_ptr,  # [M, NUM_PARTS] float32: partial sums of x**2 (read only if NORM)
    norm_w_ptr,  # [K] (read only if NORM)
    M,
    N,
    K,
    stride_x,
    stride_w,
    k_per_split,
    eps,
    FMA_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    NUM_PARTS: tl.constexpr,
    PARTS_PAD: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
    USE_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (pid_n, pid_k): rows [pid_n * BLOCK_N, +BLOCK_N) of y over K slice pid_k. M is a
    run-time value on the dot path (one compile for every M it takes); the FMA path unrolls its
    FMA_ROWS (= BLOCK_M, M rounded up to a power of two: 4 compiles cover M <= 8, which start-up
    meets) rows, those >= M masked. With PARTIAL (split K), the last slice of a row block to finish sums the
    block's partials and writes y (pagedlm.ops.counters.last_to_arrive)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    out_mask = mask_n[:, None] & (offs_m[None, :] < M)
    y_offs = (
        offs_m[None, :] * N + offs_n[:, None]
    )  # [BLOCK_N, BLOCK_M] of y.T in a row-major [M, N]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    w_rows = weight_ptr + offs_n[:, None].to(tl.int64) * stride_w  # [BLOCK_N, 1]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # y.T tile
    # the first weight tile is read before waiting for x's producer (weights are never written);
    # every launched slice has at least one chunk (launch_split_k)
    w = _load_weight_tile(w_rows, mask_n, k_start, K, BLOCK_K)
    pdl.wait_for_producers(PDL)
    parts = tl.zeros([BLOCK_M, PARTS_PAD], tl.float32)
    if NORM:  # reduced only after the first x chunk's load is issued (_normed)
        parts = _load_parts(sumsq_ptr, M, BLOCK_M, NUM_PARTS, PARTS_PAD)
    residual = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    if (
        ADD_RESIDUAL
    ):  # loaded early so its latency hides behind the loop; with split K only the last
        # slice to arrive uses it (a few redundant reads of BLOCK_N x M elements per row block)
        residual = tl.load(residual_ptr + y_offs, mask=out_mask, other=0.0).to(tl.float32)
    acc = _accumulate(
        acc,
        w,
        x_ptr,
        k_start,
        M,
        K,
        stride_x,
        parts,
        eps,
        norm_w_ptr,
        FMA_ROWS,
        BLOCK_M,
        BLOCK_K,
        SILU_MUL,
        NORM,
        USE_DOT,
    )
    for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
        w = _load_weight_tile(w_rows, mask_n, k0, K, BLOCK_K)
        acc = _accumulate(
            acc,
            w,
            x_ptr,
            k0,
            M,
            K,
            stride_x,
            parts,
            eps,
            norm_w_ptr,
            FMA_ROWS,
            BLOCK_M,
            BLOCK_K,
            SILU_MUL,
            NORM,
            USE_DOT,
        )
    if PARTIAL:
        tl.store(partial_ptr + pid_k * M * N + y_offs, acc, mask=out_mask)
        num_splits = tl.num_programs(1)
        if last_to_arrive(counters_ptr + pid_n, num_splits):
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(num_splits):  # in slice order: deterministic
                acc += tl.load(
                    partial_ptr + s * M * N + y_offs, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            _store_y(
                out_ptr,
                bias_ptr,
                residual,
                sumsq_out_ptr,
                acc,
                y_offs,
                offs_n,
                offs_m,
                mask_n,
                out_mask,
                M,
                HAS_BIAS,
                ADD_RESIDUAL,
            )
    else:
        _store_y(
            out_ptr,
            bias_ptr,
            residual,
            sumsq_out_ptr,
            acc,
            y_offs,
            offs_n,
            offs_m,
            mask_n,
            out_mask,
            M,
            HAS_BIAS,
            ADD_RESIDUAL,
        )


@triton.jit
def _store_y(
    out_ptr,
    bias_ptr,
    residual,
    sumsq_out_ptr,
    acc,
    y_offs,
    offs_n,
    offs_m,
    mask_n,
    out_mask,
    M,
    HAS_BIAS: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
):
    """y.T tile acc [BLOCK_N, BLOCK_M] (+ bias), rounded to out's dtype; with ADD_RESIDUAL, + residual
    (fp32 [BLOCK_N, BLOCK_M]) rounded again, and each row's sum of squares of the block's outputs."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    y = acc.to(out_ptr.dtype.element_ty)
    if ADD_RESIDUAL:  # rows past N are 0 in acc, bias and residual, so they add nothing below
        y = (y.to(tl.float32) + residual).to(out_ptr.dtype.element_ty)
        squares = y.to(tl.float32) * y.to(tl.float32)
        tl.store(
            sumsq_out_ptr + offs_m * tl.num_programs(0) + tl.program_id(0),
            tl.sum(squares, 0),
            mask=offs_m < M,
        )
    tl.store(out_ptr + y_offs, y, mask=out_mask)
