"""Every test of the ops kernels allocates through NaN-poisoned torch.empty / empty_like."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def poison_new_tensors(nan_poisoned_empty: None) -> None:
    """tests/conftest.py's nan_poisoned_empty for every test here."""
