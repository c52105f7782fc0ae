"""benchmarks/gemm_fusion_probe.py's persistent TMA GEMM and its fused SiLU-and-mul epilogue against
torch, on ragged shapes (M, N, K not multiples of the tiles) with more tiles than programs, so each
program loops over several tiles. On CPU the kernel runs in the Triton interpreter (TMA emulated) in
fp16: Triton 3.6's interpreter multiplies bf16 tl.dot operands as their uint16 storage."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from gemm_fusion_probe import (  # noqa: E402
    TileConfig, deinterleave_gate_up, gemm_call, interleave_gate_up,
)
from pagedlm.ops.activation import silu_and_mul_torch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
SMALL_TILES = [TileConfig(16, 32, 32, 2, 4), TileConfig(32, 64, 64, 3, 4, warp_specialize=True)]
# Ragged against both tiles in every dimension, the fused output's 40 columns too; 9 or 4 tiles over
# 3 programs. Rows stay 16-byte aligned, as TMA needs.
M, N, K = 37, 80, 80
NUM_PROGRAMS = 3


def inputs(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=generator).to(DTYPE)
    weight = (torch.randn(n, k, generator=generator) / k ** 0.5).to(DTYPE)
    return x.to(DEVICE), weight.to(DEVICE)


def nan_output(m: int, n: int) -> torch.Tensor:
    return torch.full((m, n), float("nan"), dtype=DTYPE, device=DEVICE)


@pytest.mark.parametrize("config", SMALL_TILES, ids=lambda c: c.label)
def test_gemm_matches_torch_on_ragged_shapes(config: TileConfig) -> None:
    x, weight = inputs(M, N, K)
    out = nan_output(M, N)
    gemm_call(x, weight, out, config, silu_mul=False, num_programs=NUM_PROGRAMS)()
    want = x.float() @ weight.float().T
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("config", SMALL_TILES, ids=lambda c: c.label)
def test_fused_silu_and_mul_matches_torch_on_ragged_shapes(config: TileConfig) -> None:
    x, weight = inputs(M, N, K)  # gate_up weight: 40 gate rows, then 40 up rows
    out = nan_output(M, N // 2)
    gemm_call(x, interleave_gate_up(weight), out, config, silu_mul=True, num_programs=NUM_PROGRAMS)()
    gate_up = x.float() @ weight.float().T
    want = silu_and_mul_torch(gate_up)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=1e-2)


def test_interleave_pairs_gate_and_up_rows_and_round_trips() -> None:
    inter, k = 5, 3
    weight = torch.arange(2 * inter * k, dtype=torch.float32).view(2 * inter, k)
    interleaved = interleave_gate_up(weight)
    assert torch.equal(interleaved[0::2], weight[:inter])  # row 2j = gate j
    assert torch.equal(interleaved[1::2], weight[inter:])  # row 2j + 1 = up j
    assert torch.equal(deinterleave_gate_up(interleaved), weight)
