"""The CPU's quantized weights: each GGUF block type mapped to int4 groups or int8 rows against the
gguf package's own dequantisation, the packed matmuls against a float32 product on fresh random
inputs, and the default model's quantized path against its float32 path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.model.quant_linear import (
    DENSE_MIN_ROWS,
    Int4Matmul,
    Int8Matmul,
    QuantizedTensor,
    concat_rows,
    int4_groups,
    int8_rows,
    pack,
)

gguf = pytest.importorskip("gguf")
from pagedlm.model.gguf_quant import quantized_from_blocks  # noqa: E402

ROWS, COLS = 48, 256  # 256: one K-quant super-block a row


def random_blocks(type_name: str, rng: np.random.Generator) -> np.ndarray:
    """Raw blocks [ROWS, bytes a row]: quantized by gguf where it can, else random bytes with
    sane float16 scales (every byte pattern of a K-quant block is a valid block)."""
    tensor_type = gguf.GGMLQuantizationType[type_name]
    weight = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    try:
        return gguf.quants.quantize(weight, tensor_type)
    except NotImplementedError:
        pass
    block_size, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
    raw = rng.integers(0, 256, (ROWS, COLS // block_size, type_size), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.02, (ROWS, COLS // block_size, 2)).astype(np.float16)
    if type_name == "Q6_K":  # d last
        raw[..., -2:] = scales[..., :1].view(np.uint8)
    else:  # d, dmin first
        raw[..., :4] = scales.view(np.uint8).reshape(ROWS, -1, 4)
    return raw.reshape(ROWS, -1)


@pytest.mark.parametrize(
    "type_name, bits, exact",
    [("Q4_0", 4, True), ("Q4_1", 4, True), ("Q4_K", 4, False), ("Q5_1", 8, False),
     ("Q6_K", 8, False), ("Q8_0", 8, False)],
)  # fmt: skip
def test_gguf_blocks_map_to_the_nearest_supported_form(type_name, bits, exact) -> None:
    raw = random_blocks(type_name, np.random.default_rng(0))
    tensor_type = gguf.GGMLQuantizationType[type_name]
    want = torch.from_numpy(gguf.quants.dequantize(raw, tensor_type).copy())  # [ROWS, COLS]
    got = quantized_from_blocks(raw, tensor_type)
    assert got.bits == bits and got.shape == want.shape
    error = (got.dequantize() - want).abs()
    if exact:  # the codes, scales and mins are llama.cpp's own
        assert error.max() <= 1e-6 * want.abs().max()
    else:  # re-rounded onto the new grid: at most half a step
        step = got.scales.repeat_interleave(got.group_size, dim=1)
        assert (error <= 0.5 * step * (1 + 1e-4)).all()
        assert error.max() > 0  # a re-quantisation, not a copy


def test_float_types_stay_dense() -> None:
    data = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float16)
    assert quantized_from_blocks(data, gguf.GGMLQuantizationType.F16) is None


def random_weight(bits: int, rows: int, cols: int, seed: int) -> QuantizedTensor:
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    return int4_groups(weight) if bits == 4 else int8_rows(weight)


@pytest.mark.parametrize("bits, rows", [(4, 96), (8, 96), (8, 40)])
@pytest.mark.parametrize("num_tokens", [1, 7, DENSE_MIN_ROWS])  # packed kernels; dense
def test_packed_matmul_matches_a_float_product(bits: int, rows: int, num_tokens: int) -> None:
    weight = random_weight(bits, rows, 128, seed=rows + bits)
    module = pack(weight, torch.bfloat16)
    assert isinstance(module, Int4Matmul if bits == 4 else Int8Matmul)
    x = torch.randn(num_tokens, 128).to(torch.bfloat16)
    want = x.float() @ weight.dequantize().t()  # [T, rows]
    got = module(x)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    # bfloat16 scales and output: ~3 significant digits
    assert (got.float() - want).abs().max() <= 2e-2 * want.abs().max()


def test_int4_dense_weight_is_exact_from_a_poisoned_shared_scratch() -> None:
    """The prefill's dense weight (nibble planes decoded into the one scratch buffer that every
    layer shares) equals the codes' float32 dequantisation bit for bit, whichever layer wrote the
    scratch last, and the dense matmul is the float32 product with it."""
    from pagedlm.model import quant_linear

    wide, narrow = random_weight(4, 96, 256, seed=3), random_weight(4, 32, 128, seed=4)
    wide_module, narrow_module = pack(wide, torch.bfloat16), pack(narrow, torch.bfloat16)
    quant_linear._scratch(96 * 256).fill_(float("nan"))
    assert torch.equal(wide_module.dequantize(), wide.dequantize())
    assert torch.equal(narrow_module.dequantize(), narrow.dequantize())
    x = torch.randn(DENSE_MIN_ROWS, 256).to(torch.bfloat16)
    want = (x.float() @ wide.dequantize().t()).to(torch.bfloat16)  # [T, 96]
    assert torch.equal(wide_module(x), want)


def test_rows_the_int4_kernel_cannot_take_go_to_int8() -> None:
    weight = random_weight(4, 40, 128, seed=1)  # 40 rows: not a multiple of 16
    module = pack(weight, torch.bfloat16)
    assert isinstance(module, Int8Matmul)
    x = torch.randn(3, 128).to(torch.bfloat16)
    want = x.float() @ weight.dequantize().t()
    assert (module(x).float() - want).abs().max() <= 3e-2 * want.abs().max()


def test_embedding_rows_and_mixed_shards() -> None:
    q, v = random_weight(4, 32, 64, seed=2), random_weight(8, 16, 64, seed=3)
    fused = concat_rows([q, v])  # a 4-bit and an 8-bit shard: int8 rows for both
    assert fused.bits == 8 and fused.shape == (48, 64)
    want = torch.cat([q.dequantize(), v.dequantize()])
    step = fused.scales.repeat_interleave(64, dim=1)
    assert ((fused.dequantize() - want).abs() <= 0.5 * step * (1 + 1e-4)).all()
    table = Int8Matmul(fused, torch.float32)
    ids = torch.tensor([47, 0, 31, 32])
    assert torch.allclose(table.rows(ids), fused.dequantize()[ids], rtol=1e-6, atol=0)
