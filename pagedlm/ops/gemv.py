"""Small-batch GEMV for decode: y[M, N] = x[M, K] @ weight[N, K].T (+ bias) for M <= MAX_M, accumulated
in float32, optionally with silu_and_mul fused into the prologue (x is then [M, 2K], gate then up, and
the product sees silu(gate) * up rounded to x's dtype, as silu_and_mul followed by F.linear would).
Triton on CUDA, torch (F.linear) elsewhere.

Kernel: program (pid_n, pid_k) owns BLOCK_N output rows and one of split_k slices of K, streaming the
weight in [BLOCK_N, BLOCK_K] tiles (16-byte loads along K). The multiply-accumulate is either fp32 FMAs
with a tl.sum over K (one x row at a time) or, with use_dot, tl.dot on the transposed problem
(weight tile as the A operand, x padded to 16 rows as B). With split_k > 1 each program writes an
fp32 partial and the last slice of each row block to finish (an atomic counter) sums them in slice
order: deterministic, and one launch.
No host sync and no allocation that depends on device values: safe inside a CUDA graph.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from pagedlm.ops import pdl
from pagedlm.ops.activation import silu_and_mul_torch
from pagedlm.ops.counters import zeroed_counters
from pagedlm.ops.triton_compat import patch_interpreter

patch_interpreter()

MAX_M = 8
# The H200 measurement (benchmarks/gemv_bench.py, 2026-11-29, RESULTS.md): the kernel beats cuBLAS on
# narrow outputs, where cuBLAS launches too few CTAs (qwen3-0.6b o_proj N=1024 K=2048, M=1: 5.0 vs
# 12.5 µs; down_proj + silu 6.4 vs 7.7), and loses a little on wide ones (llama3-8b qkv, o, down).
MAX_GEMV_N = 2048
ACTS = (None, "silu_and_mul")
MIN_DOT_ROWS = 16  # tl.dot needs every dimension >= 16: x is padded to 16 rows on the dot path
TARGET_WARPS = 1024  # split K until about this many warps (~8 per SM on a 132-SM H200)


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """Launch parameters. split_k is an upper bound: K is cut into whole BLOCK_K chunks, so fewer
    slices are launched when K has fewer chunks (see `launch_split_k`). FMA tiles want num_warps=1 and
    block_k a multiple of 32 lanes x one 16-byte vector: otherwise Triton lays the x row out unlike the
    weight tile and converts through shared memory every chunk (seen in the sm_90 TTGIR)."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    use_dot: bool = False

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"GemvConfig.{name} must be a power of two >= 1; got {value}")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError(f"GemvConfig.split_k and num_stages must be >= 1; "
                             f"got {self.split_k}, {self.num_stages}")
        if self.use_dot and min(self.block_n, self.block_k) < MIN_DOT_ROWS:
            raise ValueError(f"GemvConfig.block_n and block_k must be >= {MIN_DOT_ROWS} with use_dot; "
                             f"got {self.block_n}, {self.block_k}")


def prefer_gemv(num_rows: int, n: int) -> bool:
    """Whether x [num_rows, K] @ W[n, K].T should take this kernel rather than cuBLAS (on CUDA)."""
    return num_rows <= MAX_M and n <= MAX_GEMV_N


def default_config(num_rows: int, n: int, k: int, dtype: torch.dtype) -> GemvConfig:
    """A simple rule from host ints (provisional until the H200 sweep of benchmarks/gemv_bench.py).
    M = 1 or fp32: FMA with one warp per program and one 16-byte vector per lane per row and chunk,
    so the x row, the weight tile and the reduction share one layout (no shared-memory round trip).
    Larger M: tl.dot on 64 weight rows (wgmma m64n16 on Hopper; FMA at M=2 measured 1.5-2.5x slower
    than at M=1). Split K until about TARGET_WARPS."""
    if num_rows > 1 and dtype != torch.float32:
        config = GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=3, use_dot=True)
    else:
        vec = 16 // dtype.itemsize  # elements per 16-byte load
        config = GemvConfig(block_n=8, block_k=32 * vec, num_warps=1, num_stages=1)
    return with_auto_split_k(config, n)


