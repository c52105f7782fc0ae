"""Fixtures shared by the worker tests."""

from __future__ import annotations

import pytest
from worker_helpers import save_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama saved once per test module: (folder, the transformers model)."""
    path = tmp_path_factory.mktemp("tiny_llama")
    return path, save_tiny_llama(path)
