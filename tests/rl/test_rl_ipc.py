"""Transport "ipc" on the CPU: the trainer's chunks go through a bucket file in shared memory
that the engine maps (pagedlm.rl.ipc). Here the trainer is in the test's process (a file maps
in any process); tests/rl/test_rl_two_process.py runs it from another process, and
tests/gpu/test_rl_ipc_gpu.py through CUDA IPC on one GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_helpers import greedy, hf_tensors

from pagedlm.errors import InvalidRequest
from pagedlm.rl import WeightSender, llm_rpc
from pagedlm.rl.ipc import SharedBucket, open_bucket

CPU = torch.device("cpu")


def test_ipc_transfer_a_b_a(llm, model_a, model_b) -> None:
    """Chunks of ~16 KiB, so the bucket is refilled many times and grows for the larger tensors;
    a refused chunk raises, leaves the sender usable, and the bucket file goes with close()."""
    sender = WeightSender(llm_rpc(llm), transport="ipc")
    try:
        assert sender.send_weights(hf_tensors(model_b), "b", chunk_bytes=16 << 10) == "b"
        assert greedy(llm) == model_b.greedy
        path = Path(sender._link._bucket.handle["path"])
        assert path.is_file()
        with pytest.raises(InvalidRequest, match="does not describe"):
            sender.send_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(2, 2))])
        assert greedy(llm) == model_b.greedy
        sender.send_weights(hf_tensors(model_a), "a", chunk_bytes=16 << 10)
        assert greedy(llm) == model_a.greedy
        assert llm.collective_rpc("get_weight_version") == ["a"]
    finally:
        sender.close()
    assert not path.exists()


def test_bucket_round_trip_and_bad_handles() -> None:
    bucket = SharedBucket(64, CPU)
    try:
        opened = open_bucket(bucket.handle, CPU)
        bucket.tensor.copy_(torch.arange(64, dtype=torch.uint8))
        assert torch.equal(opened, torch.arange(64, dtype=torch.uint8))  # one memory
        cuda_handle = {"kind": "cuda", "device_uuid": "GPU-x"}
        with pytest.raises(ValueError, match="CUDA memory, this engine runs on cpu"):
            open_bucket(cuda_handle, CPU)
        with pytest.raises(ValueError, match="not a file bucket"):
            open_bucket({**bucket.handle, "path": "/etc/passwd"}, CPU)
        with pytest.raises(ValueError, match="shorter than"):
            open_bucket({**bucket.handle, "num_bytes": 65}, CPU)
        with pytest.raises(ValueError, match="must be a bucket handle"):
            open_bucket("not a handle", CPU)
    finally:
        bucket.close()
    with pytest.raises(ValueError, match="is gone"):
        open_bucket(bucket.handle, CPU)


def test_engine_refuses_bad_ipc_calls(llm, model_a) -> None:
    rpc = llm_rpc(llm)
    with pytest.raises(InvalidRequest, match="takes no other key"):
        rpc("init_weight_transfer_engine", {"init_info": {"transport": "ipc", "rank_offset": 1}})
    rpc("init_weight_transfer_engine", {"init_info": {"transport": "ipc"}})
    try:
        rpc("start_weight_update", {})
        info = {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[64]]}
        with pytest.raises(InvalidRequest, match="needs the 'bucket' handle"):
            rpc("update_weights", {"update_info": info})
        small = SharedBucket(16, CPU)
        with pytest.raises(InvalidRequest, match="the bucket has 16"):
            rpc("update_weights", {"update_info": {**info, "bucket": small.handle}})
        small.close()
        rpc("finish_weight_update", {})
    finally:
        rpc("shutdown_weight_transfer_engine", {})
    assert greedy(llm) == model_a.greedy
    with pytest.raises(ValueError, match="transport must be one of"):
        WeightSender(rpc, transport="shm")
