"""The piecewise CUDA graphs without CUDA: their token counts, the engine argument that turns them
off, and the backend swap of their capture. Capture and replay need CUDA:
tests/gpu/test_piecewise_graphs.py."""

from __future__ import annotations

import pytest
from worker_helpers import make_config, save_tiny_llama

from pagedlm.config import EngineArgs
from pagedlm.model.llama import LlamaAttention
from pagedlm.model.loader import load_model
from pagedlm.worker import cuda_graphs
from pagedlm.worker.piecewise_graphs import PiecewiseGraphs, _attention_swapped, _Pieces
from pagedlm.worker.sizes import MAX_PIECEWISE_SIZE, SizePolicy, piecewise_sizes


def test_piecewise_sizes():
    """Powers of two up to 128, then 8 sizes a doubling: a step is padded by at most 1/8 above 128."""
    sizes = piecewise_sizes(16384)
    assert sizes[:6] == [16, 32, 64, 128, 144, 160] and sizes[-3:] == [1792, 1920, 2048]
    assert len(sizes) == 36 and MAX_PIECEWISE_SIZE == 2048
    assert [b - a for a, b in zip(sizes, sizes[1:]) if a >= 1024] == [128] * 8
    assert all(sizes[i] <= sizes[i - 1] * 9 / 8 for i in range(4, len(sizes)))
    assert piecewise_sizes(96) == [16, 32, 64, 96]  # capped at the token budget, the cap included
    assert piecewise_sizes(300) == [
        16,
        32,
        64,
        128,
        144,
        160,
        176,
        192,
        208,
        224,
        240,
        256,
        288,
        300,
    ]
    assert piecewise_sizes(64) == [16, 32, 64]
    assert piecewise_sizes(8) == [8]


def _piecewise_without_capture(tmp_path, sizes: list[int]) -> PiecewiseGraphs:
    """PiecewiseGraphs over a tiny model on the CPU with a stand-in graph list for each size (no capture)."""
    save_tiny_llama(tmp_path)
    config = make_config(tmp_path)
    model = load_model(config.model, object(), config.device)
    piecewise = PiecewiseGraphs(model, object(), [], SizePolicy(4, max(sizes)), config.device)
    assert piecewise.sizes == sizes
    piecewise._pieces = {size: _Pieces([], []) for size in sizes}
    return piecewise


def test_a_slow_token_count_gives_way_to_the_next_kept_size(tmp_path, monkeypatch):
    """Faked times: 32 loses to 64 by more than the margin, 64 not to 96 (within 10%): steps of 17..32
    tokens replay 64 from now on; 32's pieces go; the largest size stays."""
    piecewise = _piecewise_without_capture(tmp_path, [16, 32, 64, 96])
    fake = {16: 1.0, 32: 3.0, 64: 2.0, 96: 1.9}
    monkeypatch.setattr(
        cuda_graphs, "least_times_ms", lambda sizes, run, device: {s: fake[s] for s in sizes}
    )
    moved = piecewise.keep_fastest()
    assert moved == {32: (64, 3.0, 2.0)}
    assert piecewise.sizes == [16, 64, 96] and set(piecewise._pieces) == {16, 64, 96}
    policy = piecewise._sizes
    assert (
        policy.piecewise_size(17) == 64
        and policy.piecewise_size(65) == 96
        and policy.piecewise_size(97) is None
    )


def test_cudagraph_mode_is_checked(tmp_path):
    save_tiny_llama(tmp_path)
    args = dict(model=str(tmp_path), device="cpu", skip_tokenizer_init=True)
    assert EngineArgs(**args).create_engine_config().cudagraph_mode == "FULL_AND_PIECEWISE"
    assert (
        EngineArgs(**args, cudagraph_mode="FULL_DECODE_ONLY").create_engine_config().cudagraph_mode
        == "FULL_DECODE_ONLY"
    )
    with pytest.raises(
        ValueError,
        match="cudagraph_mode must be one of FULL_AND_PIECEWISE, FULL_DECODE_ONLY; got 'PIECEWISE'",
    ):
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
