"""Weight changes at tensor_parallel_size 2 (two gloo worker processes, float32): reload A -> B -> A,
update_weights_from_tensor perturb -> restore, the four-phase transfer from a trainer process
perturb -> restore; each rank is sent its slice of every tensor only (the bytes that go to each
are counted); versions, output spans and the prefix cache follow as at tp = 1 (the greedy outputs
after each change are the new weights' on prompts the engine served before: a stale prefix hit
would give the old weights' tokens). The expected tokens are transformers' greedy ones, which the
tp = 1 tests show the tp = 1 engine gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rl_helpers import PROMPTS, TinyModel, greedy, hf_tensors, save_gguf, serve_trainer

from pagedlm import LLM, SamplingParams
from pagedlm.distributed.sharding import checkpoint_slice, narrow
from pagedlm.errors import InvalidRequest
from pagedlm.outputs import WeightVersionSpan
from pagedlm.rl import WeightSender, llm_rpc

TP = 2
PICKLE_BYTES_PER_TENSOR = 512  # a pickled tensor's bytes besides its data (measured: ~340)


@pytest.fixture(scope="module")
def tp_llm(model_a: TinyModel) -> Any:
    llm = LLM(
        str(model_a.folder),
        tensor_parallel_size=TP,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
    )
    yield llm
    llm.shutdown()


@pytest.fixture
def llm(tp_llm: Any, model_a: TinyModel) -> Any:
    """The tp = 2 engine holding A; A again after the test."""
    yield tp_llm
    tp_llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_a.folder)})


def _slice_bytes(llm: Any, named: list[tuple[str, torch.Tensor]], rank: int) -> int:
    """The data bytes of rank's slices of the tensors (sharding.py's rule, tested on its own)."""
    config = llm.llm_engine.engine_core.executor.config.model  # the model's, not a rank's
    return sum(
        narrow(t, checkpoint_slice(name, config, rank, TP), name, "test").nbytes
        for name, t in named
    )


def _perturbed(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [(n, t + 0.5 * torch.randn(t.shape, generator=generator)) for n, t in named]


def _versions(llm: Any) -> list[WeightVersionSpan]:
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    (out,) = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params, use_tqdm=False)
    return out.outputs[0].weight_versions


def test_reload_a_b_a(llm, model_a: TinyModel, model_b: TinyModel) -> None:
    assert greedy(llm) == model_a.greedy
    for model, version in ((model_b, "b"), (model_a, "a")):
        kwargs = {"weights_path": str(model.folder), "weight_version": version}
        assert llm.collective_rpc("reload_weights", kwargs=kwargs) == [version]
        assert greedy(llm) == model.greedy
        assert _versions(llm) == [WeightVersionSpan(version, 0, 3)]


def test_reload_from_gguf(llm, model_b: TinyModel, tmp_path) -> None:
    """Each rank reads its part of the file's blocks (q/k rows unpermuted per local head)."""
    path = save_gguf(tmp_path / "b.gguf", model_b.hf_model)
    kwargs = {"weights_path": str(path), "weight_version": "b-gguf"}
    assert llm.collective_rpc("reload_weights", kwargs=kwargs) == ["b-gguf"]
    assert greedy(llm) == model_b.greedy


def test_update_from_tensor_sends_each_rank_its_slice(llm, model_a: TinyModel) -> None:
    sent = llm.llm_engine.engine_core.executor._broadcast.sent_bytes  # per rank, so far
    originals = hf_tensors(model_a)
    full_bytes = sum(t.nbytes for _, t in originals)
    for named, version, expected in (
        (_perturbed(originals), "perturbed", None),
        (originals, "restored", model_a.greedy),
    ):
        before = list(sent)
        assert llm.update_weights_from_tensor(named, version) == version
        for rank in range(TP):
            data = _slice_bytes(llm, named, rank)
            assert data < 0.6 * full_bytes  # a half of each sharded tensor, the norms whole
            overhead = PICKLE_BYTES_PER_TENSOR * len(named)
            assert data <= sent[rank] - before[rank] <= data + overhead
        if expected is None:
            assert greedy(llm) != model_a.greedy
        else:
            assert greedy(llm) == expected
        assert llm.collective_rpc("get_weight_version") == [version]


def test_update_from_tensor_refuses_a_bad_shape(llm, model_a: TinyModel) -> None:
    name, tensor = hf_tensors(model_a)[1]
    with pytest.raises(InvalidRequest) as error:
        llm.update_weights_from_tensor([(name, tensor[:-1])])
    assert error.value.param == "args"
    assert greedy(llm) == model_a.greedy


def test_trainer_process_sends_each_rank_its_slice(llm, model_a: TinyModel) -> None:
    outputs = serve_trainer(llm, model_a.folder, "cpu", "distributed")
    assert outputs["perturbed"] != model_a.greedy
    assert outputs["restored"] == model_a.greedy
    assert llm.collective_rpc("get_weight_version") == ["restored"]
    originals = hf_tensors(model_a)
    for rank, num_bytes in enumerate(outputs["bytes_sent"]):
        data = 2 * _slice_bytes(llm, originals, rank)  # perturbed, then restored
        assert data <= num_bytes <= data + 2 * 16 * len(originals)  # 16-byte packing alignment


def test_ipc_transport_is_refused(llm) -> None:
    with pytest.raises(InvalidRequest, match="transport 'ipc' needs tensor_parallel_size 1"):
        WeightSender(llm_rpc(llm), transport="ipc")
