"""Latency of one batch end to end: `--batch-size` prompts of `--input-len` random tokens,
`--output-len` tokens each (ignore_eos, greedy); warm-up runs, then timed runs with percentiles
and the fraction of the hardware limit reached."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from pagedlm.bench.roofline import HardwareFloor, ModelCost, generation_floor
from pagedlm.config import EngineArgs
from pagedlm.sampling_params import SamplingParams


def add_latency_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-iters-warmup", type=int, default=2)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--output-json", default=None, help="write the results to this JSON file")


def run_latency(args: argparse.Namespace, engine_args: EngineArgs) -> dict[str, Any]:
    from pagedlm.llm import LLM

    llm = LLM(**vars(engine_args))
    model_config = llm.llm_engine.model_config
    rng = np.random.default_rng(0)
    prompts = [
        {"prompt_token_ids": rng.integers(0, model_config.vocab_size, args.input_len).tolist()}
        for _ in range(args.batch_size)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    for _ in range(args.num_iters_warmup):
        llm.generate(prompts, params, use_tqdm=False)
    latencies = []
    for _ in range(args.num_iters):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    floor = generation_floor(
        ModelCost.of(model_config),
        [args.input_len] * args.batch_size,
        [args.output_len] * args.batch_size,
        args.batch_size,
    )
    results = summarize_latency(latencies, floor, args.batch_size * args.output_len)
    print(
        f"Latency: mean {results['avg_latency']:.3f} s, median {results['p50_latency']:.3f} s, "
        f"p99 {results['p99_latency']:.3f} s; {results['output_tokens_per_second']:.1f} output tokens/s; "
        f"{floor.describe(results['p50_latency'])}"
    )
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def summarize_latency(
    latencies: list[float], floor: HardwareFloor, num_output_tokens: int
) -> dict[str, Any]:
    values = np.asarray(latencies)
    median = float(np.median(values))
    return {
        "avg_latency": float(values.mean()),
        "latencies": latencies,
        **{f"p{p}_latency": float(np.percentile(values, p)) for p in (10, 25, 50, 75, 90, 99)},
        "output_tokens_per_second": num_output_tokens / median,
        **floor.results(median),
    }
