"""What the kernels' launch choices need to know about the device, asked once per device."""

from __future__ import annotations

import functools

import torch


@functools.cache
def num_sms(device: torch.device, elsewhere: int) -> int:
    """The streaming multiprocessors of a CUDA device; `elsewhere` for any other (the CPU under the
    Triton interpreter), where the caller picks what its kernel should assume."""
    if device.type != "cuda":
        return elsewhere
    return torch.cuda.get_device_properties(device).multi_processor_count
