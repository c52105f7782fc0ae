"""The tiny random Llama of the engine tests (tests/tiny_hf_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_hf_models


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_spec")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder
