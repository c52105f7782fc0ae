"""Shared test set-up. On a machine without CUDA, Triton kernels run in the interpreter:
the variable must be set before any kernel is defined, hence here, before test modules import."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Tests use tiny tensors: one thread avoids oversubscribing CI's two cores (measured:
    # the e2e parity file takes 17 s instead of 6.5 min).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def nan_poisoned_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh float tensors from torch.empty / empty_like start as NaN, so an element a kernel forgets
    to write (an output, a split partial) cannot pass."""

    def poisoned(allocate):
        def allocate_nan(*args, **kwargs):
            out = allocate(*args, **kwargs)
            return out.fill_(math.nan) if out.is_floating_point() else out

        return allocate_nan

    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))


# Two small hand-built tokenizers (tests/tiny_hf_models.py), shared by the engine and sampling tests
@pytest.fixture(scope="session")
def byte_level_tokenizer() -> Any:
    """Byte-level BPE, as GPT-2 / SmolLM."""
    import tiny_hf_models

    return tiny_hf_models.byte_level_tokenizer()


@pytest.fixture(scope="session")
def sentencepiece_tokenizer() -> Any:
    """SentencePiece-style BPE with byte fallback, as Llama 2 / Mistral."""
    import tiny_hf_models

    return tiny_hf_models.sentencepiece_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_with_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with the byte-level tokenizer (and a chat template) in its folder."""
    import tiny_hf_models

    folder = tmp_path_factory.mktemp("tiny_llama_tokenizer")
    tiny_hf_models.save_tiny_model_with_tokenizer(folder)
    return folder
