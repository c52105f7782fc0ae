"""Level-1 sleep's flat host copy (pagedlm/worker/host_offload.py): every tensor comes back bit
for bit from its view, whatever its dtype, shape or size; on CUDA the buffer is page-locked."""

from __future__ import annotations

import pytest
import torch

from pagedlm.worker.host_offload import HostCopy


def random_tensors(device: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes_dtypes = [
        ((3, 5), torch.bfloat16),  # 30 bytes: the next view starts padded
        ((7,), torch.float32),
        ((0, 4), torch.float16),
        ((2, 3, 4), torch.float64),
        ((1,), torch.float32),
    ]
    return [
        torch.randn(shape, generator=gen).to(dtype).to(device) for shape, dtype in shapes_dtypes
    ]


def check_round_trip(device: str) -> HostCopy:
    tensors = random_tensors(device)
    copy = HostCopy(tensors)
    for tensor, view in zip(tensors, copy.views(), strict=True):
        assert view.device.type == "cpu" and view.shape == tensor.shape
        assert view.dtype == tensor.dtype
        back = torch.full_like(tensor, float("nan"))  # poisoned
        back.copy_(view, non_blocking=True)
        if device != "cpu":
            torch.cuda.synchronize()
        torch.testing.assert_close(back, tensor, rtol=0, atol=0)
    return copy


def test_cpu_round_trip_and_free() -> None:
    copy = check_round_trip("cpu")
    assert not copy.locked  # nothing to lock for: no CUDA tensor
    copy.free()
    assert copy.buffer.numel() == 0


@pytest.mark.gpu
def test_cuda_round_trip_is_page_locked() -> None:
    copy = check_round_trip("cuda")
    assert copy.locked and copy.buffer.is_pinned()
    copy.free()
    assert not copy.locked
