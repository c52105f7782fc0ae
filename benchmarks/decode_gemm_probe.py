"""GPU: a Triton TMA GEMM against cuBLAS on decode-sized batches (M = 64..512 rows), where cuBLAS
runs llama3-8b's layer at ~435-520 TFLOP/s (gemm_backends.py, session 11) against ~680 at 16k rows.

    python benchmarks/decode_gemm_probe.py [--model llama3-8b] [--rows 128,256,512] [--json out.json]

y = x @ W.T in bf16 (fp32 accumulation), x and W through host TMA descriptors, output tiles ordered
so that the M tiles of one N tile run together (W read once from DRAM). Each config (BM x BN x BK,
warps, stages) is timed against F.linear in alternating rounds (CUDA events); printed: µs, TFLOP/s,
the ratio to cuBLAS and the max |difference| from cuBLAS's output.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemm_backends import time_us, weight_shapes  # noqa: E402
from gpu_workloads import MODELS  # noqa: E402

CONFIGS = [  # BM, BN, BK, warps, stages
    (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
    (128, 64, 64, 4, 6), (64, 128, 64, 4, 6), (64, 256, 64, 4, 4), (256, 64, 64, 8, 4),
    (128, 128, 128, 8, 3), (64, 64, 128, 4, 6),
]
ROUNDS = 5


@triton.jit
def gemm_kernel(x_desc, w_desc, y_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a = x_desc.load([pid_m * BM, k])
        b = w_desc.load([pid_n * BN, k])
        acc = tl.dot(a, b.T, acc)
    y_desc.store([pid_m * BM, pid_n * BN], acc.to(y_desc.dtype))


def make_call(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, config: tuple[int, ...]):
    bm, bn, bk, warps, stages = config
    (m, k), n = x.shape, weight.shape[0]
    descs = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
             TensorDescriptor.from_tensor(y, [bm, bn]))
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    return lambda: gemm_kernel[grid](*descs, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8,
                                     num_warps=warps, num_stages=stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    parser.add_argument("--rows", default="128,256,512")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows_out = []
    for name, (n, k) in weight_shapes(MODELS[args.model]).items():
        weight = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k ** 0.5
        for num_rows in (int(v) for v in args.rows.split(",")):
            x = torch.randn(num_rows, k, dtype=torch.bfloat16, device="cuda")
            want = F.linear(x, weight).float()
            calls = {"cublas": lambda: F.linear(x, weight)}
            errors = {"cublas": 0.0}
            for config in CONFIGS:
                label = "{}x{}x{} w{} s{}".format(*config)
                y = torch.full((num_rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                try:
                    call = make_call(x, weight, y, config)
                    call()
                    torch.cuda.synchronize()
                except Exception as exc:  # a config the compiler refuses: say so, go on
                    print(f"{name} M={num_rows} {label}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                    continue
                calls[label], errors[label] = call, (y.float() - want).abs().max().item()
            times: dict[str, list[float]] = {label: [] for label in calls}
            for _ in range(ROUNDS):
                for label, call in calls.items():
                    times[label].append(time_us(call))
            flops = 2 * num_rows * n * k
            base = statistics.median(times["cublas"])
            print(f"\n{name} {n} x {k}, M = {num_rows}")
            for label in calls:
                us = statistics.median(times[label])
                rows_out.append(dict(weight=name, m=num_rows, config=label, us=us, err=errors[label]))
                print(f"  {label:22} {us:9.1f} µs {flops / us / 1e6:7.1f} TFLOP/s {us / base:6.3f}x  "
                      f"err {errors[label]:.4f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(vars(args), rows=rows_out), indent=1))


if __name__ == "__main__":
    main()
