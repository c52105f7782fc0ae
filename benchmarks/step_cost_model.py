"""CPU: where llama3-8b's throughput workloads spend their time on the H200, from a per-step cost
model built on measured kernel rates, and what each kernel-level improvement would give end to end.

    python benchmarks/step_cost_model.py [--workloads T0-llama3-8b,T2,T3-off]

Each workload's schedule runs through the real Scheduler (benchmarks/scheduler_sim.py's setup, with
the growth reserve; a fake runner samples a token for every row). Every step is costed from what it
holds, with rates measured on the H200 (the sources are beside the constants):
  GEMMs        the decoder layer's four cuBLAS GEMMs at the step's row count, interpolated between
               measured row counts, x 32 layers; the LM head at the sampled rows
  attention    decode rows: their context's KV bytes at the decode kernel's TB/s; prompt chunks:
               their causal FLOPs at the prefill kernel's TFLOP/s
  elementwise  norms, SiLU, RoPE + KV write per token, with a floor per step (launches)
Printed per workload: the modelled seconds by part, the measured seconds for comparison, and the
modelled output tok/s under each what-if scenario (one part made faster, the rest as measured).
The model ignores host time (hidden by async scheduling, measured GPU-busy 99%+) and overlap, and
reads shared prefixes' KV (T3-on) at DRAM speed where the GPU serves them from L2: T3-on is not
modelled (it comes out 20% slow).
"""

from __future__ import annotations

import argparse
import bisect
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_workloads import workload  # noqa: E402
from scheduler_sim import scheduled_steps  # noqa: E402

NUM_BLOCKS = 54923  # llama3-8b's KV cache on the H200 (session 13, run 6 log), blocks of 16
NUM_LAYERS, KV_BYTES_PER_TOKEN = 32, 131072
LINEAR_FLOPS_PER_TOKEN = 2 * 6.98e9  # the decoder layers' weights, all 32
# µs per layer of qkv + o + gate_up + down at M rows, cuBLAS (session 11, run 7, probes/gemm_backends.py);
# the first point is the weight read (436 MB at 4.2 TB/s) for M -> 0.
GEMM_LAYER_US = [(0, 104.0), (256, 220.0), (2176, 1502.0), (8192, 5275.2), (16384, 10647.8)]
LM_HEAD_BYTES, LM_HEAD_FLOPS_PER_ROW = 128256 * 4096 * 2, 2 * 128256 * 4096
LM_HEAD_RATE = 610e12  # at 256 rows (same run)
DECODE_KV_BYTES_PER_S = 3.9e12  # attention_kernels.py --decode: 3.7-4.3 TB/s (sessions 7, 15)
PREFILL_FLOPS_PER_S = 300e12  # prefill_peers.py: 256-323 TFLOP/s on 1-2k prompts (session 15)
ELEMENTWISE_S_PER_TOKEN = 1.5e-6  # RMSNorm 104 ms + SiLU 108 + prepare_qkv 41 over T0's 164k tokens
ELEMENTWISE_S_PER_STEP = 0.5e-3  # ~160 small launches of a decode step at ~3 µs
BANDWIDTH = 4.23e12
MEASURED_OUT_TOK_S = {
    "T0-llama3-8b": 7266.8,
    "T2": 9183.1,
    "T3-off": 1989.6,
    "T3-on": 8588.1,
}  # session 15


@dataclass
class Step:
    rows: int  # tokens computed (GEMM rows)
    sampled: int  # LM-head rows
    decode_kv_tokens: int  # context tokens the decode rows read (all layers' KV each)
    prefill_visible: int  # sum over prompt-chunk query tokens of the keys each sees


@dataclass
class Rates:
    small_gemm_rate: float | None = (
        None  # FLOP/s for GEMMs of <= SMALL_ROWS rows, bounded below by the
    )
    # weight read and above by the measured time; None: as measured
    gemm_scale: float = 1.0  # multiplies every GEMM's time, down to that weight-read floor
    decode_kv_bytes_per_s: float = DECODE_KV_BYTES_PER_S
    prefill_flops_per_s: float = PREFILL_FLOPS_PER_S
    elementwise_scale: float = 1.0


