"""Transport "ipc" on one GPU: a trainer process on the engine's GPU perturbs the weights through
a CUDA IPC bucket (the engine's outputs change), then sends the originals back (restored
exactly). NCCL cannot do this: it refuses two ranks on one GPU ("Duplicate GPU detected",
benchmarks/probes/nccl_one_gpu.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))  # the trainer of tests/rl

from rl_helpers import greedy, serve_trainer  # noqa: E402

from pagedlm import LLM  # noqa: E402

pytestmark = pytest.mark.gpu


def test_ipc_trainer_on_the_engine_gpu(checkpoints) -> None:
    folder = checkpoints["llama"][0]
    llm = LLM(
        str(folder),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        max_num_seqs=8,  # few graphs to capture: a short start-up
        max_num_batched_tokens=256,
        kv_cache_memory_gib=0.5,
        graph_size_timing=False,
        device="cuda:0",
    )
    before = greedy(llm)
    outputs = serve_trainer(llm, folder, "cuda:0", "ipc")
    assert outputs["perturbed"] != before
    assert outputs["restored"] == before
    assert llm.collective_rpc("get_weight_version") == ["restored"]
    llm.shutdown()
