"""Per-device int32 counters for kernels whose last program to finish does a final step (the split
decode's merge, the split-K GEMV's sum): zero between launches, because the program that reads the
last count resets its counter, and kernels on one stream touch them one launch after another (with
PDL too: a kernel reaches its counters only after its wait, when the kernel before has finished).
So every kernel shares one buffer.

The buffer is allocated once and grown (a new zeroed buffer) only when a launch needs more counters
than it has, never during a CUDA graph capture: the runner runs every shape eagerly before it
captures it (DecodeGraphs' warm-up, the largest batch first). Older buffers stay alive, as a graph
captured with one keeps using its address.
"""
from __future__ import annotations

import torch

_buffers: dict[torch.device, list[torch.Tensor]] = {}


def zeroed_counters(device: torch.device, num_counters: int) -> torch.Tensor:
    """The device's counter buffer, [>= num_counters] int32, zero between launches."""
    buffers = _buffers.setdefault(device, [])
    if not buffers or buffers[-1].numel() < num_counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"a kernel needs {num_counters} counters but the buffer has "
                               f"{buffers[-1].numel() if buffers else 0}; it cannot grow during a CUDA "
                               f"graph capture (run the largest shape eagerly first)")
        buffers.append(torch.zeros(num_counters, dtype=torch.int32, device=device))
    return buffers[-1]