SMALL_ROWS = 1024
SCENARIOS = {
    "as measured": Rates(),
    "decode GEMMs at 650 TFLOP/s": Rates(small_gemm_rate=650e12),
    "all GEMMs 10% faster": Rates(gemm_scale=0.9),
    "decode KV at 4.23 TB/s": Rates(decode_kv_bytes_per_s=BANDWIDTH),
    "prefill attention at 556 TFLOP/s (cuDNN)": Rates(prefill_flops_per_s=556e12),
    "elementwise halved": Rates(elementwise_scale=0.5),
}


def gemm_layer_us(rows: int) -> float:
    """Piecewise-linear in rows between the measured points (linear beyond the last)."""
    points = GEMM_LAYER_US
    i = min(max(bisect.bisect_left([m for m, _ in points], rows), 1), len(points) - 1)
    (m0, t0), (m1, t1) = points[i - 1], points[i]
    return t0 + (t1 - t0) * (rows - m0) / (m1 - m0)


def step_seconds(step: Step, rates: Rates) -> dict[str, float]:
    floor = NUM_LAYERS * GEMM_LAYER_US[0][1] * 1e-6  # the weights' read
    gemm = NUM_LAYERS * gemm_layer_us(step.rows) * 1e-6
    if rates.small_gemm_rate is not None and step.rows <= SMALL_ROWS:
        gemm = min(gemm, max(floor, step.rows * LINEAR_FLOPS_PER_TOKEN / rates.small_gemm_rate))
    gemm = max(floor, gemm * rates.gemm_scale) if gemm > floor else gemm
    lm_head = (
        max(LM_HEAD_BYTES / BANDWIDTH, step.sampled * LM_HEAD_FLOPS_PER_ROW / LM_HEAD_RATE)
        if step.sampled
        else 0.0
    )
    decode = step.decode_kv_tokens * KV_BYTES_PER_TOKEN / rates.decode_kv_bytes_per_s
    prefill = 4 * 128 * 32 * NUM_LAYERS * step.prefill_visible / rates.prefill_flops_per_s
    elementwise = (
        max(step.rows * ELEMENTWISE_S_PER_TOKEN, ELEMENTWISE_S_PER_STEP) * rates.elementwise_scale
    )
    return {
        "GEMMs": gemm,
        "LM head": lm_head,
        "decode attention": decode,
        "prompt attention": prefill,
        "elementwise": elementwise,
    }


def schedule(wid: str, configure=None) -> list[Step]:
    """The workload's steps through the real Scheduler (growth reserve on; configure: called on
    it first, scheduler_sim.scheduled_steps)."""
    steps = []
    for sched, plan in scheduled_steps(wid, True, NUM_BLOCKS, configure):
        decode_kv = visible = 0
        for req_id, num in plan.num_scheduled_tokens.items():
            context = (
                sched.requests[req_id].num_computed_tokens - num
            )  # schedule() has counted this step's
            if num == 1:
                decode_kv += context + 1
            else:
                visible += num * context + num * (num + 1) // 2
        steps.append(
            Step(plan.total_num_scheduled_tokens, len(plan.sampling_req_ids), decode_kv, visible)
        )
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="T0-llama3-8b,T2,T3-off")
    args = parser.parse_args()
    for wid in args.workloads.split(","):
        model, _, max_tokens, _, _ = workload(wid)
        if model != "llama3-8b":
            raise ValueError(f"workloads: the model's rates are llama3-8b's; {wid} runs {model}")
        steps = schedule(wid)
        num_outputs = sum(max_tokens)
        measured = MEASURED_OUT_TOK_S.get(wid)
        measured_s = num_outputs / measured if measured else float("nan")
        parts: dict[str, float] = {}
        for step in steps:
            for name, seconds in step_seconds(step, Rates()).items():
                parts[name] = parts.get(name, 0.0) + seconds
        total = sum(parts.values())
        print(
            f"\n{wid}: {len(steps)} steps; modelled {total:.1f} s ({num_outputs / total:,.0f} out tok/s), "
            f"measured {measured_s:.1f} s ({measured or float('nan'):,.0f})"
        )
        for name, seconds in parts.items():
            print(f"  {name:18} {seconds:7.2f} s  {seconds / total:5.1%}")
        for label, rates in SCENARIOS.items():
            seconds = sum(sum(step_seconds(step, rates).values()) for step in steps)
            print(
                f"  what if {label:42} {num_outputs / seconds:9,.0f} out tok/s ({total / seconds - 1:+.1%})"
            )


if __name__ == "__main__":
    main()
