"""A tiny random Llama served with sleep mode on and async scheduling (two steps in flight, so
every lifecycle call has steps to drain first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tiny_hf_models
from lifecycle_helpers import make_llm


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_lifecycle")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder


@pytest.fixture(scope="module")
def llm(tiny_dir: Path) -> Any:
    """Tests leave it awake and unpaused."""
    engine = make_llm(tiny_dir)
    yield engine
    assert not engine.is_sleeping() and not engine.is_paused()
