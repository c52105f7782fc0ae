"""Edge cases of the truncation filters."""
from __future__ import annotations

import torch

from pagedlm.sample.filters import apply_top_k_top_p


def test_top_p_that_rounds_to_zero_keeps_the_top_token() -> None:
    # top_p = 1e-300 is valid but is 0 in float32: the filter must still keep one token.
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.0], [3.0, 0.0, 0.1, 0.2]])
    top_p = torch.tensor([1e-300, 1e-300], dtype=torch.float32)
    out = apply_top_k_top_p(logits.clone(), torch.zeros(2, dtype=torch.int64), top_p, None)
    assert torch.isfinite(out).sum(dim=-1).tolist() == [1, 1]
    assert out.argmax(dim=-1).tolist() == [1, 0]
