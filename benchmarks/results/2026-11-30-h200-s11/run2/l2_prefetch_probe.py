"""GPU: does an L2 prefetch (pagedlm/ops/l2_prefetch.py) make the batch-1 GEMV that follows it faster?

    python benchmarks/l2_prefetch_probe.py [--n 4096] [--k 4096] [--sleep-us 20] [--json out.json]

A CUDA graph runs, for each of 8 weights taken from a ring of --ring (n x k bf16 each, 8 x 32 MB by
default, so no weight is still in L2 from the round before; --ring 1 times a weight that stays there): a GPU sleep of --sleep-us (the DRAM-idle stretch:
prepare_qkv and attention), optionally with the prefetch of that weight on a side stream beside it,
then the M=1 GEMV of the weight. Printed: GPU µs per weight for sleep alone, sleep + GEMV, sleep +
prefetch + GEMV, and the GEMV's share (the difference), with its DRAM rate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedlm.ops import gemv, l2_prefetch  # noqa: E402

RING = 8
REPLAYS = 50
CLOCK_HZ = 1.98e9  # the H200's SM clock under load (torch.cuda._sleep counts cycles)


def capture(weights: list[torch.Tensor], x: torch.Tensor, sleep_cycles: int, with_gemv: bool,
            with_prefetch: bool) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    for capturing in (False, True):  # a warm-up run compiles the kernels outside the capture
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            if capturing:
                graph.capture_begin()
            for weight in weights:
                if with_prefetch:
                    side.wait_stream(stream)
                    with torch.cuda.stream(side):
                        l2_prefetch.launch_l2_prefetch(weight, max_bytes=1 << 40)
                torch.cuda._sleep(sleep_cycles)
                if with_prefetch:
                    stream.wait_stream(side)
                if with_gemv:
                    gemv.gemv(x, weight)
            if capturing:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graph


def per_weight_us(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (REPLAYS * RING)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--sleep-us", type=float, default=20.0)
    parser.add_argument("--ring", type=int, default=8, help="weights cycled (1: the weight stays in L2)")
    parser.add_argument("--chunk-bytes", type=int, default=l2_prefetch.CHUNK_BYTES)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    l2_prefetch.CHUNK_BYTES = args.chunk_bytes
    weights = [torch.randn(args.n, args.k, dtype=torch.bfloat16, device="cuda") for _ in range(args.ring)]
    weights = (weights * RING)[:RING]
    x = torch.randn(1, args.k, dtype=torch.bfloat16, device="cuda")
    cycles = int(args.sleep_us * 1e-6 * CLOCK_HZ)
    cases = {"sleep": (False, False), "sleep+gemv": (True, False), "sleep+prefetch": (False, True),
             "sleep+prefetch+gemv": (True, True)}
    times = {name: [] for name in cases}
    graphs = {name: capture(weights, x, cycles, *flags) for name, flags in cases.items()}
    for _ in range(5):  # alternating rounds
        for name, graph in graphs.items():
            times[name].append(per_weight_us(graph))
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    nbytes = args.n * args.k * 2
    print(f"\nweight {args.n} x {args.k} bf16 ({nbytes / 2**20:.1f} MiB) x ring {args.ring}, chunks of "
          f"{args.chunk_bytes} B, sleep {args.sleep_us} µs "
          f"({cycles} cycles): GPU µs per weight (median of 5 rounds)")
    for name, us in median.items():
        print(f"{name:22} {us:8.2f}")
    for label, base in (("gemv after sleep", "sleep"), ("gemv after prefetch", "sleep+prefetch")):
        gemv_us = median[f"{base}+gemv"] - median[base]
        print(f"{label:22} {gemv_us:8.2f} µs  ({nbytes / gemv_us / 1e6:.2f} TB/s of weight)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(vars(args), times=times, median=median), indent=1))


if __name__ == "__main__":
    main()
