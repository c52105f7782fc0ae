"""GPU: the small-batch GEMV (pagedlm/ops/gemv.py) against cuBLAS (F.linear) on decode shapes, bf16.

    python benchmarks/gemv_bench.py [--sweep] [--models qwen3-0.6b,llama3-8b] [--m 1,2,4,8] [--json out.jsonl]

Matrices (N, K): each model's qkv, o, gate_up, down and lm_head; "down+silu" is down_proj with
silu_and_mul fused into gemv's prologue, against silu_and_mul (pagedlm's Triton op) then F.linear.
Timing: CUDA-graph replay of max(20, ring) back-to-back calls, call i on weight i % ring, where the
ring of distinct weights holds >= RING_BYTES so the 50 MB L2 cannot serve a weight from the previous
call; the median of REPLAYS replays / calls. TB/s = weight bytes / time. Error: max |y - F.linear in
fp32| on weight 0. --sweep also times a small set of launch configs per row (compiles dominate).
Rows print as JSON lines as they finish; a table and per-model decode-step sums come at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedlm.ops.activation import silu_and_mul  # noqa: E402
from pagedlm.ops.gemv import GemvConfig, default_config, gemv, launch_split_k, with_auto_split_k  # noqa: E402

MODELS = {  # name: (num_layers, {matrix: (N, K)})
    "qwen3-0.6b": (
        28,
        {
            "qkv": (4096, 1024),
            "o": (1024, 2048),
            "gate_up": (6144, 1024),
            "down": (1024, 3072),
            "down+silu": (1024, 3072),
            "lm_head": (151936, 1024),
        },
    ),
    "llama3-8b": (
        32,
        {
            "qkv": (6144, 4096),
            "o": (4096, 4096),
            "gate_up": (28672, 4096),
            "down": (4096, 14336),
            "down+silu": (4096, 14336),
            "lm_head": (128256, 4096),
        },
    ),
}
STEP_MATRICES = (
    "qkv",
    "o",
    "gate_up",
    "down+silu",
)  # one decoder layer's GEMMs (down with its activation)
RING_BYTES = 256 << 20
MIN_CALLS, REPLAYS = 20, 5
DTYPE, DEVICE = torch.bfloat16, "cuda"


def sweep_configs(num_rows: int, n: int, k: int, default: GemvConfig) -> list[GemvConfig]:
    """FMA tiles (one warp; at M=1 also two pipeline stages and two warps) for M <= 4, tl.dot tiles for
    M >= 2, each with K split by the default rule, 2x and 4x that, and unsplit; split_k as launched
    (so no launch twice), the default config (timed already) left out."""
    tiles = []
    if num_rows <= 4:
        tiles += [
            GemvConfig(block_n, block_k, num_warps=1, num_stages=1)
            for block_n, block_k in ((4, 512), (8, 256), (8, 512), (16, 256))
        ]
    if num_rows == 1:
        tiles += [
            GemvConfig(8, 256, num_warps=1, num_stages=2),
            GemvConfig(16, 256, num_warps=2, num_stages=1),
        ]
    if num_rows >= 2:
        tiles += [
            GemvConfig(block_n, block_k, num_warps=4, num_stages=3, use_dot=True)
            for block_n, block_k in ((64, 128), (128, 64))
        ]
    splits = [with_auto_split_k(tile, n, k) for tile in tiles]
    splits += [dataclasses.replace(c, split_k=c.split_k * f) for c in splits for f in (2, 4)]
    configs = dict.fromkeys(as_launched(c, k) for c in splits + tiles)
    return [c for c in configs if c != as_launched(default, k)]


def as_launched(config: GemvConfig, k: int) -> GemvConfig:
    return dataclasses.replace(config, split_k=launch_split_k(k, config)[0])


def config_label(config: GemvConfig, k: int) -> str:
    c = as_launched(config, k)
    return f"{'dot' if c.use_dot else 'fma'} n{c.block_n} k{c.block_k} s{c.split_k} w{c.num_warps} st{c.num_stages}"


def time_us(call, ring: int) -> float:
    """Median µs per call over graph replays of max(MIN_CALLS, ring) calls, call i on weight i % ring."""
    num_calls = max(MIN_CALLS, ring)
    for i in range(ring):  # compile, warm cuBLAS's heuristics and the allocator outside the capture
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(num_calls):
            call(i % ring)
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / num_calls)
    return statistics.median(times)


class Row:
    """One (model, matrix, M): its weights ring, input, reference and the measurements so far."""

    def __init__(
        self, model: str, matrix: str, n: int, k: int, num_rows: int, weights: list[torch.Tensor]
    ):
        self.model, self.matrix, self.n, self.k, self.num_rows = model, matrix, n, k, num_rows
        self.weights, self.act = weights, "silu_and_mul" if matrix == "down+silu" else None
        self.x = torch.randn(num_rows, 2 * k if self.act else k, device=DEVICE, dtype=DTYPE)
        x_in = silu_and_mul(self.x) if self.act else self.x
        self.ref = F.linear(x_in.float(), weights[0].float())  # [M, N]
        self.results: dict[str, dict] = {}

    def cublas(self, i: int) -> torch.Tensor:
        return F.linear(silu_and_mul(self.x) if self.act else self.x, self.weights[i])

    def measure(self, impl: str, call, label: str) -> dict:
        err = (call(0).float() - self.ref).abs().max().item()
        us = time_us(call, len(self.weights))
        result = dict(
            model=self.model,
            matrix=self.matrix,
            n=self.n,
            k=self.k,
            m=self.num_rows,
            impl=impl,
            config=label,
            us=round(us, 2),
            tbps=round(self.n * self.k * DTYPE.itemsize / us / 1e6, 3),
            max_abs_err=err,
        )
        print(json.dumps(result), flush=True)
        if impl != "sweep":
            self.results[impl] = result
        if impl != "cublas" and result["us"] < self.results.get("best", {"us": math.inf})["us"]:
            self.results["best"] = result

    def run(self, sweep: bool) -> None:
        self.measure(
            "cublas", self.cublas, "F.linear" + (" after silu_and_mul" if self.act else "")
        )
        config = default_config(self.num_rows, self.n, self.k, DTYPE)
        self.measure("gemv", self.gemv_call(config), config_label(config, self.k))
        for other in sweep_configs(self.num_rows, self.n, self.k, config) if sweep else []:
            try:
                self.measure("sweep", self.gemv_call(other), config_label(other, self.k))
            except Exception as exc:  # a config the compiler refuses: say so, go on
                print(
                    json.dumps(
                        dict(
                            matrix=self.matrix,
                            m=self.num_rows,
                            config=config_label(other, self.k),
                            error=str(exc)[:160],
                        )
                    ),
                    flush=True,
                )
        self.weights = []  # the ring is the caller's; only the results stay

    def gemv_call(self, config: GemvConfig):
        return lambda i: gemv(self.x, self.weights[i], act=self.act, config=config)


def make_weights(n: int, k: int) -> list[torch.Tensor]:
    ring = min(64, max(2, math.ceil(RING_BYTES / (n * k * DTYPE.itemsize))))
    return [torch.randn(n, k, device=DEVICE, dtype=DTYPE) / math.sqrt(k) for _ in range(ring)]


def print_table(rows: list[Row]) -> None:
    print(
        f"\n{'model':<11} {'matrix':<9} {'N':>6} {'K':>6} {'M':>2} | {'cuBLAS us':>9} {'TB/s':>5} | "
        f"{'gemv us':>8} {'TB/s':>5} {'err':>8} | {'best us':>8} {'TB/s':>5}  best config"
    )
    for row in rows:
        cublas, ours, best = (row.results[key] for key in ("cublas", "gemv", "best"))
        print(
            f"{row.model:<11} {row.matrix:<9} {row.n:>6} {row.k:>6} {row.num_rows:>2} | "
            f"{cublas['us']:>9.2f} {cublas['tbps']:>5.2f} | {ours['us']:>8.2f} {ours['tbps']:>5.2f} "
            f"{ours['max_abs_err']:>8.1e} | {best['us']:>8.2f} {best['tbps']:>5.2f}  {best['config']}"
        )


def print_step_sums(rows: list[Row]) -> None:
    """Per model and M: layers x (qkv + o + gate_up + down with silu) + lm_head, cuBLAS vs gemv vs best."""
    print("\ndecode-step GEMM sums (us): layers x (qkv + o + gate_up + down+silu) + lm_head")
    by_key = {(r.model, r.matrix, r.num_rows): r.results for r in rows}
    for model, (num_layers, _) in MODELS.items():
        for num_rows in sorted({r.num_rows for r in rows if r.model == model}):
            sums = {}
            for impl in ("cublas", "gemv", "best"):
                try:
                    layer = sum(
                        by_key[model, matrix, num_rows][impl]["us"] for matrix in STEP_MATRICES
                    )
                    sums[impl] = num_layers * layer + by_key[model, "lm_head", num_rows][impl]["us"]
                except KeyError:  # a matrix filtered out of this run
                    break
            if len(sums) == 3:
                print(
                    f"{model:<11} M={num_rows}: cuBLAS {sums['cublas']:8.1f}  gemv {sums['gemv']:8.1f}  "
                    f"best {sums['best']:8.1f}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sweep", action="store_true", help="also time a small set of launch configs"
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--matrices", default=None, help="comma-separated subset, e.g. o,down+silu")
    parser.add_argument("--m", default="1,2,4,8", help="batch sizes (rows of x)")
    parser.add_argument(
        "--json", default=None, help="also write every finished row's results here (JSON list)"
    )
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    start = time.perf_counter()
    rows: list[Row] = []
    for model in args.models.split(","):
        for matrix, (n, k) in MODELS[model][1].items():
            if args.matrices and matrix not in args.matrices.split(","):
                continue
            weights = make_weights(n, k)
            for num_rows in (int(m) for m in args.m.split(",")):
                row = Row(model, matrix, n, k, num_rows, weights)
                row.run(args.sweep)
                rows.append(row)
            del weights
            torch.cuda.empty_cache()
    print_table(rows)
    print_step_sums(rows)
    print(f"# {time.perf_counter() - start:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([r.results for r in rows], indent=1))


if __name__ == "__main__":
    main()
