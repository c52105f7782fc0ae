"""Weight-only quantized matmuls for the CPU, through the packed kernels torch ships:
`_weight_int4pack_mm_for_cpu` (4-bit codes in groups of 32 columns, a scale and a zero per group)
and `_weight_int8pack_mm` (int8 codes, one scale per output row). Both read activations in
bfloat16 (in float32 they fall back to a loop ~30x slower): a float32 input is cast for them.
From DENSE_MIN_ROWS rows on a matmul is a float32 GEMM of the dequantised weight, and the
embedding rows of such a step come out in float32, so a prefill carries float32 activations
through every layer instead of converting to and from bfloat16 around each GEMM.

A weight arrives as a QuantizedTensor (the GGUF loader maps each llama.cpp block type to one of
the two, pagedlm/model/gguf_quant.py); `pack` turns it into the module a Linear or Embedding calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

GROUP_SIZE = 32  # columns per int4 group: llama.cpp's Q4_0 / Q4_1 / Q4_K sub-block size
INT4_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu needs rows (N) in multiples of 16
INT4_OFFSET = 8  # the int4 kernel computes (code - 8) * scale + zero
# From this many rows on, a matmul dequantises its weight to float32 and runs the float32 GEMM:
# the packed kernels are GEMVs at heart. One thread, [3072, 576]: int4 0.33 / 2.0 / 8.4 / 62 ms at
# 1 / 16 / 64 / 512 rows, float32 0.72 / 1.9 / 4.1 / 27 ms, bfloat16 0.59 / 2.1 / 7.6 / 50 ms;
# the dequantisation ~5 ms. Measured one against the other, dense wins from ~256 rows (1.3-1.7x).
DENSE_MIN_ROWS = 256


@dataclass(frozen=True)
class QuantizedTensor:
    """A weight [rows, cols] as integer codes: w = scales * codes + mins, one scale (and min) per
    group of `group_size` columns. 4 bits: codes 0..15 in groups of GROUP_SIZE; 8 bits: int8 codes,
    one group per row, no mins (symmetric)."""

    codes: torch.Tensor  # [rows, cols] uint8 (4 bits) or int8 (8 bits)
    scales: torch.Tensor  # [rows, cols // group_size] float32
    mins: torch.Tensor | None  # [rows, cols // group_size] float32; None for 8 bits
    bits: int

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def group_size(self) -> int:
        return self.codes.shape[1] // self.scales.shape[1]

    def dequantize(self) -> torch.Tensor:
        """[rows, cols] float32."""
        per_column = self.scales.repeat_interleave(self.group_size, dim=1)
        weight = self.codes.float() * per_column
        if self.mins is not None:
            weight += self.mins.repeat_interleave(self.group_size, dim=1)
        return weight

    def map_rows(self, fn) -> QuantizedTensor:
        """The same weight with fn (a permutation or slice of dim 0) applied to every row field."""
        mins = None if self.mins is None else fn(self.mins)
        return QuantizedTensor(fn(self.codes), fn(self.scales), mins, self.bits)


def int4_groups(weight: torch.Tensor) -> QuantizedTensor:
    """The nearest 4-bit form of weight [rows, cols] (cols a multiple of GROUP_SIZE): each group's
    range [min, max] cut in 15 steps. Exact for values already on such a grid spanning it."""
    groups = weight.float().reshape(weight.shape[0], -1, GROUP_SIZE)  # [rows, G, 32]
    low, high = groups.amin(dim=2), groups.amax(dim=2)  # [rows, G]
    scales = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    codes = ((groups - low[..., None]) / scales[..., None]).round_().clamp_(0, 15)
    return QuantizedTensor(codes.to(torch.uint8).reshape(weight.shape), scales, low, bits=4)


def int8_rows(weight: torch.Tensor) -> QuantizedTensor:
    """The nearest symmetric int8 form of weight [rows, cols], one scale per row."""
    weight = weight.float()
    scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp_min(
        torch.finfo(torch.float32).tiny
    )  # [rows, 1]
    codes = (weight / scales).round_().clamp_(-127, 127).to(torch.int8)
    return QuantizedTensor(codes, scales, None, bits=8)


def concat_rows(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Row shards (q, k, v; gate, up) as one weight: 4 bits if every part is, else int8 rows."""
    if any(part.bits != parts[0].bits for part in parts):
        parts = [part if part.bits == 8 else int8_rows(part.dequantize()) for part in parts]
    mins = None if parts[0].mins is None else torch.cat([part.mins for part in parts])
    return QuantizedTensor(
        torch.cat([part.codes for part in parts]),
        torch.cat([part.scales for part in parts]),
        mins,
        parts[0].bits,
    )


