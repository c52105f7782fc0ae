"""Every test of the ops kernels allocates through NaN-poisoned torch.empty / empty_like."""
from __future__ import annotations

import math

import pytest
import torch


@pytest.fixture(autouse=True)
def poison_new_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh float tensors start as NaN, so an element a kernel forgets to write cannot pass."""
    def poisoned(allocate):
        def allocate_nan(*args, **kwargs):
            out = allocate(*args, **kwargs)
            return out.fill_(math.nan) if out.is_floating_point() else out
        return allocate_nan

    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))
