"""The fused gate_up + SiLU-and-mul GEMM (ops/gate_up_silu.py) against F.linear + silu_and_mul in float32:
ragged shapes (M, I and K not multiples of the tiles, the last column tile's gate half reading past I),
several tiles a program, outputs NaN-poisoned (ops/conftest.py); fp16 under the interpreter on CPU, bf16
at the engine's shapes on the GPU; the dispatch rule (layers.Linear.gated)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedlm.model.layers import Linear
from pagedlm.ops import gate_up_silu as fused
from pagedlm.ops.activation import silu_and_mul_torch


def _reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return silu_and_mul_torch(F.linear(x.float(), weight.float()))


def _check(num_rows: int, inter: int, k: int, dtype: torch.dtype, device: str, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, k, generator=generator).to(device, dtype)
    weight = (torch.randn(2 * inter, k, generator=generator) / k**0.5).to(device, dtype)
    got = fused.gate_up_silu(x, weight)
    want = _reference(x, weight)
    assert got.shape == (num_rows, inter) and got.dtype == dtype
    assert torch.isfinite(got).all()  # every element written (the output starts as NaN)
    error = (got.float() - want).abs().max().item()
    assert error <= 1e-2 * want.abs().max().item(), error


@pytest.mark.parametrize("num_rows, inter, k", [(37, 40, 48), (16, 16, 16), (5, 72, 80)])
def test_small_tiles_ragged(
    monkeypatch: pytest.MonkeyPatch, num_rows: int, inter: int, k: int
) -> None:
    """16 x 16 x 16 tiles: several row, column and K tiles, 4 programs looping over them."""
    if torch.cuda.is_available():
        pytest.skip("the small tiles are for the interpreter")
    for name in ("BLOCK_M", "BLOCK_H", "BLOCK_K"):
        monkeypatch.setattr(fused, name, 16)
    _check(num_rows, inter, k, torch.float16, "cpu", seed=num_rows)


def test_strided_weight_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight whose rows are a slice of wider ones (row stride > K): the descriptor follows the stride."""
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter case")
    for name in ("BLOCK_M", "BLOCK_H", "BLOCK_K"):
        monkeypatch.setattr(fused, name, 16)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(20, 48, generator=generator).half()
    wide = (torch.randn(64, 64, generator=generator) / 8).half()
    weight = wide[:, :48]  # [2I = 64, K = 48], row stride 64
    want = _reference(x, weight)
    torch.testing.assert_close(fused.gate_up_silu(x, weight).float(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "num_rows, inter, k", [(2085, 14336, 4096), (3000, 3072, 1024), (2053, 1000, 256)]
)
def test_gpu_bf16_engine_shapes(num_rows: int, inter: int, k: int) -> None:
    """llama3-8b's and qwen3-0.6b's MLP at prefill sizes, and an I that the 128-column tiles do not divide."""
    _check(num_rows, inter, k, torch.bfloat16, "cuda", seed=k)


def test_linear_takes_the_fused_gemm_only_where_it_applies() -> None:
    layer = Linear(64, 128, bias=False, dtype=torch.float16)
    layer.weight.data.zero_()
    assert layer.gated(torch.zeros(4, 64).half()) is None  # CPU tensors (and below MIN_ROWS)
    if torch.cuda.is_available():
        layer = layer.cuda()
        assert layer.gated(torch.ones(fused.MIN_ROWS - 1, 64, device="cuda").half()) is None
        assert layer.gated(torch.ones(fused.MIN_ROWS, 64, device="cuda")) is None  # fp32
        odd = Linear(
            64, 82, bias=False, dtype=torch.float16
        ).cuda()  # I = 41: output rows not TMA-aligned
        assert odd.gated(torch.ones(fused.MIN_ROWS, 64, device="cuda").half()) is None
        got = layer.gated(torch.ones(fused.MIN_ROWS, 64, device="cuda").half())
        assert (
            got is not None and got.shape == (fused.MIN_ROWS, 64) and (got == 0).all()
        )  # zero weight


def test_rejects_bad_input() -> None:
    x = torch.zeros(4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="weight \\[2I, K\\]"):
        fused.gate_up_silu(x, torch.zeros(127, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="share a dtype"):
        fused.gate_up_silu(x, torch.zeros(128, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="16-byte aligned"):
        fused.gate_up_silu(
            torch.zeros(4, 130, dtype=torch.float16)[:, :64],
            torch.zeros(128, 64, dtype=torch.float16),
        )
    with pytest.raises(ValueError, match="I = 41"):  # output rows of 82 bytes
        fused.gate_up_silu(x, torch.zeros(82, 64, dtype=torch.float16))
