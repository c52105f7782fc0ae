"""GPU: a persistent Triton TMA GEMM, and one with SiLU-and-mul fused, against cuBLAS on llama3-8b.

Can a Triton GEMM match cuBLAS on the prefill GEMMs, and what would fusing SiLU-and-mul into
gate_up's epilogue save?

    python benchmarks/probes/gemm_fusion_probe.py [--rows 16384,8192,2048,256] [--shapes qkv,o,gate_up,down]
                                           [--rounds 5] [--skip-ws] [--json out.json]

On the H200, everything (4 weights x 4 row counts, 7 configs, plus the fused ones on gate_up):
    python benchmarks/probes/gemm_fusion_probe.py --json $OUT/gemm_fusion_probe.json
(not yet run on a GPU; estimated 1-3 minutes, mostly the ~14 compiles and the fp32 references).

For each weight of llama3-8b's layer (qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096,
down 4096 x 14336) and each row count M: y = x @ W.T in bf16 (fp32 accumulation) by cuBLAS
(F.linear) and by `persistent_gemm_kernel` under each of CONFIGS. The kernel is persistent (one
program per SM, each looping over output tiles in grouped order so that GROUP_M row tiles share a
weight tile through L2) and loads and stores through host-side TMA descriptors
(triton.tools.tensor_descriptor.TensorDescriptor: no device-side scratch, no triton.set_allocator);
configs marked "ws" add Triton's automatic warp specialization (tl.range(..., warp_specialize=True)).
For gate_up also the fused variant: the same kernel over the weight with gate and up rows
interleaved (row 2j = gate j, row 2j+1 = up j, `interleave_gate_up`), so each accumulator tile holds
matching gate/up column pairs and the epilogue writes silu(gate) * up ([M, 14336]); against cuBLAS
gate_up followed by pagedlm's silu_and_mul kernel, and against cuBLAS gate_up alone.

Before any timing each Triton output (written into a NaN-filled buffer) is checked against the fp32
product of the bf16 inputs; a config that fails to compile, to run, to be captured, or to match
(max |diff| > 1% of max |ref|) is printed with the reason and left out. Every contender is captured in
a CUDA graph of one call, so that Python launch costs do not count at small M, then timed as in
gemm_backends.py: CUDA events over 20 replays, contenders alternating over --rounds rounds, median.
A line per contender says how its check went (its label is printed first, so a config that hangs
the GPU is named last: rerun with --skip-ws if it is a warp-specialized one, Triton's newest path on
Hopper), then a line per timed contender; the tables come last; --json is rewritten after every
shape, so a run cut short keeps what it measured.

Table columns (GEMMs): shape, M; cuBLAS µs and TFLOP/s (% of the measured 797 TFLOP/s bf16 limit);
the fastest Triton config's µs, TFLOP/s (%), ratio = Triton µs / cuBLAS µs (below 1: Triton is
faster), diff = max |Triton - cuBLAS| / max |fp32 ref|, and the config (BM x BN x BK, stages,
warps, ws). Fused table (gate_up): cuBLAS µs, cuBLAS + silu_and_mul µs, the fastest fused config's
µs, its ratio to cuBLAS + silu_and_mul and to cuBLAS alone, diff = max |fused - (cuBLAS +
silu_and_mul)| / max |fp32 ref|, and the config.

Under TRITON_INTERPRET=1 (CPU) the same kernel and TMA path run on tiny shapes, so there is no
pointer-based variant: the interpreter emulates host descriptors (zero-filling out-of-bounds loads,
clipping stores) and ignores the stages, warps and warp-specialize hints. Its tl.dot multiplies bf16
as raw uint16, so tests/test_gemm_fusion_probe.py runs the kernel in fp16 there (bf16 on a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path[:0] = [
    str(p) for p in Path(__file__).resolve().parents[:3]
]  # probes/, benchmarks/, the repo

from gemm_backends import PEAK_TFLOPS, time_us, weight_shapes  # noqa: E402
from gpu_workloads import MODELS  # noqa: E402

from pagedlm.ops.activation import silu_and_mul  # noqa: E402
from pagedlm.ops.gate_up_silu import gate_up_silu, grouped_tile  # noqa: E402
from pagedlm.ops.triton_compat import patch_interpreter  # noqa: E402

patch_interpreter()  # the tile and K loops' bounds are run-time values
TOLERANCE = 1e-2  # max |diff| / max |ref| a Triton output may show against the fp32 product
GROUP_M = 8


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    warp_specialize: bool = False

    @property
    def label(self) -> str:
        ws = " ws" if self.warp_specialize else ""
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k} s{self.num_stages} w{self.num_warps}{ws}"
        )


# BM, BN, BK, stages, warps[, warp-specialized]. Shared memory: stages x (BM + BN) x BK x 2 bytes
# plus the BM x BN bf16 epilogue tile, within the H200's 227 KB (128x256x64 s3: 208 KB).
CONFIGS = [
    TileConfig(128, 128, 64, 4, 8),
    TileConfig(128, 128, 64, 5, 8),
    TileConfig(128, 128, 64, 4, 4),
    TileConfig(128, 256, 64, 3, 8),
    TileConfig(256, 128, 64, 3, 8),
    TileConfig(128, 128, 64, 4, 8, True),
    TileConfig(128, 256, 64, 3, 8, True),
]


@triton.jit
def persistent_gemm_kernel(
    x_desc,  # [M, K], blocks [BM, BK]
    w_desc,  # [N, K], blocks [BN, BK]; for SILU_MUL gate/up rows interleaved (interleave_gate_up)
    y_desc,  # [M, N], blocks [BM, BN]; for SILU_MUL [M, N // 2], blocks [BM, BN // 2]
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """Program p computes tiles p, p + NUM_PROGRAMS, ... of y = x @ w.T (fp32 accumulation)."""
    num_tiles_m = tl.cdiv(M, BM)
    num_tiles_n = tl.cdiv(N, BN)
    k_steps = tl.cdiv(K, BK)
    # The epilogue recomputes its tile from a counter of its own: with the loops flattened and
    # pipelined, the next tile's loads run before this tile's store, so they must not share values.
    epilogue_tile = tl.program_id(0) - NUM_PROGRAMS
    for tile_id in tl.range(
        tl.program_id(0),
        num_tiles_m * num_tiles_n,
        NUM_PROGRAMS,
        flatten=True,
        warp_specialize=WARP_SPECIALIZE,
    ):
        tile_m, tile_n = grouped_tile(tile_id, num_tiles_m, num_tiles_n, GROUP_M)
        acc = tl.zeros((BM, BN), tl.float32)
        for k_step in range(k_steps):  # TMA zero-fills rows and columns past M, N and K
            x = x_desc.load([tile_m * BM, k_step * BK])
            w = w_desc.load([tile_n * BN, k_step * BK])
            acc = tl.dot(x, w.T, acc)
        epilogue_tile += NUM_PROGRAMS
        tile_m, tile_n = grouped_tile(epilogue_tile, num_tiles_m, num_tiles_n, GROUP_M)
        if SILU_MUL:
            gate, up = acc.reshape(BM, BN // 2, 2).split()  # columns 2j, 2j + 1: gate j, up j
            out = gate / (1.0 + tl.exp(-gate)) * up
            y_desc.store([tile_m * BM, tile_n * (BN // 2)], out.to(y_desc.dtype))
        else:
            y_desc.store([tile_m * BM, tile_n * BN], acc.to(y_desc.dtype))


def interleave_gate_up(weight: torch.Tensor) -> torch.Tensor:
    """[2I, K] (gate rows, then up rows) -> [2I, K] with row 2j = gate row j, row 2j + 1 = up row j."""
    return weight.view(2, -1, weight.shape[1]).transpose(0, 1).reshape(weight.shape)


def deinterleave_gate_up(weight: torch.Tensor) -> torch.Tensor:
    """The inverse of interleave_gate_up."""
    return weight.view(-1, 2, weight.shape[1]).transpose(0, 1).reshape(weight.shape)


def gemm_call(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    config: TileConfig,
    silu_mul: bool,
    num_programs: int,
) -> Callable[[], None]:
    """A call that writes out = x @ weight.T, or with silu_mul (weight interleaved, out [M, N / 2])
    silu(gate) * up; descriptors are built once, here."""
    (m, k), n = x.shape, weight.shape[0]
    out_block_n = config.block_n // 2 if silu_mul else config.block_n
    descriptors = (
        TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
        TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k]),
        TensorDescriptor.from_tensor(out, [config.block_m, out_block_n]),
    )
    grid = (min(num_programs, triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)),)
    return lambda: persistent_gemm_kernel[grid](
        *descriptors,
        m,
        n,
        k,
        BM=config.block_m,
        BN=config.block_n,
        BK=config.block_k,
        GROUP_M=GROUP_M,
        NUM_PROGRAMS=num_programs,
        SILU_MUL=silu_mul,
        WARP_SPECIALIZE=config.warp_specialize,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def relative_diff(got: torch.Tensor, other: torch.Tensor, scale: float) -> float:
    """max |got - other| / scale (NaN when got holds a NaN)."""
    return ((got.float() - other.float()).abs().max() / scale).item()


def graph_of(call: Callable[[], object]) -> Callable[[], None]:
    """The replay of a CUDA graph holding one call (already run once, so nothing compiles here)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def try_contender(
    label: str,
    kind: str,
    make_run: Callable[[], Callable[[], torch.Tensor]],
    want: torch.Tensor,
    baseline: torch.Tensor,
) -> tuple[Callable[[], None] | None, dict]:
    """Build, run once, check against the fp32 reference, capture: (replay, record), or (None, record
    saying why not)."""
    record: dict = {"label": label, "kind": kind}
    try:
        run = make_run()
        got = run()
        torch.cuda.synchronize()
        scale = want.abs().max().item()
        record.update(
            err_ref=relative_diff(got, want, scale),
            diff_baseline=relative_diff(got, baseline, scale),
        )
        if not record["err_ref"] <= TOLERANCE:  # also catches NaN: an element left unwritten
            record["status"] = "mismatch"
            return None, record
        replay = graph_of(run)
    except Exception as exc:  # a config the compiler or the GPU refuses: say so, go on
        first_line = (str(exc).strip().splitlines() or [""])[0]
        record["status"] = f"{type(exc).__name__}: {first_line[:160]}"
        return None, record
    record["status"] = "ok"
    return replay, record


