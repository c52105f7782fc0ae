"""Fixtures for the weight-update tests: two tiny random Llamas of one shape (A and B) with their
transformers greedy outputs, and one engine loaded with A, which every test leaves holding A."""

from __future__ import annotations

from typing import Any

import pytest
from rl_helpers import TinyModel, save_tiny


@pytest.fixture(scope="session")
def model_a(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return save_tiny(tmp_path_factory.mktemp("model_a"), seed=0)


@pytest.fixture(scope="session")
def model_b(tmp_path_factory: pytest.TempPathFactory, model_a: TinyModel) -> TinyModel:
    model = save_tiny(tmp_path_factory.mktemp("model_b"), seed=1)
    assert model.greedy != model_a.greedy  # else no test here could tell A from B
    return model


@pytest.fixture(scope="session")
def session_llm(model_a: TinyModel) -> Any:
    from pagedlm import LLM

    return LLM(
        str(model_a.folder),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
    )


@pytest.fixture
def llm(session_llm: Any, model_a: TinyModel) -> Any:
    """The engine holding A; A again after the test, whatever it loaded."""
    yield session_llm
    session_llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_a.folder)})
