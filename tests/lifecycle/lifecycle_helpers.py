"""The engine the lifecycle tests build (conftest.py's fixtures and the tests that build their own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
