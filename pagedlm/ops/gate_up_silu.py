"""The gated MLP's first half for prefill-sized batches: silu(x @ W_gate.T) * (x @ W_up.T) in one GEMM.

W is gate_up_proj's weight [2I, K] (gate rows, then up rows). Without this, cuBLAS writes gate_up's
[M, 2I] output and silu_and_mul reads it back and writes [M, I], a visible part of a long prefill
step. Here each output tile [BM, BH] loads its gate rows and the matching up rows of W with one TMA
load (W viewed [2, I, K]: two tiles stacked [2 * BH, BK]), so one dot of width 2 * BH accumulates
[gate | up] and the x tile is read once (two dots of width BH, one per half, read it from shared
memory twice and lost end to end); the epilogue writes silu(gate) * up, computed in float32 and
rounded once.

The GEMM is persistent (one program per SM, each looping over output tiles in grouped order, so that
GROUP_M row tiles share each weight tile through L2) and loads and stores through host-side TMA
descriptors (Hopper). Measured against cuBLAS + silu_and_mul (benchmarks/probes/gemm_fusion_probe.py)
and end to end: benchmarks/RESULTS.md, "Measured choices".

Used by layers.Linear for 16-bit inputs of at least MIN_ROWS rows on a device with TMA (sm_90+);
below that cuBLAS + silu_and_mul (or the GEMV, whose prologue does the activation) stay. Under the
Triton interpreter it runs on CPU tensors (tests; the interpreter's tl.dot takes fp16, not bf16).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from pagedlm.ops.device_info import num_sms
from pagedlm.ops.triton_compat import patch_interpreter
from pagedlm.ops.warm_up import WarmUpTarget

patch_interpreter()  # the tile and K loops' bounds are run-time values

MIN_ROWS = 2048  # measured at 2,048 and 16,384 rows (RESULTS.md); smaller batches keep cuBLAS
BLOCK_M, BLOCK_H, BLOCK_K = (
    128,
    128,
    64,
)  # an output tile [BM, BH]: a dot of x [BM, BK] by W [2 * BH, BK]
NUM_STAGES, NUM_WARPS = 3, 8  # the probe's fastest config (128 x 256 x 64, 3 stages, 8 warps)
GROUP_M = 8
DTYPES = (torch.float16, torch.bfloat16)
TMA_MAJORS = (9, 10)  # compute capabilities (major) the kernel is for


@triton.jit
def grouped_tile(tile_id, num_tiles_m, num_tiles_n, GROUP_M: tl.constexpr):
    """Tile id -> (row tile, column tile): GROUP_M row tiles sweep the column tiles together."""
    tiles_per_group = GROUP_M * num_tiles_n
    first_m = (tile_id // tiles_per_group) * GROUP_M
    rows_in_group = tl.minimum(num_tiles_m - first_m, GROUP_M)
    in_group = tile_id % tiles_per_group
    return first_m + in_group % rows_in_group, in_group // rows_in_group


@triton.jit(do_not_specialize=["M"])
def gate_up_silu_kernel(
    x_desc,  # [M, K], blocks [BM, BK]
    w_desc,  # gate_up's weight viewed [2, I, K] (gate, up), blocks [2, BH, BK]
    y_desc,  # [M, I], blocks [BM, BH]
    M,
    I,  # noqa: E741 - the GEMM dimensions' usual names
    K,
    BM: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
):
    """Program p computes output tiles p, p + NUM_PROGRAMS, ... of silu(x @ W_gate.T) * (x @ W_up.T)."""
    num_tiles_m = tl.cdiv(M, BM)
    num_tiles_n = tl.cdiv(I, BH)
    # The epilogue finds its tile from a counter of its own: with the loops flattened and pipelined, the
    # next tile's loads are issued before this tile's store, so the two must not share values.
    epilogue_tile = tl.program_id(0) - NUM_PROGRAMS
    for tile_id in tl.range(
        tl.program_id(0), num_tiles_m * num_tiles_n, NUM_PROGRAMS, flatten=True
    ):
        tile_m, tile_n = grouped_tile(tile_id, num_tiles_m, num_tiles_n, GROUP_M)
        acc = tl.zeros((BM, 2 * BH), tl.float32)  # columns [gate | up] of the output tile
        for k_step in range(
            tl.cdiv(K, BK)
        ):  # TMA zero-fills rows and columns past the tensors' ends
            x = x_desc.load([tile_m * BM, k_step * BK])
            w = w_desc.load([0, tile_n * BH, k_step * BK]).reshape(
                2 * BH, BK
            )  # gate rows, then up rows
            acc = tl.dot(x, w.T, acc)
        epilogue_tile += NUM_PROGRAMS
        tile_m, tile_n = grouped_tile(epilogue_tile, num_tiles_m, num_tiles_n, GROUP_M)
        gate, up = acc.reshape(BM, 2, BH).permute(0, 2, 1).split()
        y_desc.store(
            [tile_m * BM, tile_n * BH], (gate / (1.0 + tl.exp(-gate)) * up).to(y_desc.dtype)
        )


@functools.cache
def _has_tma(device: torch.device) -> bool:
    """Hopper and data-centre Blackwell: TMA, and the ~180 KB of shared memory this config takes
    (sm_120's ~99 KB a block would not hold it)."""
    return (
        device.type == "cuda"
        and torch.version.hip is None
        and torch.cuda.get_device_capability(device)[0] in TMA_MAJORS
    )


def takes_fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether x [M, K] and gate_up's weight [2I, K] (no bias) go through gate_up_silu."""
    return (
        bias is None
        and x.is_cuda
        and x.dim() == 2
        and x.shape[0] >= MIN_ROWS
        and x.dtype in DTYPES
        and x.dtype == weight.dtype
        and _has_tma(x.device)
        and _tma_aligned(x, weight)
    )


def warm_up(target: WarmUpTarget) -> None:
    """ops/warm_up.py: where a step can hold MIN_ROWS rows, the first gated MLP's gate_up layer once on
    zeros of MIN_ROWS rows (it takes this GEMM where takes_fused holds): its only launch before serving
    where num_gpu_blocks_override skips the profile step and FULL_DECODE_ONLY the piecewise capture."""
    if target.max_num_tokens < MIN_ROWS:
        return
    layer = next(
        (
            module.gate_up_proj
            for module in target.model.modules()
            if hasattr(module, "gate_up_proj")
        ),
        None,
    )
    if layer is not None:
        layer.gated(layer.weight.new_zeros(MIN_ROWS, layer.weight.shape[1]))  # None: not fused


def _tma_aligned(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """x, weight and the output [M, I] as TMA needs them (_tma_ready; the output is contiguous)."""
    return (
        _tma_ready(x)
        and _tma_ready(weight)
        and _rows_aligned(weight.shape[0] // 2, x.element_size())
    )


def _tma_ready(t: torch.Tensor) -> bool:
    """TMA: unit last stride, 16-byte aligned base and row stride."""
    return (
        t.stride(-1) == 1
        and _rows_aligned(t.stride(0), t.element_size())
        and t.data_ptr() % 16 == 0
    )


def _rows_aligned(row_elems: int, element_size: int) -> bool:
    return row_elems * element_size % 16 == 0


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [2I, K] (gate rows, then up rows), one 16-bit dtype -> [M, I] silu(gate) * up."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or weight.shape[0] % 2:
        raise ValueError(
            f"x must be [M, K] and weight [2I, K]; got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if x.dtype != weight.dtype or x.dtype not in DTYPES:
        raise ValueError(
            f"x and weight must share a dtype of {DTYPES}; got {x.dtype}, {weight.dtype}"
        )
    num_rows, k = x.shape
    inter = weight.shape[0] // 2
    if not _tma_aligned(x, weight):
        raise ValueError(
            f"x and weight must have unit last strides and 16-byte aligned rows, and the output "
            f"rows of I = {inter} elements must be 16-byte aligned (TMA)"
        )
    out = torch.empty(num_rows, inter, dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    x_desc = TensorDescriptor.from_tensor(x, [BLOCK_M, BLOCK_K])
    row_stride = weight.stride(0)
    w_desc = TensorDescriptor(
        weight, [2, inter, k], [inter * row_stride, row_stride, 1], [2, BLOCK_H, BLOCK_K]
    )
    y_desc = TensorDescriptor.from_tensor(out, [BLOCK_M, BLOCK_H])
    # not fewer where there are fewer tiles (one compile for all M); the interpreter: a few programs,
    # each looping over several tiles
    num_programs = num_sms(x.device, elsewhere=4)
    gate_up_silu_kernel[(num_programs,)](
        x_desc,
        w_desc,
        y_desc,
        num_rows,
        inter,
        k,
        BM=BLOCK_M,
        BH=BLOCK_H,
        BK=BLOCK_K,
        GROUP_M=GROUP_M,
        NUM_PROGRAMS=num_programs,
        num_stages=NUM_STAGES,
        num_warps=NUM_WARPS,
    )
    return out
