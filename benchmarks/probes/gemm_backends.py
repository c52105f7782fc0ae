"""GPU: cuBLAS against cuBLASLt (torch.backends.cuda.preferred_blas_library) on the forward's GEMMs.

    python benchmarks/probes/gemm_backends.py [--model llama3-8b] [--rows 16384,8192,256] [--json out.json]

For each weight of the model's decoder layer (qkv, o, gate_up, down) and the LM head, and each row
count M, y = x @ W.T in bf16 (as F.linear runs it) under each backend, alternating backends over
5 rounds of 20 calls (CUDA events); printed: median µs and TFLOP/s against the measured 797 TFLOP/s
bf16 limit (BENCHMARKS.md), and the largest difference between the backends' outputs.
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

from gpu_workloads import MODELS  # noqa: E402

BACKENDS = ("cublas", "cublaslt")
PEAK_TFLOPS = 797.0
ROUNDS, CALLS = 5, 20


def weight_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of the layer's fused weights and the LM head."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim", hidden // config["num_attention_heads"])
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim
    return {
        "qkv": (qkv, hidden),
        "o": (hidden, config["num_attention_heads"] * head_dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (config["vocab_size"], hidden),
    }


def time_us(call) -> float:
    """GPU µs of one call, over CALLS back to back (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / CALLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    parser.add_argument("--rows", default="16384,8192,256")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows_out = []
    print(
        f"{'weight':8} {'M':>6} "
        + " ".join(f"{b + ' µs':>13} {'TFLOP/s':>8}" for b in BACKENDS)
        + "  max|diff|"
    )
    for name, (n, k) in weight_shapes(MODELS[args.model]).items():
        weight = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
        for num_rows in (int(v) for v in args.rows.split(",")):
            x = torch.randn(num_rows, k, dtype=torch.bfloat16, device="cuda")
            times: dict[str, list[float]] = {b: [] for b in BACKENDS}
            outputs = {}
            for backend in BACKENDS:  # warm-up: each backend picks and loads its kernel
                torch.backends.cuda.preferred_blas_library(backend)
                outputs[backend] = F.linear(x, weight).float()
                time_us(lambda: F.linear(x, weight))
            for _ in range(ROUNDS):
                for backend in BACKENDS:
                    torch.backends.cuda.preferred_blas_library(backend)
                    times[backend].append(time_us(lambda: F.linear(x, weight)))
            flops = 2 * num_rows * n * k
            row = dict(
                weight=name,
                m=num_rows,
                n=n,
                k=k,
                max_diff=(outputs["cublas"] - outputs["cublaslt"]).abs().max().item(),
            )
            for backend in BACKENDS:
                row[backend] = statistics.median(times[backend])
            rows_out.append(row)
            print(
                f"{name:8} {num_rows:6} "
                + " ".join(f"{row[b]:13.1f} {flops / row[b] / 1e6:8.1f}" for b in BACKENDS)
                + f"  {row['max_diff']:.4f}",
                flush=True,
            )
    torch.backends.cuda.preferred_blas_library("cublas")
    if args.json:
        Path(args.json).write_text(
            json.dumps(dict(vars(args), peak_tflops=PEAK_TFLOPS, rows=rows_out), indent=1)
        )


if __name__ == "__main__":
    main()
