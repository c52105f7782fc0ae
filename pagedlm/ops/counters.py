"""Per-device int32 counters for kernels whose last program to finish does a final step (the split
decode's merge, the split-K GEMV's sum), and `last_to_arrive`, the protocol both use: zero between
launches, because the program that reads the last count resets its counter, and kernels on one
stream touch them one launch after another (with PDL too: a kernel reaches its counters only after
its wait, when the kernel before has finished). So every kernel shares one buffer, on one stream:
kernels running at once on two streams of a device (or two engines in two threads) would corrupt
each other's counts.

Memory ordering (the interpreter runs programs one after another and cannot show a race):
1. A program's threads store its partial, then meet at a CTA barrier (bar.sync), so every one of
   those stores is ordered before the single thread that performs the counter atomic.
2. The atomic is acq_rel at GPU scope. Its release half publishes, cumulatively, every write
   ordered before it, i.e. the whole program's partial.
3. The atomics of one counter form a single modification order, each reading the value before it;
   the one that reads num_arrivals - 1 comes after all other programs' atomics, and its acquire
   half synchronises with each of their releases: their partials happen-before what follows.
4. Triton hands a scalar atomic's result to the other threads through shared memory behind a
   barrier, so every thread's later loads are ordered after the acquire. The caller's loads of the
   partials use the .cg cache modifier (L2, the GPU's point of coherence, not the SM's
   non-coherent L1), so no stale line left by an earlier launch over the same addresses is read.

The buffer starts at MIN_COUNTERS and grows (a new zeroed buffer) only when a launch needs more
than it has, never during a CUDA graph capture: the runner runs every shape eagerly right before it
captures it (DecodeGraphs' warm-up). Older buffers stay alive, as a graph captured with one keeps
using its address.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# 256 KB: what a split decode of 1024 sequences x 64 KV heads or a split-K GEMV of 524k output rows needs,
# so that in practice no capture depends on the warm-up's order
MIN_COUNTERS = 1 << 16

_buffers: dict[torch.device, list[torch.Tensor]] = {}


def zeroed_counters(device: torch.device, num_counters: int) -> torch.Tensor:
    """The device's counter buffer, [>= num_counters] int32, zero between launches."""
    buffers = _buffers.setdefault(device, [])
    if not buffers or buffers[-1].numel() < num_counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"a kernel needs {num_counters} counters but the buffer has "
                f"{buffers[-1].numel() if buffers else 0}; it cannot grow during a CUDA "
                f"graph capture (run the largest shape eagerly first)"
            )
        size = max(num_counters, 2 * buffers[-1].numel() if buffers else MIN_COUNTERS)
        buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
    return buffers[-1]


@triton.jit
def last_to_arrive(counter_ptr, num_arrivals):
    """Called by each of num_arrivals programs once its partial is stored: True in the last one to
    arrive (which resets the counter); see the memory ordering above."""
    tl.debug_barrier()  # every thread's partial stores before the (one-thread) release below
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == num_arrivals - 1
    if last:
        tl.store(counter_ptr, 0)
    return last
