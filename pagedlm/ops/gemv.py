"""Small-batch GEMV for decode: y[M, N] = x[M, K] @ weight[N, K].T (+ bias) for M <= MAX_M, accumulated
in float32, optionally with silu_and_mul fused into the prologue (x is then [M, 2K], gate then up, and
the product sees silu(gate) * up rounded to x's dtype, as silu_and_mul followed by F.linear would).
Triton on CUDA, torch (F.linear) elsewhere.

A decoder layer's norms need no kernel of their own when both GEMVs around them take this path:
the producer (o_proj, down_proj) adds the residual in its epilogue and leaves a `ResidualSum` (the
new residual stream h and per-row-block partial sums of h**2), the norm becomes a `PendingNorm`,
and the consumer (gate_up_proj, the next layer's qkv_proj) normalises h in its prologue from those
partial sums. Where a consumer takes cuBLAS instead, `PendingNorm.materialize` runs the norm kernel.

The kernel: pagedlm/ops/gemv_kernel.py.
No host sync and no allocation that depends on device values: safe inside a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from pagedlm.ops import pdl
from pagedlm.ops.activation import silu_and_mul_torch
from pagedlm.ops.counters import zeroed_counters
from pagedlm.ops.gemv_kernel import gemv_kernel
from pagedlm.ops.norm import rms_norm, rms_norm_torch
from pagedlm.ops.triton_compat import patch_interpreter

patch_interpreter()

# Every rule below is a measured choice (H200; benchmarks/gemv_bench.py, decode_replay.py): the
# numbers are in benchmarks/RESULTS.md, "Measured choices".
MAX_M = 8
# Narrow outputs: cuBLAS launches too few CTAs there, the kernel wins at up to MAX_M rows.
MAX_GEMV_N = 2048
# At one row (with PDL) the FMA tiles also win or tie on wide outputs up to this K; at two rows or
# more the tl.dot tiles lose to cuBLAS on wide outputs, so wide ones take it at one row only.
MAX_FMA_K = 16384
ACTS = (None, "silu_and_mul")
MIN_DOT_ROWS = 16  # tl.dot needs every dimension >= 16: x is padded to 16 rows on the dot path
TARGET_WARPS = 1024  # split K until about this many warps (~8 per SM on a 132-SM H200)
# ... and until a program streams at most this many BLOCK_K chunks (the tl.dot tiles), unless that
# launches more than MAX_PROGRAMS programs (an LM head of 16,032 row blocks streams well unsplit)
MAX_CHUNKS_PER_SLICE = 4
MAX_PROGRAMS = 16384
# A weight that fits the GPU's registers a few times over is read whole, in one-tile slices,
# before the PDL wait, while the kernel before runs; larger ones (llama3-8b, LM heads) stream.
PRELOAD_MAX_BYTES = 16 << 20
PRELOAD_BLOCK_N = 4
PRELOAD_BLOCK_K = 1024
# A program of several warps holding all of K for its rows beats K slices of one warp each, whose
# partials the last slice sums after a counter (a store, an atomic and a load after the wait). Weights
# with K <= PRELOAD_BLOCK_K keep one-warp tiles (several warps tied or lost there).
WHOLE_K_MAX = 4096
WHOLE_K_WARPS = 4
WHOLE_K_TILE_BYTES = 32 << 10  # a program's tile: 8 x 2048 or 4 x 4096 in 16 bits
# Streamed weights (above PRELOAD_MAX_BYTES) hold whole K a program too: one rule for all of them
# (llama3-8b's down_proj gains, its other weights are within the noise).
STREAM_BLOCK_N = 8
STREAM_BLOCK_K = 1024
STREAM_WARPS = 4


@dataclass(frozen=True, slots=True)
class ResidualSum:
    """residual + a GEMV's output: the residual stream's next value h [M, N], and sumsq [M, P] float32,
    partial sums of h**2 (their sum over P is each row's)."""

    h: torch.Tensor
    sumsq: torch.Tensor


@dataclass(frozen=True, slots=True)
class PendingNorm:
    """rms_norm(h, weight, eps), not computed yet: `gemv` applies it in its prologue from sumsq."""

    h: torch.Tensor  # [M, K]
    sumsq: torch.Tensor  # [M, P] float32, as ResidualSum.sumsq
    weight: torch.Tensor  # [K]
    eps: float

    def materialize(self) -> torch.Tensor:  # [M, K]
        return rms_norm(self.h, self.weight, self.eps)


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """Launch parameters. split_k is an upper bound: K is cut into whole BLOCK_K chunks, so fewer
    slices are launched when K has fewer chunks (see `launch_split_k`). FMA tiles want block_k a
    multiple of num_warps x 32 lanes x one 16-byte vector (the warps side by side along K): otherwise
    Triton lays the x row out unlike the weight tile and converts through shared memory every chunk
    (seen in the sm_90 TTGIR; with that, only the epilogue's output converts, once)."""

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
            raise ValueError(
                f"GemvConfig.split_k and num_stages must be >= 1; "
                f"got {self.split_k}, {self.num_stages}"
            )
        if self.use_dot and min(self.block_n, self.block_k) < MIN_DOT_ROWS:
            raise ValueError(
                f"GemvConfig.block_n and block_k must be >= {MIN_DOT_ROWS} with use_dot; "
                f"got {self.block_n}, {self.block_k}"
            )


def prefer_gemv(num_rows: int, n: int, k: int) -> bool:
    """Whether x [num_rows, k] @ W[n, k].T should take this kernel rather than cuBLAS (on CUDA)."""
    return num_rows <= MAX_M and (n <= MAX_GEMV_N or (num_rows == 1 and k <= MAX_FMA_K))


@functools.cache  # pure, and called at every eager launch
def default_config(num_rows: int, n: int, k: int, dtype: torch.dtype) -> GemvConfig:
    """A rule from host ints, from the measurements above.
    Larger M (not fp32): tl.dot on 64 weight rows (wgmma m64n16 on Hopper; FMA at M=2 measured
    1.5-2.5x slower than at M=1), K split until about TARGET_WARPS.
    M = 1 or fp32: FMA, whole 16-byte vectors per lane (the warps side by side along K), each program
    all of K for its rows. A weight of at most PRELOAD_MAX_BYTES is read whole before the PDL wait (while
    the kernel before runs): one-warp tiles of PRELOAD_BLOCK_N rows where K <= PRELOAD_BLOCK_K, else
    tiles of WHOLE_K_TILE_BYTES over WHOLE_K_WARPS warps while K <= WHOLE_K_MAX. Other weights stream
    STREAM_BLOCK_N x STREAM_BLOCK_K tiles over STREAM_WARPS warps, K split only where a narrow output
    would launch fewer than TARGET_WARPS warps."""
    if num_rows > 1 and dtype != torch.float32:
        return with_auto_split_k(
            GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=3, use_dot=True), n, k
        )
    min_block_k = 32 * (16 // dtype.itemsize)  # 32 lanes x one 16-byte vector
    block_k = max(triton.next_power_of_2(k), min_block_k)
    weight_bytes = n * k * dtype.itemsize
    if weight_bytes <= PRELOAD_MAX_BYTES and k <= PRELOAD_BLOCK_K:
        return GemvConfig(block_n=PRELOAD_BLOCK_N, block_k=block_k, num_warps=1, num_stages=1)
    if weight_bytes <= PRELOAD_MAX_BYTES and k <= WHOLE_K_MAX:
        return GemvConfig(
            block_n=max(1, WHOLE_K_TILE_BYTES // (block_k * dtype.itemsize)),
            block_k=block_k,
            num_warps=WHOLE_K_WARPS,
            num_stages=1,
        )
    block_k = min(block_k, STREAM_BLOCK_K)
    num_warps = min(STREAM_WARPS, block_k // min_block_k)
    launch_warps = triton.cdiv(n, STREAM_BLOCK_N) * num_warps
    return GemvConfig(
        block_n=STREAM_BLOCK_N,
        block_k=block_k,
        split_k=max(1, TARGET_WARPS // launch_warps),
        num_warps=num_warps,
        num_stages=1,
    )


def with_auto_split_k(config: GemvConfig, n: int, k: int) -> GemvConfig:
    """config with split_k chosen so that the launch has about TARGET_WARPS warps and each program
    at most MAX_CHUNKS_PER_SLICE chunks of K, within MAX_PROGRAMS programs."""
    num_blocks = triton.cdiv(n, config.block_n)
    by_warps = TARGET_WARPS // (num_blocks * config.num_warps)
    by_chunks = min(
        triton.cdiv(triton.cdiv(k, config.block_k), MAX_CHUNKS_PER_SLICE),
        MAX_PROGRAMS // num_blocks,
    )
    return dataclasses.replace(config, split_k=max(1, by_warps, by_chunks))


def launch_split_k(k: int, config: GemvConfig) -> tuple[int, int]:
    """-> (number of K slices launched, K elements per slice: a multiple of block_k)."""
    num_chunks = triton.cdiv(k, config.block_k)
    chunks_per_split = triton.cdiv(num_chunks, min(config.split_k, num_chunks))
    return triton.cdiv(num_chunks, chunks_per_split), chunks_per_split * config.block_k


def gemv(
    x: torch.Tensor | PendingNorm,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    act: str | None = None,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor | ResidualSum:
    """x: [M, K] ([M, 2K] with act="silu_and_mul"; or a PendingNorm of [M, K]), weight: [N, K],
    bias: [N] -> y [M, N] in out_dtype (x's dtype by default), or, with residual [M, N], the
    ResidualSum of y + residual. M must be in [1, MAX_M]. config (Triton path only) overrides
    `default_config`."""
    if input_rows(x).is_cuda:
        return gemv_triton(
            x, weight, bias, act=act, residual=residual, out_dtype=out_dtype, config=config
        )
    return gemv_torch(x, weight, bias, act=act, residual=residual, out_dtype=out_dtype)


def gemv_torch(
    x: torch.Tensor | PendingNorm,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    act: str | None = None,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor | ResidualSum:
    """F.linear; with another out_dtype, the product is computed in it (as the kernel accumulates in
    float32 and rounds once). A PendingNorm is normalised by rms_norm_torch (the row's full sum)."""
    _check_inputs(x, weight, bias, act, residual, out_dtype)
    if isinstance(x, PendingNorm):
        x = rms_norm_torch(x.h, x.weight, x.eps)
    x = silu_and_mul_torch(x) if act else x
    if out_dtype is not None and out_dtype != x.dtype:
        x, weight, bias = (None if t is None else t.to(out_dtype) for t in (x, weight, bias))
    y = F.linear(x, weight, bias)
    if residual is None:
        return y
    h = y + residual
    return ResidualSum(h, h.float().square().sum(-1, keepdim=True))


def gemv_triton(
    x: torch.Tensor | PendingNorm,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    act: str | None = None,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor | ResidualSum:
    """The Triton kernel on any device the kernel can run on (CUDA, or CPU under TRITON_INTERPRET=1)."""
    _check_inputs(x, weight, bias, act, residual, out_dtype)
    norm = x if isinstance(x, PendingNorm) else None
    x = input_rows(x)
    if x.stride(-1) != 1:
        x = x.contiguous()
    (num_rows, _), (n, k) = x.shape, weight.shape
    config = config or default_config(num_rows, n, k, x.dtype)
    split_k, k_per_split = launch_split_k(k, config)
    out = torch.empty(num_rows, n, dtype=out_dtype or x.dtype, device=x.device)
    num_blocks_n = triton.cdiv(n, config.block_n)
    partial, counters, sumsq_out = (
        out,
        out,
        out,
    )  # placeholders: unused without split K or a residual
    if split_k > 1:
        partial = torch.empty(split_k, num_rows, n, dtype=torch.float32, device=x.device)
        counters = zeroed_counters(x.device, num_blocks_n)
    if residual is not None:
        residual = residual.contiguous()
        sumsq_out = torch.empty(num_rows, num_blocks_n, dtype=torch.float32, device=x.device)
    block_m = triton.next_power_of_2(num_rows)
    block_m = max(MIN_DOT_ROWS, block_m) if config.use_dot else block_m
    has_bias = bias is not None
    num_parts = 1 if norm is None else norm.sumsq.shape[1]
    gemv_kernel[(num_blocks_n, split_k)](
        out,
        partial,
        counters,
        x,
        weight,
        bias if has_bias else weight,
        out if residual is None else residual,
        sumsq_out,
        out if norm is None else norm.sumsq,
        weight if norm is None else norm.weight,
        num_rows,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        k_per_split,
        0.0 if norm is None else norm.eps,
        FMA_ROWS=0 if config.use_dot else block_m,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        PARTIAL=split_k > 1,
        HAS_BIAS=has_bias,
        SILU_MUL=act == "silu_and_mul",
        NORM=norm is not None,
        NUM_PARTS=num_parts,
        PARTS_PAD=triton.next_power_of_2(num_parts),
        ADD_RESIDUAL=residual is not None,
        USE_DOT=config.use_dot,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl.launch_args(x.device),
    )
    return out if residual is None else ResidualSum(out, sumsq_out)


def input_rows(x: torch.Tensor | PendingNorm) -> torch.Tensor:
    """The [M, K] rows a GEMV reads: x, or a PendingNorm's h."""
    return x.h if isinstance(x, PendingNorm) else x


def _check_inputs(
    x: torch.Tensor | PendingNorm,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    act: str | None,
    residual: torch.Tensor | None,
    out_dtype: torch.dtype | None,
) -> None:
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}; got {act!r}")
    if out_dtype is not None and not out_dtype.is_floating_point:
        raise ValueError(f"out_dtype must be a float dtype or None (x's); got {out_dtype}")
    norm = x if isinstance(x, PendingNorm) else None
    x = input_rows(x)
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M:
        raise ValueError(f"x must be [M, K] with M (rows) in [1, {MAX_M}]; got {tuple(x.shape)}")
    if weight.dim() != 2 or min(weight.shape) < 1 or weight.stride(-1) != 1:
        raise ValueError(
            f"weight must be [N, K] with N, K >= 1 and unit stride along K; got shape "
            f"{tuple(weight.shape)}, strides {weight.stride()}"
        )
    k_in = weight.shape[1] * (2 if act == "silu_and_mul" else 1)
    if x.shape[1] != k_in:
        raise ValueError(
            f"x's last dim must be {k_in} (weight's K{' x 2 for silu_and_mul' if act else ''}); "
            f"got {x.shape[1]}"
        )
    if weight.dtype != x.dtype or not x.is_floating_point():
        raise ValueError(f"weight's dtype must be x's float dtype {x.dtype}; got {weight.dtype}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(
            f"bias must be [{weight.shape[0]}] (weight's N) in {x.dtype}; "
            f"got {tuple(bias.shape)}, {bias.dtype}"
        )
    if norm is not None:
        _check_norm(norm, act)
    if residual is not None and (
        residual.shape != (x.shape[0], weight.shape[0])
        or residual.dtype != x.dtype
        or out_dtype not in (None, x.dtype)
    ):
        raise ValueError(
            f"residual must be [{x.shape[0]}, {weight.shape[0]}] (x's rows, weight's N) in "
            f"x's dtype {x.dtype}, with out_dtype None; got {tuple(residual.shape)}, "
            f"{residual.dtype}, out_dtype {out_dtype}"
        )


def _check_norm(norm: PendingNorm, act: str | None) -> None:
    """After x's checks: h is [M, K]."""
    (num_rows, hidden), sumsq = norm.h.shape, norm.sumsq
    if act is not None:
        raise ValueError(f"act must be None when x is a PendingNorm; got {act!r}")
    if (
        sumsq.dim() != 2
        or sumsq.shape[0] != num_rows
        or sumsq.shape[1] < 1
        or sumsq.dtype != torch.float32
        or not sumsq.is_contiguous()
        or sumsq.device != norm.h.device
    ):
        raise ValueError(
            f"PendingNorm.sumsq must be contiguous [{num_rows}, P >= 1] float32 on h's device "
            f"{norm.h.device}; got {tuple(sumsq.shape)}, {sumsq.dtype}, {sumsq.device}"
        )
    if norm.weight.shape != (hidden,) or norm.weight.device != norm.h.device:
        raise ValueError(
            f"PendingNorm.weight must be [{hidden}] (h's last dim) on h's device; "
            f"got {tuple(norm.weight.shape)} on {norm.weight.device}"
        )
