"""GPU: a batch-1 generate in parts: the first token (add, prefill, sample) against the decode steps.

    python benchmarks/first_token.py [--workload L2] [--repeats 5] [--host-profile $OUT/prefill_host.txt]
        [--engine-args '{"cudagraph_mode": "FULL_DECODE_ONLY"}']

L2 ran at 1,451.5 tok/s (352.7 ms for 512 tokens, session 12) while a decode-graph replay takes ~659 µs:
511 of them are 337 ms. This finds where the rest goes. generate() of the workload's prompt is timed
with max_tokens 1, 2 and the workload's N (median of --repeats each, after a warm-up): the first token
costs t(1), a decode step (t(N) - t(2)) / (N - 2); the same for a one-token prompt separates the
prefill from the fixed cost of a call. Then one generate(max_tokens=1) under torch.profiler (the GPU's
busy time within it: a prefill the host cannot launch fast enough leaves the GPU idle) and, with
--host-profile, under cProfile (the host's functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_workloads import model_dir, workload  # noqa: E402
from step_timeline import gpu_activities, idle_gaps  # noqa: E402

from pagedlm import LLM, SamplingParams  # noqa: E402


def timed(llm: LLM, prompt: list[int], max_tokens: int, repeats: int) -> float:
    """Median seconds of generate(prompt, max_tokens) over `repeats` calls."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpu_busy_ms(llm: LLM, prompt: list[int], trace: Path) -> tuple[float, float, float]:
    """(wall ms of generate(max_tokens=1), GPU-busy ms within it, ms from its first to last GPU activity)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        wall = time.perf_counter() - start
    prof.export_chrome_trace(str(trace))
    busy, span, _ = idle_gaps(gpu_activities(trace))
    return wall * 1e3, busy / 1e3, span / 1e3


def host_profile(llm: LLM, prompt: list[int], path: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    path.write_text(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="L2", help="L1 or L2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--host-profile", default=None, help="write cProfile's tables of a first token here"
    )
    parser.add_argument("--engine-args", default="{}", help="JSON dict of extra LLM(...) arguments")
    args = parser.parse_args()
    model, prompts, max_tokens, _, overrides = workload(args.workload)
    prompt, n = prompts[0], max_tokens[0]
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(
            model_dir(model, Path(tmp)),
            load_format="dummy",
            dtype="bfloat16",
            skip_tokenizer_init=True,
            **overrides,
            **json.loads(args.engine_args),
        )
        timed(llm, prompt, 8, 2)  # warm-up
        rows = []
        for name, ids in ((f"{len(prompt)}-token prompt", prompt), ("1-token prompt", prompt[:1])):
            t1, t2, tn = (timed(llm, ids, m, args.repeats) for m in (1, 2, n))
            step = (tn - t2) / (n - 2)
            rows.append((name, t1, t2, tn, step, t2 - t1 - step))  # the first decode step's extra
        if args.host_profile:
            host_profile(llm, prompt, Path(args.host_profile))
        busy = (
            gpu_busy_ms(llm, prompt, Path(tmp) / "trace.json")
            if torch.cuda.is_available()
            else None
        )
    print(
        f"{args.workload} ({model}) {args.engine_args}, median of {args.repeats}; ms unless marked"
    )
    print(
        f"{'prompt':>20} {'t(1)':>8} {'t(2)':>8} {'t(' + str(n) + ')':>8} {'step µs':>8} {'t2-t1-step':>10} {'tok/s':>8}"
    )
    for name, t1, t2, tn, step, rest in rows:
        print(
            f"{name:>20} {t1 * 1e3:8.3f} {t2 * 1e3:8.3f} {tn * 1e3:8.2f} {step * 1e6:8.1f} "
            f"{rest * 1e3:10.3f} {n / tn:8.1f}"
        )
    if busy:
        wall, busy_ms, span = busy
        print(
            f"generate(max_tokens=1) of the {len(prompt)}-token prompt under torch.profiler: wall {wall:.3f} ms, "
            f"GPU busy {busy_ms:.3f} ms over {span:.3f} ms from its first to last GPU activity"
        )


if __name__ == "__main__":
    main()
