"""Fixtures of the GPU tests."""

from __future__ import annotations

import pytest
from tiny_hf_models import save_tiny_model


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """family -> (folder, transformers model) of tiny random Llama, Qwen3 and Mistral checkpoints."""
    root = tmp_path_factory.mktemp("gpu_models")
    return {
        family: (root / family, save_tiny_model(root / family, family))
        for family in ("llama", "qwen3", "mistral")
    }
