"""GPU: where a batch-1 decode step's time goes besides the graph, from the GPU's own timeline.

    python benchmarks/step_timeline.py [--workload L1] [--output-len 96] [--trace $OUT/trace.json]
        [--one-step]

L1 ran at 4,384 µs a token (session 8) while one decode-graph replay takes 4,223 µs on the GPU
(decode_replay.py): this finds the difference. One generate of a gpu_workloads.py workload (L1 and
L2 with fewer output tokens) runs under torch.profiler after a warm-up; the GPU activities (kernels,
including those inside graph replays, memcpys, memsets) of its steady part (EDGE_FRACTION of the time
left out at each end) are merged into busy intervals. Printed: GPU-busy and idle time (per decode
step for L1/L2), and the idle gaps of more than 1 µs grouped by the activities on either side,
largest first (and, before them, the GPU time of each kind of activity over the whole run): e.g. a gap before a graph's first kernel is the host's graph launch; one between
two small ops, launch latency. The profiler's own cost inflates kernels by ~1 µs each.
--one-step also lists every GPU activity of one step in the middle of the run (from one device-to-host
copy to the next), in order: start from the step's start, duration, and the gap from the previous
activity's end (negative where PDL overlaps them), to see which kernels of a batch-1 layer leave
DRAM idle and for how long.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_workloads import model_dir, workload  # noqa: E402

from pagedlm import LLM, SamplingParams  # noqa: E402

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MIN_GAP_US = 1.0
TOP_KERNELS = 25
EDGE_FRACTION = 0.08  # of the run's time left out at each end (prefill, ramp, drain)


def gpu_activities(trace_path: Path) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every GPU activity in a chrome trace, by start."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    spans = [
        (e["ts"], e["ts"] + e.get("dur", 0), e["name"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES
    ]
    return sorted(spans)


def short(name: str) -> str:
    return name if len(name) <= 48 else name[:45] + "..."


def idle_gaps(
    spans: list[tuple[float, float, str]],
) -> tuple[float, float, list[tuple[float, str, str]]]:
    """(busy µs, span µs, gaps (µs, activity before, activity after)) over the merged intervals."""
    busy, gaps = 0.0, []
    cur_start, cur_end, cur_name = spans[0]
    for start, end, name in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            if start - cur_end > MIN_GAP_US:
                gaps.append((start - cur_end, short(cur_name), short(name)))
            cur_start, cur_end, cur_name = start, end, name
        elif end >= cur_end:
            cur_end, cur_name = end, name
    busy += cur_end - cur_start
    return busy, cur_end - spans[0][0], gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload", default="L1", help="a gpu_workloads.py workload id (L1, L2, T1, ...)"
    )
    parser.add_argument(
        "--output-len", type=int, default=96, help="L1/L2: output tokens (shorter than theirs)"
    )
    parser.add_argument("--trace", default=None, help="keep the chrome trace here")
    parser.add_argument(
        "--one-step", action="store_true", help="list one mid-run step's activities"
    )
    args = parser.parse_args()
    model, prompts, max_tokens, temperature, overrides = workload(args.workload)
    if args.workload in ("L1", "L2"):
        max_tokens = [args.output_len]
    params = [
        SamplingParams(temperature=temperature, max_tokens=m, ignore_eos=True, seed=i)
        for i, m in enumerate(max_tokens)
    ]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(
            model_dir(model, Path(tmp)),
            load_format="dummy",
            dtype="bfloat16",
            skip_tokenizer_init=True,
            **overrides,
        )
        llm.generate(inputs[:8], params[:8], use_tqdm=False)  # warm-up
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CUDA]
        ) as prof:  # GPU side only
            llm.generate(inputs, params, use_tqdm=False)
        trace = Path(args.trace) if args.trace else Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        spans = gpu_activities(trace)
    # the steady part: EDGE_FRACTION of the run's time left out at each end (prefill, ramp, drain)
    start, end = spans[0][0], spans[-1][1]
    lo, hi = start + EDGE_FRACTION * (end - start), end - EDGE_FRACTION * (end - start)
    busy, span, gaps = idle_gaps([s for s in spans if lo <= s[0] and s[1] <= hi])
    num_steps = (span / (end - start)) * (max_tokens[0] - 1) if len(prompts) == 1 else None
    per = f"{num_steps:.1f} steps" if num_steps else "ms"
    scale = num_steps if num_steps else 1e3  # µs per step, or ms in all
    unit = "µs/step" if num_steps else "ms"
    print(
        f"{args.workload} ({model}): {len(spans)} GPU activities; steady part {span / 1e3:.1f} ms ({per}): "
        f"GPU busy {busy / scale:.1f}, idle {(span - busy) / scale:.1f} {unit} ({100 * (span - busy) / span:.1f}%)"
    )
    kernel_us: dict[str, float] = defaultdict(float)
    for start_us, end_us, name in spans:
        kernel_us[short(name)] += end_us - start_us
    total_us = sum(kernel_us.values())
    print(f"{'GPU ms':>10} {'share':>6}  activity (the whole run: {total_us / 1e3:.1f} ms)")
    for name, us in sorted(kernel_us.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]:
        print(f"{us / 1e3:10.1f} {100 * us / total_us:5.1f}%  {name}")
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for gap, before, after in gaps:
        groups[(before, after)].append(gap)
    print(f"{'idle ' + unit:>12} {'count':>6}  before -> after")
    for (before, after), values in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:15]:
        print(f"{sum(values) / scale:12.1f} {len(values):6d}  {before} -> {after}")
    print_by_tenth(spans)
    if args.one_step:
        print_one_step(spans)


def one_step(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The activities from the middle device-to-host copy (one a step: the sampled ids) to the next
    one, both included."""
    copies = [i for i, s in enumerate(spans) if "DtoH" in s[2]]
    if len(copies) < 2:
        return []
    middle = len(copies) // 2 - 1
    return spans[copies[middle] : copies[middle + 1] + 1]


def print_one_step(spans: list[tuple[float, float, str]]) -> None:
    step = one_step(spans)
    if not step:
        print("--one-step: fewer than two device-to-host copies in the run")
        return
    first = step[0][0]
    print(f"one step: {len(step)} activities over {step[-1][1] - first:.1f} µs")
    print(f"{'start µs':>9} {'dur µs':>7} {'gap µs':>7}  activity")
    prev_end = first
    for start, end, name in step:
        print(f"{start - first:9.1f} {end - start:7.1f} {start - prev_end:7.1f}  {short(name)}")
        prev_end = max(prev_end, end)


def print_by_tenth(spans: list[tuple[float, float, str]]) -> None:
    """GPU busy and idle ms in each tenth of the whole run (edges included), with the number of
    device-to-host copies there (about one a step): where in the run the GPU waits."""
    start, end = spans[0][0], spans[-1][1]
    width = (end - start) / 10
    print(f"{'tenth':>5} {'steps':>6} {'busy ms':>8} {'idle ms':>8}  (the whole run)")
    for i in range(10):
        lo, hi = start + i * width, start + (i + 1) * width
        part = [s for s in spans if lo <= s[0] < hi]
        if not part:
            print(f"{i + 1:5d} {0:6d} {0.0:8.1f} {width / 1e3:8.1f}")
            continue
        busy, _, _ = idle_gaps(part)
        num_copies = sum(1 for s in part if "DtoH" in s[2])
        print(f"{i + 1:5d} {num_copies:6d} {busy / 1e3:8.1f} {(width - busy) / 1e3:8.1f}")


if __name__ == "__main__":
    main()
