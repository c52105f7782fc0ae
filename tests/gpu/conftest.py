"""Fixtures of the GPU tests."""

from __future__ import annotations

import pytest
from tiny_hf_models import save_tiny_model

# A Qwen2 of one full and three sliding layers (window 32): four KV cache groups, each layer
# through its own group's slots and block table (core/kv_groups.py)
MIXED_WINDOW = dict(
    num_hidden_layers=4,
    use_sliding_window=True,
    sliding_window=32,
    max_window_layers=1,
    layer_types=["full_attention"] + ["sliding_attention"] * 3,
)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """family -> (folder, transformers model) of tiny random Llama, Qwen3 and Mistral checkpoints,
    and "qwen2-mixed" (MIXED_WINDOW)."""
    root = tmp_path_factory.mktemp("gpu_models")
    models = {
        family: (root / family, save_tiny_model(root / family, family))
        for family in ("llama", "qwen3", "mistral")
    }
    mixed = root / "qwen2-mixed"
    models["qwen2-mixed"] = (mixed, save_tiny_model(mixed, "qwen2", config_overrides=MIXED_WINDOW))
    return models
