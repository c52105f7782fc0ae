"""reload_weights through collective_rpc: in place, from a folder or a GGUF file; a checkpoint
that does not fit raises a clear error and keeps the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_hf_models
import torch
from rl_helpers import greedy, save_gguf
from safetensors.torch import load_file, save_file

from pagedlm.errors import InvalidRequest


def reload(llm, path, **kwargs) -> str:
    return llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path), **kwargs})[0]


def parameter_storages(llm) -> list[int]:
    model = llm.llm_engine.engine_core.model_runner.model
    return [param.data_ptr() for param in model.parameters()]


def test_reload_a_b_a_in_place(llm, model_a, model_b) -> None:
    storages = parameter_storages(llm)
    assert greedy(llm) == model_a.greedy
    first = int(reload(llm, model_b.folder))  # the version: a count when none is given
    assert greedy(llm) == model_b.greedy
    assert reload(llm, model_a.folder) == str(first + 1)
    assert greedy(llm) == model_a.greedy
    assert parameter_storages(llm) == storages  # the same storages: CUDA graphs bind them


def test_reload_from_gguf(llm, model_b, tmp_path: Path) -> None:
    path = save_gguf(tmp_path / "b.gguf", model_b.hf_model)
    assert reload(llm, path, weight_version="gguf-b") == "gguf-b"
    assert greedy(llm) == model_b.greedy


def _other_shape(folder: Path) -> Path:
    tiny_hf_models.save_tiny_model(folder, "llama", vocab_size=tiny_hf_models.VOCAB_SIZE + 8)
    return folder


def _drop_tensor(source: Path, folder: Path, name: str) -> Path:
    tensors = load_file(source / "model.safetensors")
    del tensors[name]
    folder.mkdir()
    save_file(tensors, folder / "model.safetensors")
    return folder


def _with_rope_freqs(path: Path, hf_model) -> Path:
    head_dim = hf_model.config.hidden_size // hf_model.config.num_attention_heads
    return save_gguf(path, hf_model, rope_freqs=torch.linspace(1.0, 4.0, head_dim // 2))


@pytest.mark.parametrize("bad", ["other_shape", "missing", "not_there", "wrong_kind", "rope_freqs"])
def test_bad_checkpoint_errors_and_keeps_weights(llm, model_a, model_b, tmp_path, bad) -> None:
    path, message = {
        "other_shape": (lambda: _other_shape(tmp_path / "big"), r"has shape \(264, 64\)"),
        # B's tensors but one: the checks run before any copy, so none of B's arrives
        "missing": (
            lambda: _drop_tensor(model_b.folder, tmp_path / "part", "model.norm.weight"),
            "missing tensor model.norm.weight",
        ),
        "not_there": (lambda: tmp_path / "nothing", "a Hugging Face folder or a .gguf file"),
        "wrong_kind": (lambda: 42, "weights_path must be a path string"),
        # B as a GGUF whose RoPE factors the model was not built with: its cos/sin table would lie
        "rope_freqs": (
            lambda: _with_rope_freqs(tmp_path / "b.gguf", model_b.hf_model),
            "other RoPE frequency factors",
        ),
    }[bad]
    target = path()
    with pytest.raises(InvalidRequest, match=message) as error:
        llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_path": target if bad == "wrong_kind" else str(target)},
        )
    assert error.value.param == "args"
    assert greedy(llm) == model_a.greedy


def test_read_failing_midway_is_a_new_version(llm, model_a, model_b, monkeypatch) -> None:
    """The checks passed, then a read fails after some copies: a server-side error, and the
    mixed weights get a version of their own (so the core drops the old weights' KV)."""
    from pagedlm.model import loader
    from pagedlm.worker.rpc import WorkerMethodError

    def failing(config, quantized=False, shard=None):
        tensors = loader.iter_safetensors(config.model)
        yield next(tensors)
        raise OSError("disk gone")

    monkeypatch.setattr(loader, "iter_tensors", failing)
    version = llm.collective_rpc("get_weight_version")[0]
    with pytest.raises(WorkerMethodError, match="failed midway: disk gone"):
        reload(llm, model_b.folder)
    assert llm.collective_rpc("get_weight_version")[0] != version
