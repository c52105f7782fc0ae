"""Per-row relative errors of a kernel's output against its reference (GPU checks): a whole-tensor
norm alone hides a few wrong rows (one wholly wrong row of 4k tokens x 32 heads adds at most ~0.003
to it)."""

from __future__ import annotations

import torch

# A row's relative error divides by its reference norm, floored at this fraction of the RMS of the
# reference's row norms: a zero reference row then counts its absolute error (not 0 / 0 = NaN). The
# checks' rows (attention outputs, q, k and v rows) sit far above it (tests/gpu/test_kernels_gpu.py).
ROW_NORM_FLOOR = 1e-3


def row_rel_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[rows]: each row's (last dim) |out - ref| / max(|ref|, the floor)."""
    diff_norms = (out.float() - ref.float()).flatten(0, -2).norm(dim=1)
    ref_norms = ref.float().flatten(0, -2).norm(dim=1)
    return diff_norms / ref_norms.clamp_min(ROW_NORM_FLOOR * ref_norms.square().mean().sqrt())
