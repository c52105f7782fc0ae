"""Does the cuMem allocator (pagedlm/worker/cumem.py) work here? A 1 GiB tensor in a cuMem pool,
a CUDA graph over it; sleep (device memory back by mem_get_info), wake, values copied back, the
graph replayed without re-capture (its output checked); then every byte freed.

    python benchmarks/probes/cumem_probe.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pagedlm.worker import cumem  # noqa: E402

MiB = 1 << 20


def free_mib() -> float:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] / MiB


def main() -> None:
    allocator = cumem.process_allocator()
    assert allocator is not None, "no cuMem allocator here (see the log line)"
    pool = allocator.new_pool("weights")
    start_free = free_mib()
    with allocator.use(pool):
        x = torch.randn(1 << 28, device="cuda")  # [2^28] float32, 1 GiB
    y = torch.empty_like(x)  # outside the pool
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y.copy_(x * 2)  # warm-up
        torch.cuda.synchronize()
        graph.capture_begin()
        y.copy_(x * 2)
        graph.capture_end()
    saved = x.cpu()
    awake = free_mib()
    started = time.perf_counter()
    pool.sleep()
    sleep_s, asleep = time.perf_counter() - started, free_mib()
    started = time.perf_counter()
    pool.wake()
    wake_s = time.perf_counter() - started
    x.copy_(saved)
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    correct = torch.equal(y.cpu(), saved * 2)
    del graph, x, y
    pool = None
    torch.cuda.empty_cache()
    result = {
        "freed_by_sleep_mib": asleep - awake,
        "sleep_s": sleep_s,
        "wake_s": wake_s,
        "graph_replays_correctly_after_wake": correct,
        "free_mib_lost_after_free": start_free - free_mib(),
        "live_allocations_after_free": len(allocator._owner),
    }
    print(json.dumps(result, indent=1))
    assert correct and result["freed_by_sleep_mib"] > 1000


if __name__ == "__main__":
    main()
