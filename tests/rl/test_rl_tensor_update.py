"""Weights from a trainer: update_weights_from_tensor (colocated, in process) and the four-phase
transfer over a gloo group with the trainer in the same process (WeightSender + llm_rpc)."""

from __future__ import annotations

import time

import pytest
import torch
from rl_helpers import greedy, hf_tensors

from pagedlm.errors import InvalidRequest
from pagedlm.rl import WeightSender, llm_rpc


def test_update_from_tensor_a_b_a(llm, model_a, model_b) -> None:
    assert llm.update_weights_from_tensor(hf_tensors(model_b), weight_version="b") == "b"
    assert greedy(llm) == model_b.greedy
    named = dict(hf_tensors(model_a))  # the worker takes a dict too
    llm.collective_rpc("update_weights_from_tensor", kwargs={"named_tensors": named})
    assert greedy(llm) == model_a.greedy


def test_update_of_a_subset(llm, model_a, model_b) -> None:
    """Only the tensors sent change: B's MLPs on A's attention is neither A nor B."""
    mlp = [(name, t) for name, t in hf_tensors(model_b) if ".mlp." in name]
    llm.update_weights_from_tensor(mlp)
    mixed = greedy(llm)
    assert mixed != model_a.greedy and mixed != model_b.greedy
    llm.update_weights_from_tensor([(n, t) for n, t in hf_tensors(model_b) if ".mlp." not in n])
    assert greedy(llm) == model_b.greedy


@pytest.mark.parametrize(
    "bad, message",
    [
        (("model.layers.0.self_attn.q_proj.weight", torch.zeros(3, 3)), "has shape"),
        (("model.layers.9.mlp.up_proj.weight", torch.zeros(3, 3)), "does not describe"),
        (("model.norm.weight", torch.zeros(64, dtype=torch.int32)), "floating-point"),
        ("model.norm.weight", r"\(name, tensor\) pairs"),
    ],
)
def test_bad_tensor_copies_nothing(llm, model_a, model_b, bad, message) -> None:
    """B's tensors with one bad one last: every one is checked before the first copy."""
    with pytest.raises(InvalidRequest, match=message):
        llm.update_weights_from_tensor(hf_tensors(model_b) + [bad])
    assert greedy(llm) == model_a.greedy


def test_transfer_in_process(llm, model_a, model_b) -> None:
    """The four phases over gloo, the trainer (rank 0) in this process: chunks of ~16 KiB (several
    broadcasts), a refused chunk raises here and leaves the group usable."""
    sender = WeightSender(llm_rpc(llm), timeout_s=60)
    try:
        version = sender.send_weights(hf_tensors(model_b), "step-1", chunk_bytes=16 << 10)
        assert version == "step-1"
        assert greedy(llm) == model_b.greedy
        with pytest.raises(InvalidRequest, match="does not describe"):
            sender.send_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(2, 2))])
        assert greedy(llm) == model_b.greedy
        sender.send_weights(hf_tensors(model_a), "step-2", chunk_bytes=16 << 10)
        assert greedy(llm) == model_a.greedy
        assert llm.collective_rpc("get_weight_version") == ["step-2"]
    finally:
        sender.close()


def test_update_weights_needs_a_session(llm) -> None:
    with pytest.raises(InvalidRequest, match="start_weight_update first"):
        llm.collective_rpc("update_weights", kwargs={"update_info": {}})
    with pytest.raises(InvalidRequest, match="init_weight_transfer_engine first"):
        llm.collective_rpc("start_weight_update")
    bad_init = {"master_address": "127.0.0.1", "master_port": 1, "world_size": 1}
    with pytest.raises(InvalidRequest, match="rank_offset"):
        llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": bad_init})


def test_engine_refusing_before_the_broadcast_fails_fast(llm, model_a, model_b) -> None:
    """An update the engine refuses before receiving leaves this side's broadcast unmatched: the
    error comes at once (not after the group's timeout), the sender is broken, close() still
    ends the engine's side and a new sender works."""

    def garbling(method: str, kwargs: dict) -> list:
        if method == "update_weights":
            kwargs = {"update_info": {"names": ["x"]}}
        return llm.collective_rpc(method, kwargs=kwargs)

    sender = WeightSender(garbling, timeout_s=5)
    start = time.monotonic()
    with pytest.raises(InvalidRequest, match="update_info must be a dict"):
        sender.send_weights(hf_tensors(model_b))
    assert time.monotonic() - start < 2
    with pytest.raises(RuntimeError, match="broken"):
        sender.send_weights(hf_tensors(model_b))
    sender.close()
    assert greedy(llm) == model_a.greedy
    sender = WeightSender(llm_rpc(llm), timeout_s=60)
    sender.send_weights(hf_tensors(model_b))
    sender.close()
    assert greedy(llm) == model_b.greedy
