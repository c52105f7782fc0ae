"""GPU: a Triton TMA GEMM against cuBLAS on decode-sized batches (M = 64..512 rows), where cuBLAS
runs llama3-8b's layer at ~435-520 TFLOP/s (gemm_backends.py, session 11) against ~680 at 16k rows.

    python benchmarks/probes/decode_gemm_probe.py [--model llama3-8b] [--rows 128,256,512] [--split-k-only]
        [--json out.json]

y = x @ W.T in bf16 (fp32 accumulation), x and W through host TMA descriptors, output tiles ordered
so that the M tiles of one N tile run together (W read once from DRAM). Each config (BM x BN x BK,
warps, stages) is timed against F.linear in alternating rounds (CUDA events); printed: µs, TFLOP/s,
the ratio to cuBLAS and the max |difference| from cuBLAS's output.

Split-K configs (label "... kS"): at 256 rows o_proj has 64 output tiles of 128 x 128 for 132 SMs, so
a data-parallel grid leaves half the GPU idle. Each of S programs per tile multiplies a slice of K and
stores its fp32 partial tile; a second kernel sums the S partials of each output element and rounds
it once (deterministic, no atomics). Timed as the two launches together.
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

sys.path[:0] = [
    str(p) for p in Path(__file__).resolve().parents[:3]
]  # probes/, benchmarks/, the repo

from gemm_backends import time_us, weight_shapes  # noqa: E402
from gpu_workloads import MODELS  # noqa: E402

from pagedlm.ops.gate_up_silu import grouped_tile  # noqa: E402

CONFIGS = [  # BM, BN, BK, warps, stages
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 64, 64, 4, 6),
    (64, 128, 64, 4, 6),
    (64, 256, 64, 4, 4),
    (256, 64, 64, 8, 4),
    (128, 128, 128, 8, 3),
    (64, 64, 128, 4, 6),
]
SPLIT_K_CONFIGS = [  # BM, BN, BK, warps, stages, splits
    (128, 128, 64, 8, 4, 2),
    (128, 128, 64, 8, 4, 3),
    (128, 128, 64, 8, 4, 4),
    (64, 128, 64, 4, 6, 2),
    (128, 256, 64, 8, 3, 2),
    (128, 256, 64, 8, 3, 4),
    (256, 128, 64, 8, 3, 2),
    (128, 128, 128, 8, 3, 2),
]
REDUCE_BLOCK = 1024
ROUNDS = 5


@triton.jit
def gemm_kernel(
    x_desc,
    w_desc,
    y_desc,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a = x_desc.load([pid_m * BM, k])
        b = w_desc.load([pid_n * BN, k])
        acc = tl.dot(a, b.T, acc)
    y_desc.store([pid_m * BM, pid_n * BN], acc.to(y_desc.dtype))


@triton.jit
def split_k_kernel(
    x_desc,
    w_desc,
    part_ptr,
    M,
    N,
    K,
    k_per_split,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Program (tile, split): the fp32 partial x[:, ks] @ W[:, ks].T of one output tile over the K
    slice ks = [split * k_per_split, + k_per_split) into part[split] ([S, M, N] fp32)."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    split = tl.program_id(1)
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(k_lo, k_hi, BK):
        a = x_desc.load([pid_m * BM, k])
        b = w_desc.load([pid_n * BN, k])
        acc = tl.dot(a, b.T, acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    rows = split.to(tl.int64) * M + offs_m
    tl.store(part_ptr + rows[:, None] * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def sum_splits_kernel(part_ptr, y_ptr, MN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = round(sum over s of part[s, i]) for BLOCK elements of the [M, N] output."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in tl.static_range(
        SPLITS
    ):  # s * MN in int64: the LM head's partials pass 2^31 from ~5,600 rows
        acc += tl.load(part_ptr + offs + s * MN.to(tl.int64), mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def split_k_call(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, config: tuple[int, ...]):
    """config (BM, BN, BK, warps, stages, splits) -> a call writing y = x @ weight.T through
    split_k_kernel and sum_splits_kernel; the fp32 partials are allocated here, once."""
    bm, bn, bk, warps, stages, splits = config
    (m, k), n = x.shape, weight.shape[0]
    k_per_split = (
        triton.cdiv(triton.cdiv(k, splits), bk) * bk
    )  # whole BK steps; the last slice may be short
    splits = triton.cdiv(k, k_per_split)
    part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    descs = (
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(weight, [bn, bk]),
    )
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), splits)

    def call() -> None:
        split_k_kernel[grid](
            *descs,
            part,
            m,
            n,
            k,
            k_per_split,
            BM=bm,
            BN=bn,
            BK=bk,
            GROUP_M=8,
            num_warps=warps,
            num_stages=stages,
        )
        sum_splits_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            part, y, m * n, SPLITS=splits, BLOCK=REDUCE_BLOCK
        )

    return call


def make_call(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, config: tuple[int, ...]):
    bm, bn, bk, warps, stages = config
    (m, k), n = x.shape, weight.shape[0]
    descs = (
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(weight, [bn, bk]),
        TensorDescriptor.from_tensor(y, [bm, bn]),
    )
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    return lambda: gemm_kernel[grid](
        *descs, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=warps, num_stages=stages
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    parser.add_argument("--rows", default="128,256,512")
    parser.add_argument(
        "--split-k-only", action="store_true", help="cuBLAS and the split-K configs only"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    configs = [(make_call, c) for c in ([] if args.split_k_only else CONFIGS)]
    configs += [(split_k_call, c) for c in SPLIT_K_CONFIGS]
    torch.manual_seed(0)
    rows_out = []
    for name, (n, k) in weight_shapes(MODELS[args.model]).items():
        weight = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
        for num_rows in (int(v) for v in args.rows.split(",")):
            x = torch.randn(num_rows, k, dtype=torch.bfloat16, device="cuda")
            want = F.linear(x, weight).float()
            calls = {"cublas": lambda: F.linear(x, weight)}
            errors = {"cublas": 0.0}
            for maker, config in configs:
                label = "{}x{}x{} w{} s{}".format(*config) + (
                    " k{}".format(*config[5:]) if config[5:] else ""
                )
                y = torch.full((num_rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                try:
                    call = maker(x, weight, y, config)
                    call()
                    torch.cuda.synchronize()
                except Exception as exc:  # a config the compiler refuses: say so, go on
                    print(
                        f"{name} M={num_rows} {label}: {type(exc).__name__}: {str(exc)[:160]}",
                        flush=True,
                    )
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
                rows_out.append(
                    dict(weight=name, m=num_rows, config=label, us=us, err=errors[label])
                )
                print(
                    f"  {label:22} {us:9.1f} µs {flops / us / 1e6:7.1f} TFLOP/s {us / base:6.3f}x  "
                    f"err {errors[label]:.4f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(dict(vars(args), rows=rows_out), indent=1))


if __name__ == "__main__":
    main()
