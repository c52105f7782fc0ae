"""Fixtures shared by the attention kernel tests."""
from __future__ import annotations

import math

import pytest
import torch


@pytest.fixture
def nan_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty / empty_like give NaN-filled floating tensors, so unwritten partials read as NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: poison(empty(*args, **kwargs)))
    monkeypatch.setattr(torch, "empty_like", lambda *args, **kwargs: poison(empty_like(*args, **kwargs)))
