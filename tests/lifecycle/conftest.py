"""A tiny random Llama served with sleep mode on and async scheduling (two steps in flight, so
every lifecycle call has steps to drain first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tiny_hf_models


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_lifecycle")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder


def make_llm(tiny_dir: Path, **overrides: Any) -> Any:
    from pagedlm import LLM

    args = dict(
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
        enable_sleep_mode=True,
        async_scheduling=True,
    )
    return LLM(str(tiny_dir), **{**args, **overrides})


@pytest.fixture(scope="module")
def llm(tiny_dir: Path) -> Any:
    """Tests leave it awake and unpaused."""
    engine = make_llm(tiny_dir)
    yield engine
    assert not engine.is_sleeping() and not engine.is_paused()
