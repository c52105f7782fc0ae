"""GPU: cuBLAS's time for each decode graph size, and what padding the rows up would save.

    python benchmarks/probes/gemm_rows_scan.py [--models llama3-8b,qwen3-0.6b] [--min-rows 64] [--json out.json]

Session 16's split-K probe timed llama3-8b's gate_up (28,672 x 4,096) at 280 µs for 448 rows and
167 µs for 512: cuBLAS's heuristic picks a poor kernel at some row counts. For every capture size
(sizes.capture_sizes) of at least --min-rows rows and each weight of the decoder layer, this
times y = x @ W.T in bf16 as F.linear runs it, under cuBLAS and cuBLASLt (alternating, median of
ROUNDS rounds of CALLS calls), then, per size M, the best time at any size M' >= M
(what padding the rows to M' would cost). Printed per weight: the sizes where padding or cuBLASLt
saves >= 5%.
Last: a decode step's layer GEMM time summed over the four weights, at each size, as is and padded.
Each time: CALLS calls queued behind a GPU sleep (host_step.queued_gpu_us), so that small GEMMs
(qwen3-0.6b's) measure the GPU, not the host's launches (session 16's run 2 timed them at 14-15 µs each
with the GPU idle at the start).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [
    str(p) for p in Path(__file__).resolve().parents[:3]
]  # probes/, benchmarks/, the repo

from gemm_backends import CALLS, weight_shapes  # noqa: E402
from gpu_workloads import MODELS  # noqa: E402
from host_step import queued_gpu_us  # noqa: E402

from pagedlm.worker.sizes import capture_sizes  # noqa: E402

BACKENDS = ("cublas", "cublaslt")
LAYER_WEIGHTS = ("qkv", "o", "gate_up", "down")
ROUNDS = 3
QUEUE_SLEEP_CYCLES = 4_000_000  # ~2 ms of GPU sleep: the host queues CALLS launches behind it
SAVING = 0.05  # report a padded size when it saves at least this fraction


def scan_weight(n: int, k: int, sizes: list[int]) -> dict[str, dict[int, float]]:
    """backend -> size -> median µs of x [size, k] @ W [n, k].T."""
    weight = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
    x_all = torch.randn(max(sizes), k, dtype=torch.bfloat16, device="cuda")
    samples: dict[str, dict[int, list[float]]] = {b: {m: [] for m in sizes} for b in BACKENDS}
    previous = torch.backends.cuda.preferred_blas_library()
    for _ in range(ROUNDS):
        for backend in BACKENDS:
            torch.backends.cuda.preferred_blas_library(backend)
            for m in sizes:
                x = x_all[:m]
                samples[backend][m].append(
                    queued_gpu_us(lambda _: F.linear(x, weight), CALLS, QUEUE_SLEEP_CYCLES)
                )
    torch.backends.cuda.preferred_blas_library(previous)
    return {b: {m: statistics.median(v) for m, v in per.items()} for b, per in samples.items()}


def padded_best(times: dict[int, float]) -> dict[int, tuple[int, float]]:
    """size -> (size M' >= size with the least time, that time)."""
    best, out = None, {}
    for m in sorted(times, reverse=True):
        if best is None or times[m] <= best[1]:
            best = (m, times[m])
        out[m] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="llama3-8b,qwen3-0.6b")
    parser.add_argument("--min-rows", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    sizes = [m for m in capture_sizes(1024, 16384) if m >= args.min_rows]
    report = {}
    for model in args.models.split(","):
        shapes = weight_shapes(MODELS[model])
        per_weight = {name: scan_weight(*shapes[name], sizes) for name in LAYER_WEIGHTS}
        report[model] = per_weight
        for name, times in per_weight.items():
            pads = padded_best(times["cublas"])
            print(
                f"\n{model} {name} {shapes[name][0]} x {shapes[name][1]}: sizes where padding or cuBLASLt "
                f"saves >= {SAVING:.0%}"
            )
            print(
                f"{'M':>5} {'cublas µs':>10} {'lt µs':>8} {'TFLOP/s':>8}  {'pad to':>6} {'µs':>8}"
            )
            for m in sizes:
                t, (m_pad, t_pad) = times["cublas"][m], pads[m]
                if t_pad < (1 - SAVING) * t or times["cublaslt"][m] < (1 - SAVING) * t:
                    tflops = 2 * m * shapes[name][0] * shapes[name][1] / t / 1e6
                    print(
                        f"{m:>5} {t:>10.1f} {times['cublaslt'][m]:>8.1f} {tflops:>8.0f}  {m_pad:>6} {t_pad:>8.1f}"
                    )
        print(
            f"\n{model}: the layer's four GEMMs per size (µs): cuBLAS as is / best of cuBLAS, cuBLASLt / "
            "the whole layer padded to its best size (as a graph pads it) and that size"
        )
        layer = {m: sum(per_weight[w]["cublas"][m] for w in LAYER_WEIGHTS) for m in sizes}
        either = {
            m: sum(min(per_weight[w][b][m] for b in BACKENDS) for w in LAYER_WEIGHTS) for m in sizes
        }
        padded = padded_best(layer)
        for m in sizes:
            print(
                f"{m:>5} {layer[m]:>8.1f} {either[m]:>8.1f} {padded[m][1]:>8.1f} {padded[m][0]:>5}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
