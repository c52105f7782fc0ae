"""Every test of the ops kernels allocates through NaN-poisoned torch.empty / empty_like, and starts from
the same global RNG state: a test's random inputs must not depend on which tests ran before it (a bf16
tolerance check in test_gemv_one_row_rule.py failed only after another file drew numbers first)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def poison_new_tensors(nan_poisoned_empty: None) -> None:
    """tests/conftest.py's nan_poisoned_empty for every test here."""


@pytest.fixture(autouse=True)
def seeded_rng() -> None:
    torch.manual_seed(0)
