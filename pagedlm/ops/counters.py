"""Per-device int32 counters for kernels whose last program to finish does a final step (the split
decode's merge, the split-K GEMV's sum): zero between launches, because the program that reads the
last count resets its counter, and kernels on one stream touch them one launch after another (with
PDL too: a kernel reaches its counters only after its wait, when the kernel before has finished).
So every kernel shares one buffer, on one stream: kernels running at once on two streams of a
device (or two engines in two threads) would corrupt each other's counts.

The buffer starts at MIN_COUNTERS and grows (a new zeroed buffer) only when a launch needs more
than it has, never during a CUDA graph capture: the runner runs every shape eagerly right before it
captures it (DecodeGraphs' warm-up). Older buffers stay alive, as a graph captured with one keeps
using its address.
"""
from __future__ import annotations

import torch

# 256 KB: what a split decode of 1024 sequences x 64 KV heads or a split-K GEMV of 524k output rows needs,
# so that in practice no capture depends on the warm-up's order
MIN_COUNTERS = 1 << 16

_buffers: dict[torch.device, list[torch.Tensor]] = {}


def zeroed_counters(device: torch.device, num_counters: int) -> torch.Tensor:
    """The device's counter buffer, [>= num_counters] int32, zero between launches."""
    buffers = _buffers.setdefault(device, [])
    if not buffers or buffers[-1].numel() < num_counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"a kernel needs {num_counters} counters but the buffer has "
                               f"{buffers[-1].numel() if buffers else 0}; it cannot grow during a CUDA "
                               f"graph capture (run the largest shape eagerly first)")
        size = max(num_counters, 2 * buffers[-1].numel() if buffers else MIN_COUNTERS)
        buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
    return buffers[-1]
