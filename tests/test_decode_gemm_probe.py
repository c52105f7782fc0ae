"""benchmarks/decode_gemm_probe.py's split-K GEMM against torch on ragged shapes: M, N and K not
multiples of the tiles, K slices that do not divide K (the last one short), and a split count that
shrinks because the slices are rounded up to whole BK steps. The output is poisoned before the run.
On CPU in the Triton interpreter (TMA emulated), fp16: Triton 3.6's interpreter multiplies bf16
tl.dot operands as their uint16 storage."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from decode_gemm_probe import split_k_call  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


@pytest.mark.parametrize("m, n, k, splits", [(37, 80, 200, 3), (37, 80, 200, 4), (16, 48, 80, 4), (5, 80, 64, 1)])
def test_split_k_matches_torch(m: int, n: int, k: int, splits: int) -> None:
    generator = torch.Generator().manual_seed(m * n + k + splits)
    x = torch.randn(m, k, generator=generator).to(DTYPE).to(DEVICE)
    weight = (torch.randn(n, k, generator=generator) / k ** 0.5).to(DTYPE).to(DEVICE)
    out = torch.full((m, n), float("nan"), dtype=DTYPE, device=DEVICE)
    split_k_call(x, weight, out, (16, 32, 32, 4, 2, splits))()
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), x.float() @ weight.float().T, atol=2e-2, rtol=1e-2)
