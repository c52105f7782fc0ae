"""Shared test set-up. On a machine without CUDA, Triton kernels run in the interpreter:
the variable must be set before any kernel is defined, hence here, before test modules import."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Tests use tiny tensors: one thread avoids oversubscribing CI's two cores (measured:
    # the e2e parity file takes 17 s instead of 6.5 min).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
