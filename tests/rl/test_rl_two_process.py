"""The four-phase transfer between two processes: a trainer process perturbs the weights (the
engine's outputs change), then sends the originals back (they are restored exactly). Transport
"distributed": gloo on the CPU, NCCL between two GPUs (NCCL refuses two ranks on one GPU:
"Duplicate GPU detected"); transport "ipc": a shared file bucket on the CPU (one GPU:
tests/gpu/test_rl_ipc_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from rl_helpers import greedy, serve_trainer


@pytest.mark.parametrize("transport", ["distributed", "ipc"])
def test_trainer_process_perturbs_then_restores(llm, model_a, transport) -> None:
    outputs = serve_trainer(llm, model_a.folder, "cpu", transport)
    assert outputs["perturbed"] != model_a.greedy
    assert outputs["restored"] == model_a.greedy
    assert llm.collective_rpc("get_weight_version") == ["restored"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_nccl_between_two_gpus(model_a) -> None:
    from pagedlm import LLM

    llm = LLM(
        str(model_a.folder),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        device="cuda:0",
    )
    before = greedy(llm)
    outputs = serve_trainer(llm, model_a.folder, "cuda:1", "distributed")
    assert outputs["perturbed"] != before
    assert outputs["restored"] == before
