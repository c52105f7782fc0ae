"""llama.cpp's quantized blocks as pagedlm QuantizedTensors (pagedlm/model/quant_linear.py).

Q4_0 and Q4_1 are read block by block and map exactly (32 weights, a float16 scale and, Q4_1, a
float16 min: w = d * q + m; Q4_0 has m = -8 d). Other types are dequantised by the gguf package and
re-quantised to the nearest supported form: 4 bits or fewer a weight (Q2_K..Q4_K, IQ4) to int4
groups of 32 (Q4_K's sub-blocks are 32 wide: exact up to rounding), more (Q5_*, Q6_K, Q8_0) to int8
with one scale per row. Float tensors (F32, F16, BF16) stay dense."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedlm.model.quant_linear import GROUP_SIZE, QuantizedTensor, int4_groups, int8_rows

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
MAX_INT4_BITS_PER_WEIGHT = 4.5  # Q4_K's 4.5 bits (scales included) still fit int4 groups


def quantized_from_blocks(
    data: np.ndarray, tensor_type: GGMLQuantizationType
) -> QuantizedTensor | None:
    """The QuantizedTensor of a GGUF tensor's raw blocks data [rows, bytes a row], or None for a
    float type (load it dense)."""
    import gguf

    if tensor_type.name in FLOAT_TYPES or data.ndim != 2:
        return None
    if tensor_type in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1):
        return _q4_blocks(data, with_min=tensor_type == gguf.GGMLQuantizationType.Q4_1)
    block_size, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
    weight = torch.from_numpy(gguf.quants.dequantize(data, tensor_type).copy())
    if 8 * type_size / block_size <= MAX_INT4_BITS_PER_WEIGHT and weight.shape[1] % GROUP_SIZE == 0:
        return int4_groups(weight)
    return int8_rows(weight)


def _q4_blocks(data: np.ndarray, with_min: bool) -> QuantizedTensor:
    """Q4_1 block (20 bytes): d, m (float16), 16 bytes of codes: element j in the low nibble of
    byte j, element j + 16 in its high nibble. Q4_0 (18 bytes): d, then the codes; m = -8 d."""
    header = 4 if with_min else 2
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, header + GROUP_SIZE // 2)  # [rows, G, bytes a block]
    scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, G]
    if with_min:
        mins = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    else:
        mins = -8.0 * scales
    packed = blocks[..., header:]  # [rows, G, 16]
    codes = np.concatenate((packed & 0x0F, packed >> 4), axis=-1)  # [rows, G, 32]
    return QuantizedTensor(
        torch.from_numpy(codes.reshape(rows, -1)),
        torch.from_numpy(scales),
        torch.from_numpy(mins),
        bits=4,
    )
