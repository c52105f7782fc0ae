"""Offline throughput: every request submitted at once to LLM.generate, one warm-up, then timed."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from pagedlm.bench.datasets import BenchRequest, add_dataset_args, sample_requests, warmup_request
from pagedlm.bench.roofline import ModelCost, generation_floor
from pagedlm.config import EngineArgs
from pagedlm.outputs import RequestOutput
from pagedlm.sampling_params import SamplingParams


def add_throughput_args(parser: argparse.ArgumentParser) -> None:
    add_dataset_args(parser)
    parser.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate exactly the output length (default: on)",
    )
    parser.add_argument("--output-json", default=None, help="write the results to this JSON file")
    parser.add_argument(
        "--use-tqdm",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="progress bar (default: off)",
    )


def run_throughput(args: argparse.Namespace, engine_args: EngineArgs) -> dict[str, Any]:
    from pagedlm.llm import LLM

    llm = LLM(**vars(engine_args))
    vocab_size = llm.llm_engine.model_config.vocab_size
    requests = sample_requests(args, vocab_size)
    _warm_up(llm, vocab_size, args.ignore_eos)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [_params(r.output_len, args.ignore_eos) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=args.use_tqdm)
    elapsed = time.perf_counter() - start
    results = summarize(requests, outputs, elapsed)
    floor = generation_floor(
        ModelCost.of(llm.llm_engine.model_config),
        [len(r.prompt_token_ids) for r in requests],
        [len(out.outputs[0].token_ids) for out in outputs],  # as generated (EOS)
        llm.llm_engine.config.scheduler.max_num_seqs,
    )
    results.update(floor.results(elapsed))
    print(
        f"Throughput: {results['requests_per_second']:.2f} requests/s, "
        f"{results['tokens_per_second']:.2f} total tokens/s, "
        f"{results['output_tokens_per_second']:.2f} output tokens/s "
        f"({results['num_requests']} requests in {elapsed:.2f} s, "
        f"{results['total_cached_tokens']} prompt tokens from the prefix cache); "
        f"{floor.describe(elapsed)}"
    )
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def summarize(
    requests: list[BenchRequest], outputs: list[RequestOutput], elapsed: float
) -> dict[str, Any]:
    num_prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    num_output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "elapsed_time": elapsed,
        "num_requests": len(requests),
        "num_prompt_tokens": num_prompt_tokens,
        "num_output_tokens": num_output_tokens,
        "total_num_tokens": num_prompt_tokens + num_output_tokens,
        "total_cached_tokens": sum(o.num_cached_tokens for o in outputs),  # prefix-cache hits
        "requests_per_second": len(requests) / elapsed,
        "tokens_per_second": (num_prompt_tokens + num_output_tokens) / elapsed,
        "output_tokens_per_second": num_output_tokens / elapsed,
    }


def _warm_up(llm: Any, vocab_size: int, ignore_eos: bool) -> None:
    request = warmup_request(vocab_size)
    llm.generate(
        {"prompt_token_ids": request.prompt_token_ids},
        _params(request.output_len, ignore_eos),
        use_tqdm=False,
    )


def _params(output_len: int, ignore_eos: bool) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_p=1.0, max_tokens=output_len, ignore_eos=ignore_eos)
