"""The capture step every full CUDA graph of the runner shares (cuda_graphs.py, spec_graphs.py,
spec_decode/draft_graphs.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def warmed_up_graph(run: Callable[[], None], pool: tuple[int, int]) -> torch.cuda.CUDAGraph:
    """run() once on the current (capture) stream, its warm-up (Triton's compile of its shapes,
    cuBLAS's workspace for the stream outside the capture), then captured into a graph in the
    memory pool; the capture run's tensors are the graph's."""
    run()
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(pool=pool)
    try:
        run()
    finally:
        graph.capture_end()
    return graph
