"""Sampler overhead: the same workload with every sampling feature off vs temperature + top-p +
penalties on, through LLM.generate; or (--sampler-only) the sampler alone on random logits.

    .venv/bin/python benchmarks/sampler_overhead.py [--num-prompts 64] [--input-len 32]
        [--output-len 32] [--repeats 3] [--load-format dummy] [--device cpu]
        [--max-num-batched-tokens N]
    .venv/bin/python benchmarks/sampler_overhead.py --sampler-only [--num-rows 256]
        [--vocab-size 151936] [--input-len 32] [--output-len 16] [--repeats 5] [--device cuda]
        [--profile top_p,top_k]

The default model (SmolLM2-135M-Instruct; `--load-format dummy`: its shapes with random
weights, the same compute), prompts of random token ids, exactly `--output-len` tokens each
(ignore_eos). Settings: "greedy" (no feature), "random" (temperature 1, nothing else), "top_p"
(temperature 0.8, top_p 0.9), "top_k" (temperature 0.8, top_k 50), "penalties" (temperature 0.8,
repetition 1.1, presence 0.5, frequency 0.5), "full" (all of top_p's and penalties'). The settings
run in turn, `--repeats` rounds after one warm-up; reported: the median output tokens per
wall-clock second and per second of the process's CPU time, and the share of that CPU time
spent in the sampler (SamplingState.sample; on the CPU device, the sampler's whole cost).
--sampler-only times SamplingState.sample on [num-rows, vocab-size] float32 logits (standard
normal x 2), each row with an input-len prompt and output-len outputs of random ids: the median
milliseconds of one step over --repeats steps after two warm-up steps, per setting (on the CPU,
the process's CPU time, which other jobs on a shared machine do not inflate; on CUDA, wall time
between synchronizations).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.sample import SamplingState  # noqa: E402

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "random": dict(temperature=1.0, seed=0),
    "top_p": dict(temperature=0.8, top_p=0.9, seed=0),
    "top_k": dict(temperature=0.8, top_k=50, seed=0),
    "penalties": dict(
        temperature=0.8, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5, seed=0
    ),
    "full": dict(
        temperature=0.8,
        top_p=0.9,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        seed=0,
    ),
}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the default model")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--sampler-only", action="store_true", help="time the sampler alone")
    parser.add_argument(
        "--profile",
        default="",
        help="--sampler-only: comma-separated settings to profile a step of",
    )
    parser.add_argument("--num-rows", type=int, default=32, help="--sampler-only: batch rows")
    parser.add_argument("--vocab-size", type=int, default=49152, help="--sampler-only")
    return parser.parse_args()


@dataclass
class Run:
    rate: float  # output tokens per wall-clock second
    cpu_rate: float  # output tokens per second of this process's CPU time
    sampler_share: float  # the part of that CPU time spent in SamplingState.sample


class SamplerClock:
    """Adds up the process CPU time spent in SamplingState.sample (on the CPU device, the whole
    cost of the sampler; on CUDA, only its host side)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        original = SamplingState.sample

        def timed_sample(state: SamplingState, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.process_time()
            try:
                return original(state, *args, **kwargs)
            finally:
                self.seconds += time.process_time() - start

        SamplingState.sample = timed_sample


def _run(
    llm: LLM, prompts: list[list[int]], setting: str, output_len: int, clock: SamplerClock
) -> Run:
    """One generate call of the setting, timed (other jobs on a shared machine inflate the wall
    time, much less the process's CPU time)."""
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, **SETTINGS[setting])
    start, start_cpu, start_sampler = time.perf_counter(), time.process_time(), clock.seconds
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return Run(
        num_tokens / elapsed,
        num_tokens / elapsed_cpu,
        (clock.seconds - start_sampler) / elapsed_cpu,
    )


