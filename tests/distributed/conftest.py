"""Fixtures for the TP tests: the engine tests' tiny models (tests/engine/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_hf_models


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder
