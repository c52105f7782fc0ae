"""GPU: a few engine steps of a workload, host and device on one clock.

    python benchmarks/step_trace.py [--workload T1] [--windows 300:303,40:43] [--phases 0:40]

step_timeline.py finds where the GPU idles; this shows what the host was doing meanwhile. The
workload's requests go through LLMEngine.step() one step at a time (as LLM.generate does), and
for each window of steps [a, b) torch.profiler records host and device: the engine's phases
(marked with record_function: the core's schedule, the runner's execute_model, the wait for a
step's output, the scheduler's update and the output processor), the CUDA runtime calls that
took more than MIN_CALL_US, and the GPU's busy intervals (merged activities) and idle gaps, in
order of start. A gap that begins while the host is inside a phase is that phase's doing.
The profiler slows the host several-fold: --phases a:b instead times each phase of steps [a, b)
with the host's clock alone (no profiler) and prints one row per step; "wait" is the time the
host blocked on a step's event: near 0, the host was behind and the GPU idled meanwhile.
--cprofile N adds a cProfile of those steps (the N functions with the most own time).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_workloads import model_dir, workload  # noqa: E402
from step_timeline import GPU_CATEGORIES, short  # noqa: E402

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.worker import runner_output  # noqa: E402

MIN_CALL_US = 10.0  # CUDA runtime calls shorter than this are launches: left out
MIN_GAP_US = 2.0


def marked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return wrapper


Wrap = Callable[[str, Callable[..., Any]], Callable[..., Any]]


def wrap_phases(llm: LLM, wrap: Wrap) -> None:
    """wrap(name, method) around the engine's phases: the core's schedule, the runner's execute_model,
    the scheduler's update and the output processor (instance attributes shadow the methods)."""
    engine = llm.llm_engine
    scheduler, runner = engine.engine_core.scheduler, engine.engine_core.model_runner
    scheduler.schedule = wrap("schedule", scheduler.schedule)
    scheduler.update_from_output = wrap("update_from_output", scheduler.update_from_output)
    # the engine core launches a step in two calls (forward, then sampling): one phase
    runner.execute_forward = wrap("execute_model", runner.execute_forward)
    runner.sample_tokens = wrap("execute_model", runner.sample_tokens)
    engine.output_processor.process_outputs = wrap(
        "process_outputs", engine.output_processor.process_outputs
    )


def mark_phases(llm: LLM) -> None:
    """record_function around the engine's phases and each wait for a step's output."""
    wrap_phases(llm, marked)
    cls = runner_output.AsyncRunnerOutput
    cls.get_output = marked("get_output", cls.get_output)


class PhaseClock:
    """Host seconds spent in each wrapped phase since the last reset()."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    def reset(self) -> None:
        self.seconds = {}


PHASES = ("schedule", "execute_model", "wait", "update_from_output", "process_outputs")


def clock_phases(llm: LLM) -> PhaseClock:
    """A clock on the engine's phases and on every wait for a CUDA event ("wait")."""
    clock = PhaseClock()
    wrap_phases(llm, clock.wrap)
    torch.cuda.Event.synchronize = clock.wrap("wait", torch.cuda.Event.synchronize)
    return clock


def run_phases(llm: LLM, clock: PhaseClock, first: int, steps: int) -> None:
    """One row per step: µs in each phase (wait: blocked on an event, inside execute_model's or
    the core's get_output) and the step's total."""
    print(f"{'step':>5} " + " ".join(f"{name[:10]:>10}" for name in PHASES) + f" {'total':>8}  µs")
    for i in range(steps):
        clock.reset()
        start = time.perf_counter()
        llm.llm_engine.step()
        total = time.perf_counter() - start
        print(
            f"{first + i:5d} "
            + " ".join(f"{clock.seconds.get(name, 0.0) * 1e6:10.0f}" for name in PHASES)
            + f" {total * 1e6:8.0f}"
        )


def timeline(trace: dict) -> list[tuple[float, float, str]]:
    """(start µs, end µs, label) of the host's phases and long runtime calls and of the GPU's busy
    intervals and gaps, by start."""
    rows, gpu = [], []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        cat, start, dur = e.get("cat"), e["ts"], e.get("dur", 0)
        if cat == "user_annotation" and not e["name"].startswith("ProfilerStep"):
            rows.append((start, start + dur, f"host  {e['name']}"))
        elif cat == "cuda_runtime" and dur > MIN_CALL_US:
            rows.append((start, start + dur, f"host    {e['name']}"))
        elif cat in GPU_CATEGORIES:
            gpu.append((start, start + dur, e["name"]))
    gpu.sort()
    rows += gpu_rows(gpu)
    return sorted(rows)


def gpu_rows(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The GPU's busy intervals (with their activity count and first and last names) and gaps."""
    rows = []
    start, end, first, last, count = spans[0][0], spans[0][1], spans[0][2], spans[0][2], 1
    for s, e, name in spans[1:]:
        if s - end > MIN_GAP_US:
            rows.append((start, end, f"GPU busy ({count}: {short(first)} .. {short(last)})"))
            rows.append((end, s, "GPU IDLE"))
            start, first, count = s, name, 0
        end, last, count = max(end, e), name, count + 1
    rows.append((start, end, f"GPU busy ({count}: {short(first)} .. {short(last)})"))
    return rows


def run_window(llm: LLM, steps: int, out: Path | None) -> None:
    engine = llm.llm_engine
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    if out is not None:
        out.write_text(json.dumps(trace))
    rows = timeline(trace)
    origin = rows[0][0]
    for start, end, label in rows:
        print(f"{start - origin:10.1f} {end - start:9.1f}  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="T1", help="a gpu_workloads.py workload id")
    parser.add_argument(
        "--windows", default="300:303", help="step ranges a:b, comma-separated, ascending"
    )
    parser.add_argument("--trace-dir", default=None, help="keep each window's chrome trace here")
    parser.add_argument(
        "--phases", default=None, help="a:b: host phase times of steps [a, b), no profiler"
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        help="with --phases: cProfile those steps, print this many functions by own time",
    )
    args = parser.parse_args()
    model, prompts, max_tokens, temperature, overrides = workload(args.workload)
    if len(max_tokens) == 1:
        max_tokens = max_tokens * len(prompts)
    windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(
            model_dir(model, Path(tmp)),
            load_format="dummy",
            dtype="bfloat16",
            skip_tokenizer_init=True,
            **overrides,
        )
        warm = SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True, seed=0)
        llm.generate([{"prompt_token_ids": p} for p in prompts[:8]], warm, use_tqdm=False)
        if args.phases:
            clock = clock_phases(llm)
        else:
            mark_phases(llm)
        engine = llm.llm_engine
        for i, (prompt, m) in enumerate(zip(prompts, max_tokens)):
            params = SamplingParams(temperature=temperature, max_tokens=m, ignore_eos=True, seed=i)
            engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params, final_only=True)
        if args.phases:
            a, b = (int(x) for x in args.phases.split(":"))
            for _ in range(a):
                engine.step()
            profiler = cProfile.Profile() if args.cprofile else None
            if profiler:
                profiler.enable()
            run_phases(llm, clock, a, b - a)
            if profiler:
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)
            return
        step = 0
        for a, b in windows:
            while step < a and engine.has_unfinished_requests():
                engine.step()
                step += 1
            print(f"--- steps {a}..{b - 1} of {args.workload}: start µs, duration µs, what")
            out = Path(args.trace_dir) / f"trace_{a}.json" if args.trace_dir else None
            run_window(llm, b - a, out)
            step = b


if __name__ == "__main__":
    main()