class Int4Matmul(nn.Module):
    """y = x W^T for W in 4-bit groups of GROUP_SIZE columns."""

    def __init__(self, weight: QuantizedTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features = weight.shape[0]
        codes = weight.codes.to(torch.int32)  # [N, K]
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        )  # [N, K / 2] uint8
        zeros = weight.mins + INT4_OFFSET * weight.scales  # [N, G]
        self.register_buffer(
            "scales_and_zeros", torch.stack((weight.scales.t(), zeros.t()), dim=-1).to(dtype)
        )  # [G, N, 2]
        # the same codes two to a byte for dequantize(), llama.cpp's order: byte j of a group holds
        # column j in its low nibble and column j + 16 in its high one, so each nibble plane
        # decodes into one contiguous half-group (no interleaving pass)
        halves = weight.codes.view(self.out_features, -1, 2, GROUP_SIZE // 2)  # [N, G, 2, 16]
        self.register_buffer("nibbles", halves[:, :, 0] | (halves[:, :, 1] << 4))  # [N, G, 16]
        self.register_buffer("scales", weight.scales[..., None].contiguous())  # [N, G, 1] float32
        self.register_buffer("mins", weight.mins[..., None].contiguous())  # [N, G, 1] float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, N] in x's dtype."""
        if x.shape[0] >= DENSE_MIN_ROWS:
            return F.linear(x.float(), self.dequantize()).to(x.dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(self.scales_and_zeros.dtype), self.packed, GROUP_SIZE, self.scales_and_zeros
        )
        return y.to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32 in the shared scratch: valid until the next Int4Matmul.dequantize."""
        weight = _scratch(self.nibbles.numel() * 2).view(*self.nibbles.shape[:2], 2, -1)
        weight[:, :, 0].copy_(self.nibbles & 0x0F)  # [N, G, 16] columns 0..15 of each group
        weight[:, :, 1].copy_(self.nibbles >> 4)  # columns 16..31
        by_group = weight.view(*self.nibbles.shape[:2], GROUP_SIZE)  # [N, G, 32]
        by_group.mul_(self.scales).add_(self.mins)
        return weight.view(self.out_features, -1)


_SCRATCH: list[torch.Tensor] = [torch.empty(0)]


def _scratch(numel: int) -> torch.Tensor:
    """A float32 buffer of numel elements, one for every layer: a dense matmul uses its weight
    only within the call (CPU ops are synchronous), so one layer's weight overwrites the last's
    instead of each call allocating (and page-faulting) a fresh one. Largest weight: 7 MB."""
    if _SCRATCH[0].numel() < numel:
        _SCRATCH[0] = torch.empty(numel)
    return _SCRATCH[0][:numel]


class Int8Matmul(nn.Module):
    """y = x W^T for W in int8 with one scale per row; also W's rows themselves (embeddings)."""

    def __init__(self, weight: QuantizedTensor, dtype: torch.dtype) -> None:
        super().__init__()
        if weight.bits != 8:
            weight = int8_rows(weight.dequantize())
        self.out_features = weight.shape[0]
        self.register_buffer("codes", weight.codes.contiguous())  # [N, K] int8
        self.register_buffer("scales", weight.scales.reshape(-1).to(dtype))  # [N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, N] in x's dtype."""
        if x.shape[0] >= DENSE_MIN_ROWS:
            weight = self.codes.float() * self.scales.float()[:, None]  # [N, K]
            return F.linear(x.float(), weight).to(x.dtype)
        return torch.ops.aten._weight_int8pack_mm(
            x.to(self.scales.dtype), self.codes, self.scales
        ).to(x.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> W[ids] [T, K]: in float32 for a dense step (DENSE_MIN_ROWS rows on), else in
        the scales' dtype."""
        dtype = torch.float32 if ids.shape[0] >= DENSE_MIN_ROWS else self.scales.dtype
        return self.codes[ids].to(dtype) * self.scales[ids, None]


def pack(weight: QuantizedTensor, dtype: torch.dtype) -> Int4Matmul | Int8Matmul:
    """The matmul module for weight; 4-bit shapes the int4 kernel cannot take go to int8 rows."""
    rows, cols = weight.shape
    fits_int4 = rows % INT4_N_MULTIPLE == 0 and cols % GROUP_SIZE == 0
    if weight.bits == 4 and fits_int4:
        return Int4Matmul(weight, dtype)
    return Int8Matmul(weight, dtype)


def takes_quantized(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weights of this device and dtype may load quantized: the kernels run on the CPU
    and are fast only for bfloat16 activations."""
    return device.type == "cpu" and dtype == torch.bfloat16