def with_auto_split_k(config: GemvConfig, n: int) -> GemvConfig:
    """config with split_k chosen so that the launch has about TARGET_WARPS warps."""
    num_warps = triton.cdiv(n, config.block_n) * config.num_warps
    return dataclasses.replace(config, split_k=max(1, TARGET_WARPS // num_warps))


def launch_split_k(k: int, config: GemvConfig) -> tuple[int, int]:
    """-> (number of K slices launched, K elements per slice: a multiple of block_k)."""
    num_chunks = triton.cdiv(k, config.block_k)
    chunks_per_split = triton.cdiv(num_chunks, min(config.split_k, num_chunks))
    return triton.cdiv(num_chunks, chunks_per_split), chunks_per_split * config.block_k


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
                    M: tl.constexpr, BLOCK_M: tl.constexpr, SILU_MUL: tl.constexpr):
    """acc[:, m] += w @ x[m] for each of the M rows, fp32 multiply + tl.sum over K."""
    w = w.to(tl.float32)  # [BLOCK_N, BLOCK_K]
    cols = tl.arange(0, BLOCK_M)
    for m in tl.static_range(M):
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
    out_ptr,  # [M, N] in x's dtype
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
    block's partials and writes y (the counter protocol of attention/triton_decode.py)."""
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


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    act: str | None = None, config: GemvConfig | None = None,
) -> torch.Tensor:
    """x: [M, K] ([M, 2K] with act="silu_and_mul"), weight: [N, K], bias: [N] -> [M, N] in x's dtype.
    M must be in [1, MAX_M]. config (Triton path only) overrides `default_config`."""
    if x.is_cuda:
        return gemv_triton(x, weight, bias, act=act, config=config)
    return gemv_torch(x, weight, bias, act=act)


def gemv_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, act: str | None = None,
) -> torch.Tensor:
    _check_inputs(x, weight, bias, act)
    return F.linear(silu_and_mul_torch(x) if act else x, weight, bias)


def gemv_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    act: str | None = None, config: GemvConfig | None = None,
) -> torch.Tensor:
    """The Triton kernel on any device the kernel can run on (CUDA, or CPU under TRITON_INTERPRET=1)."""
    _check_inputs(x, weight, bias, act)
    if x.stride(-1) != 1:
        x = x.contiguous()
    (num_rows, _), (n, k) = x.shape, weight.shape
    config = config or default_config(num_rows, n, k, x.dtype)
    split_k, k_per_split = launch_split_k(k, config)
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    num_blocks_n = triton.cdiv(n, config.block_n)
    partial, counters = out, out  # unread without split K
    if split_k > 1:
        partial = torch.empty(split_k, num_rows, n, dtype=torch.float32, device=x.device)
        counters = zeroed_counters(x.device, num_blocks_n)
    block_m = triton.next_power_of_2(num_rows)
    block_m = max(MIN_DOT_ROWS, block_m) if config.use_dot else block_m
    has_bias = bias is not None
    gemv_kernel[(num_blocks_n, split_k)](
        out, partial, counters, x, weight, bias if has_bias else weight, num_rows, n, k, x.stride(0),
        weight.stride(0), k_per_split, FMA_ROWS=0 if config.use_dot else num_rows, BLOCK_M=block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, PARTIAL=split_k > 1,
        HAS_BIAS=has_bias, SILU_MUL=act == "silu_and_mul", USE_DOT=config.use_dot,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl.launch_args(x.device),
    )
    return out


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None) -> None:
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}; got {act!r}")
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M:
        raise ValueError(f"x must be [M, K] with M (rows) in [1, {MAX_M}]; got {tuple(x.shape)}")
    if weight.dim() != 2 or min(weight.shape) < 1 or weight.stride(-1) != 1:
        raise ValueError(f"weight must be [N, K] with N, K >= 1 and unit stride along K; got shape "
                         f"{tuple(weight.shape)}, strides {weight.stride()}")
    k_in = weight.shape[1] * (2 if act == "silu_and_mul" else 1)
    if x.shape[1] != k_in:
        raise ValueError(f"x's last dim must be {k_in} (weight's K{' x 2 for silu_and_mul' if act else ''}); "
                         f"got {x.shape[1]}")
    if weight.dtype != x.dtype or not x.is_floating_point():
        raise ValueError(f"weight's dtype must be x's float dtype {x.dtype}; got {weight.dtype}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [{weight.shape[0]}] (weight's N) in {x.dtype}; "
                         f"got {tuple(bias.shape)}, {bias.dtype}")