def triton_runner(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    config: TileConfig,
    silu_mul: bool,
    num_programs: int,
) -> Callable[[], torch.Tensor]:
    """Fill out with NaN and return a runner that launches the kernel into it and hands it back."""
    out.fill_(float("nan"))
    call = gemm_call(x, weight, out, config, silu_mul, num_programs)

    def run() -> torch.Tensor:
        call()
        return out

    return run


def time_contenders(replays: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """Median µs a call of each contender, contenders alternating within each round."""
    for replay in replays.values():
        time_us(replay)  # warm-up
    times: dict[str, list[float]] = {label: [] for label in replays}
    for _ in range(rounds):
        for label, replay in replays.items():
            times[label].append(time_us(replay))
    return {label: statistics.median(values) for label, values in times.items()}


def measure(
    name: str, n: int, k: int, num_rows: int, configs: list[TileConfig], rounds: int, num_sms: int
) -> dict:
    """Every contender on one (weight, M): check, capture, time; the record of each."""
    x = torch.randn(num_rows, k, dtype=torch.bfloat16, device="cuda")
    weight = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
    want = x.float() @ weight.float().T  # [M, N] fp32 product of the bf16 inputs
    cublas_out = F.linear(x, weight)
    out = torch.empty_like(cublas_out)  # shared by the configs, NaN-filled before each one's check
    contenders = [("cuBLAS", "cublas", lambda: lambda: F.linear(x, weight), want, cublas_out)]
    contenders += [
        (
            config.label,
            "triton",
            partial(triton_runner, x, weight, out, config, False, num_sms),
            want,
            cublas_out,
        )
        for config in configs
    ]
    if name == "gate_up":
        want_fused = F.silu(want[:, : n // 2]) * want[:, n // 2 :]
        cublas_fused = silu_and_mul(cublas_out)
        fused_weight, fused_out = interleave_gate_up(weight), torch.empty_like(cublas_fused)
        contenders.append(
            (
                "cuBLAS+silu_and_mul",
                "cublas+silu_and_mul",
                lambda: lambda: silu_and_mul(F.linear(x, weight)),
                want_fused,
                cublas_fused,
            )
        )
        contenders += [
            (
                "fused " + config.label,
                "fused",
                partial(triton_runner, x, fused_weight, fused_out, config, True, num_sms),
                want_fused,
                cublas_fused,
            )
            for config in configs
        ]
        contenders.append(
            (
                "pagedlm gate_up_silu",
                "pagedlm",
                lambda: partial(gate_up_silu, x, weight),
                want_fused,
                cublas_fused,
            )
        )
    replays, records = {}, {}
    for label, kind, make_run, reference, baseline in contenders:
        print(
            f"{name} M={num_rows} {label:28} ", end="", flush=True
        )  # a hang leaves its label last
        replay, record = try_contender(label, kind, make_run, reference, baseline)
        records[label] = record
        print(f"{record['status']}, err {record.get('err_ref', math.nan):.1e}", flush=True)
        if replay is not None:
            replays[label] = replay
    flops = 2 * num_rows * n * k
    for label, us in time_contenders(replays, rounds).items():
        records[label].update(us=us, tflops=flops / us / 1e6)
        print(
            f"{name} M={num_rows} {label:28} {us:10.1f} µs {flops / us / 1e6:6.1f} TFLOP/s",
            flush=True,
        )
    return dict(shape=name, m=num_rows, n=n, k=k, contenders=list(records.values()))


def fastest(row: dict, kind: str) -> dict | None:
    """The row's fastest timed contender of that kind (triton, fused), or None."""
    timed = [c for c in row["contenders"] if c["kind"] == kind and "us" in c]
    return min(timed, key=lambda c: c["us"], default=None)


def timed_us(row: dict, kind: str) -> float:
    """µs of the row's contender of that kind (NaN where it did not run)."""
    return next((c["us"] for c in row["contenders"] if c["kind"] == kind and "us" in c), math.nan)


def rate(flops: int, us: float) -> str:
    """TFLOP/s and its share of the measured bf16 limit."""
    tflops = flops / us / 1e6
    return f"{tflops:6.1f} ({tflops / PEAK_TFLOPS:4.0%})"


def print_gemm_table(rows: list[dict]) -> None:
    print(
        f"\n{'shape':8} {'M':>6} {'cuBLAS µs':>10} {'TFLOP/s':>13} {'Triton µs':>10} {'TFLOP/s':>13} "
        f"{'ratio':>6} {'diff':>7}  config"
    )
    for row in rows:
        flops, cublas_us, best = (
            2 * row["m"] * row["n"] * row["k"],
            timed_us(row, "cublas"),
            fastest(row, "triton"),
        )
        triton_part = (
            f"{best['us']:10.1f} {rate(flops, best['us'])} {best['us'] / cublas_us:6.3f} "
            f"{best['diff_baseline']:7.4f}  {best['label']}"
            if best
            else "no Triton config ran"
        )
        print(
            f"{row['shape']:8} {row['m']:6} {cublas_us:10.1f} {rate(flops, cublas_us)} {triton_part}"
        )


def print_fused_table(rows: list[dict]) -> None:
    print(
        f"\n{'gate_up+silu':12} {'M':>6} {'cuBLAS µs':>10} {'+silu_mul µs':>12} {'fused µs':>10} "
        f"{'/+silu':>7} {'/cuBLAS':>7} {'diff':>7}  config"
    )
    for row in rows:
        cublas_us, unfused_us = timed_us(row, "cublas"), timed_us(row, "cublas+silu_and_mul")
        for kind in (
            "fused",
            "pagedlm",
        ):  # interleaved weight; the engine's (stacked tiles, the weight as stored)
            best = fastest(row, kind)
            fused_part = (
                f"{best['us']:10.1f} {best['us'] / unfused_us:7.3f} {best['us'] / cublas_us:7.3f} "
                f"{best['diff_baseline']:7.4f}  {best['label']}"
                if best
                else f"no {kind} config ran"
            )
            print(
                f"{'gate_up+silu':12} {row['m']:6} {cublas_us:10.1f} {unfused_us:12.1f} {fused_part}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="16384,8192,2048,256")
    parser.add_argument("--shapes", default="qkv,o,gate_up,down")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--skip-ws", action="store_true", help="leave out the warp-specialized configs"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gemm_fusion_probe.py needs a CUDA device")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is a true fp32 product
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    configs = [c for c in CONFIGS if not (args.skip_ws and c.warp_specialize)]
    shapes = weight_shapes(MODELS["llama3-8b"])
    rows = []
    for name in args.shapes.split(","):
        n, k = shapes[name]
        for num_rows in (int(v) for v in args.rows.split(",")):
            rows.append(measure(name, n, k, num_rows, configs, args.rounds, num_sms))
            torch.cuda.empty_cache()
            if args.json:  # rewritten after every shape: a run cut short keeps what it measured
                Path(args.json).write_text(
                    json.dumps(
                        dict(
                            vars(args),
                            peak_tflops=PEAK_TFLOPS,
                            tolerance=TOLERANCE,
                            num_sms=num_sms,
                            configs=[asdict(c) for c in configs],
                            rows=rows,
                        ),
                        indent=1,
                    )
                )
    print_gemm_table(rows)
    fused_rows = [row for row in rows if row["shape"] == "gate_up"]
    if fused_rows:
        print_fused_table(fused_rows)


if __name__ == "__main__":
    main()
