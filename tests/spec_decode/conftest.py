"""The tiny random Llama of the engine tests and the draft model tests' pair of checkpoints
(tests/tiny_hf_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_hf_models


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_spec")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(target folder, draft folder, the draft as a transformers model, the target as one)."""
    target = tmp_path_factory.mktemp("target")
    draft = tmp_path_factory.mktemp("draft")
    hf_target = tiny_hf_models.save_tiny_model(target, "llama", seed=1)
    return target, draft, tiny_hf_models.save_tiny_model(draft, "qwen3", seed=2), hf_target
