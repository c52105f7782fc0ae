"""Fixtures for the engine tests: a tiny model (the tokenizers are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tiny_hf_models


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder


@pytest.fixture(scope="session")
def tiny_llm(tiny_llama_dir: Path) -> Any:
    """Token ids only (no tokenizer); max_model_len 64."""
    from pagedlm import LLM

    return LLM(
        str(tiny_llama_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
    )
