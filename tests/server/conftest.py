"""Servers for the server tests. The default-model server is shared by the whole session; the
others use a tiny random-weight Llama with the default model's tokenizer (fast on a CPU, same
vocabulary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_helpers import API_KEY, ServerProcess, start_server


@pytest.fixture(scope="session")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model (SmolLM2-135M GGUF), an API key, a small body limit, tool_choice
    "auto" read by the hermes parser."""
    log_path = tmp_path_factory.mktemp("default_server") / "server.log"
    server = start_server(
        [
            "--max-model-len",
            "1024",
            "--api-key",
            API_KEY,
            "--max-request-body-bytes",
            "100000",
            "--kv-cache-memory-gib",
            "0.1",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
        ],
        log_path,
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama with the default model's vocabulary (serve it with
    `--tokenizer <default gguf>`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny_llama")
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