def _sampler_step_ms(args: argparse.Namespace, setting: str) -> list[float]:
    """Milliseconds of each timed SamplingState.sample step of one setting."""
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    state = SamplingState(args.num_rows, args.vocab_size, device, seed=0)
    params = SamplingParams(max_tokens=args.output_len + args.repeats + 2, **SETTINGS[setting])
    for row in range(args.num_rows):
        state.add_request(
            row,
            params,
            rng.integers(0, args.vocab_size, args.input_len).tolist(),
            rng.integers(0, args.vocab_size, args.output_len).tolist(),
        )
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(args.num_rows, args.vocab_size, generator=gen) * 2).to(device)
    work = torch.empty_like(logits)
    rows_np = np.arange(args.num_rows)
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    times = []
    for _ in range(args.repeats + 2):
        work.copy_(logits)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = clock()
        state.sample(work, rows_np)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(1e3 * (clock() - start))
    if setting in args.profile.split(","):
        _profile_step(state, work, logits, rows_np, setting)
    return times[2:]


def _profile_step(
    state: SamplingState,
    work: torch.Tensor,
    logits: torch.Tensor,
    rows_np: np.ndarray,
    setting: str,
) -> None:
    """One more step under torch.profiler: its kernels by device time, and the host's time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if work.is_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    work.copy_(logits)
    with torch.profiler.profile(activities=activities) as prof:
        state.sample(work, rows_np)
        if work.is_cuda:
            torch.cuda.synchronize(work.device)
    sort_by = "cuda_time_total" if work.is_cuda else "cpu_time_total"
    print(f"{setting}: one step under torch.profiler")
    print(prof.key_averages().table(sort_by=sort_by, row_limit=14, max_name_column_width=48))


def sampler_only(args: argparse.Namespace) -> None:
    times = {setting: _sampler_step_ms(args, setting) for setting in SETTINGS}
    base = statistics.median(times["greedy"])
    print(
        f"sampler alone: [{args.num_rows}, {args.vocab_size}] float32 logits, device "
        f"{args.device}, torch threads {torch.get_num_threads()}; median of {args.repeats} steps"
    )
    print("| setting | ms per step (median) | steps | vs greedy |")
    print("|---|---|---|---|")
    for setting, values in times.items():
        median = statistics.median(values)
        steps = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {setting} | {median:.2f} | {steps} | {median - base:+.2f} ms |")


def main() -> None:
    args = _parse_args()
    if args.sampler_only:
        sampler_only(args)
        return
    llm = LLM(
        args.model,
        load_format=args.load_format,
        device=args.device,
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=args.input_len + args.output_len + 16,
        enable_prefix_caching=False,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    vocab_size = llm.llm_engine.model_config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [
        rng.integers(100, vocab_size, args.input_len).tolist() for _ in range(args.num_prompts)
    ]
    clock = SamplerClock()
    for setting in SETTINGS:  # warm-up
        _run(llm, prompts[:4], setting, 4, clock)
    runs: dict[str, list[Run]] = {setting: [] for setting in SETTINGS}
    for _ in range(args.repeats):
        for setting in SETTINGS:
            runs[setting].append(_run(llm, prompts, setting, args.output_len, clock))
    _print_runs(args, runs)


def _print_runs(args: argparse.Namespace, runs: dict[str, list[Run]]) -> None:
    base = statistics.median(r.rate for r in runs["greedy"])
    base_cpu = statistics.median(r.cpu_rate for r in runs["greedy"])
    print(
        f"{args.num_prompts} prompts x {args.input_len} tokens, {args.output_len} output tokens, "
        f"device {args.device}, load_format {args.load_format}; median of {args.repeats}"
    )
    print(
        "| setting | output tok/s (median) | runs | vs greedy | tok per CPU-second | vs greedy "
        "| sampler share of CPU time |"
    )
    print("|---|---|---|---|---|---|---|")
    for setting, values in runs.items():
        rate = statistics.median(r.rate for r in values)
        cpu_rate = statistics.median(r.cpu_rate for r in values)
        share = statistics.median(r.sampler_share for r in values)
        rates = ", ".join(f"{r.rate:.0f}" for r in values)
        print(
            f"| {setting} | {rate:.1f} | {rates} | {100 * (rate / base - 1):+.1f}% "
            f"| {cpu_rate:.1f} | {100 * (cpu_rate / base_cpu - 1):+.1f}% | {100 * share:.1f}% |"
        )


if __name__ == "__main__":
    main()
