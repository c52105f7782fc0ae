"""The piecewise CUDA graphs without CUDA: their token counts, the engine argument that turns them
off, and the backend swap of their capture. Capture and replay need CUDA:
tests/gpu/test_piecewise_graphs.py."""
from __future__ import annotations

import pytest
from worker_helpers import make_config, save_tiny_llama

from pagedlm.config import EngineArgs
from pagedlm.model.llama import LlamaAttention
from pagedlm.model.loader import load_model
from pagedlm.worker.piecewise_graphs import MAX_PIECEWISE_SIZE, _attention_swapped, piecewise_sizes


def test_piecewise_sizes():
    assert piecewise_sizes(16384) == [16, 32, 64, 128, 256, 512, 1024, 2048] and MAX_PIECEWISE_SIZE == 2048
    assert piecewise_sizes(96) == [16, 32, 64, 96]  # capped at the token budget, the cap included
    assert piecewise_sizes(64) == [16, 32, 64]
    assert piecewise_sizes(8) == [8]


def test_cudagraph_mode_is_checked(tmp_path):
    save_tiny_llama(tmp_path)
    args = dict(model=str(tmp_path), device="cpu", skip_tokenizer_init=True)
    assert EngineArgs(**args).create_engine_config().cudagraph_mode == "FULL_AND_PIECEWISE"
    assert EngineArgs(**args, cudagraph_mode="FULL_DECODE_ONLY").create_engine_config().cudagraph_mode \
        == "FULL_DECODE_ONLY"
    with pytest.raises(ValueError, match="cudagraph_mode must be one of FULL_AND_PIECEWISE, FULL_DECODE_ONLY; "
                                         "got 'PIECEWISE'"):
        EngineArgs(**args, cudagraph_mode="PIECEWISE").create_engine_config()


def test_the_capture_swap_restores_every_layers_backend(tmp_path):
    save_tiny_llama(tmp_path)
    config = make_config(tmp_path)
    backend = object()
    model = load_model(config.model, backend, config.device)
    layers = [m for m in model.modules() if isinstance(m, LlamaAttention)]
    assert len(layers) == config.model.num_layers
    stand_in = object()
    with pytest.raises(RuntimeError, match="capture failed"), _attention_swapped(model) as swap:
        swap(stand_in)
        assert all(layer.attn_backend is stand_in for layer in layers)
        raise RuntimeError("capture failed")
    assert all(layer.attn_backend is backend for layer in layers)
