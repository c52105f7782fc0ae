"""`pagedlm bench serve`: a load generator for any OpenAI-compatible server (ours, vLLM's).

Requests arrive as a Poisson process (`--request-rate`, `inf`: all at once), at most
`--max-concurrency` in flight, each streamed, so that TTFT, inter-token latency (ITL), time per
output token (TPOT) and end-to-end latency are measured per request. Only OpenAI fields are
sent, plus `ignore_eos` (a vLLM extra) when asked for. `--num-clients N` spreads the requests
over N client processes (round-robin, each at its request's arrival time, each with its share of
`--max-concurrency`), so that at high rates the load generator is not what limits the figure.

The warm-up request is not from the dataset, and the report counts the prompt tokens the server
took from its prefix cache (usage.prompt_tokens_details.cached_tokens): a server that has seen
the same prompts before (an earlier run with the same --dataset-seed) skips their prefill."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagedlm.bench.datasets import BenchRequest, add_dataset_args, sample_requests, warmup_request
from pagedlm.bench.serve_clients import (
    ClientShare,
    RequestResult,
    open_client,
    run_clients,
    send_request,
    split_among_clients,
)

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds `serve` to `pagedlm bench`'s subcommands."""
    parser = subparsers.add_parser(
        "serve", help="load-test an OpenAI-compatible server", description=__doc__
    )
    parser.add_argument(
        "--base-url", default="http://127.0.0.1:8000", help="(default: %(default)s)"
    )
    parser.add_argument(
        "--endpoint", choices=ENDPOINTS, default=ENDPOINTS[0], help="(default: %(default)s)"
    )
    parser.add_argument("--model", default=None, help="(default: the server's first model)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="sent as a Bearer token (default: $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="the served model's tokenizer (folder or .gguf): its vocabulary "
        "sizes the random prompts; chat prompts are its decoded text "
        "(default: pagedlm's default model)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="draw prompt ids below this instead of loading a tokenizer "
        "(completions only: for servers started with --skip-tokenizer-init)",
    )
    parser.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests per second, Poisson arrivals; inf: all at once (default: inf)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="most requests in flight, over all clients (default: no limit)",
    )
    parser.add_argument(
        "--num-clients",
        type=int,
        default=1,
        help="client processes the requests are spread over, round-robin, so that the load "
        "generator is not the limit at high rates; 1: this process (default: 1)",
    )
    parser.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate exactly the output length (default: on)",
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="(default: 1.0)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the arrival times (default: 0)")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one request may take (default: 3600)"
    )
    parser.add_argument("--output-json", default=None, help="write the results to this JSON file")
    add_dataset_args(parser)
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> dict[str, Any]:
    _check_args(args)
    tokenizer = None if args.vocab_size else _load_tokenizer(args.tokenizer)
    vocab_size = args.vocab_size or len(tokenizer)
    requests = sample_requests(args, vocab_size)
    results = run_benchmark(args, requests, tokenizer)
    print(format_report(results))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def _check_args(args: argparse.Namespace) -> None:
    if not args.request_rate > 0:
        raise ValueError(
            f"request_rate must be positive (inf: all at once), got {args.request_rate}"
        )
    if args.vocab_size is not None and (args.vocab_size < 2 or args.endpoint != "/v1/completions"):
        raise ValueError(
            f"vocab_size needs the /v1/completions endpoint and at least 2 ids, got "
            f"{args.vocab_size} with {args.endpoint}"
        )
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"max_concurrency must be positive, got {args.max_concurrency}")
    if args.num_clients < 1:
        raise ValueError(f"num_clients must be positive, got {args.num_clients}")
    if args.max_concurrency is not None and args.max_concurrency < args.num_clients:
        raise ValueError(
            f"max_concurrency ({args.max_concurrency}) must be at least num_clients "
            f"({args.num_clients}): each client takes a share of it"
        )


def _load_tokenizer(source: str | None) -> Any:
    from pagedlm.config import default_model_path
    from pagedlm.engine.tokenizer import load_tokenizer

    path = source or default_model_path()
    return load_tokenizer(_TokenizerSource(path))


@dataclass(frozen=True)
class _TokenizerSource:
    """What load_tokenizer reads from a ModelConfig."""

    tokenizer: str


def run_benchmark(
    args: argparse.Namespace, requests: list[BenchRequest], tokenizer: Any
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = asyncio.run(_warm_up(args, headers, tokenizer))
    every_request = ClientShare(
        base_url=args.base_url,
        headers=headers,
        endpoint=args.endpoint,
        timeout=args.timeout,
        bodies=[_body(args, model, r, tokenizer) for r in requests],
        num_prompt_tokens=[len(r.prompt_token_ids) for r in requests],
        arrivals=arrival_times(args.seed, args.request_rate, len(requests)),
        max_concurrency=args.max_concurrency,
    )
    results, duration = run_clients(split_among_clients(every_request, args.num_clients))
    summary = summarize(results, duration)
    summary.update(
        model=model,
        endpoint=args.endpoint,
        base_url=args.base_url,
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        num_clients=args.num_clients,
        dataset=args.dataset,
        num_prompts=len(requests),
    )
    return summary


async def _warm_up(args: argparse.Namespace, headers: dict[str, str], tokenizer: Any) -> str:
    """One request off the dataset, sent once whatever the number of clients; returns the
    model's name."""
    async with open_client(args.base_url, headers, args.timeout) as client:
        model = args.model or await _first_model(client)
        warmup_req = warmup_request(len(tokenizer) if tokenizer is not None else args.vocab_size)
        warmup = await send_request(
            client,
            args.endpoint,
            _body(args, model, warmup_req, tokenizer),
            len(warmup_req.prompt_token_ids),
        )
    if not warmup.success:
        raise ValueError(f"the first request failed, nothing was measured: {warmup.error}")
    return model


def arrival_times(seed: int, request_rate: float, num_requests: int) -> list[float]:
    """One Poisson process at `request_rate` (inf: all at once), in seconds from the start."""
    if request_rate == float("inf"):
        return [0.0] * num_requests
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, size=num_requests)
    return np.cumsum(gaps).tolist()


async def _first_model(client: Any) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def _body(args: argparse.Namespace, model: str, request: BenchRequest, tokenizer: Any) -> dict:
    body: dict[str, Any] = {
        "model": model,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.endpoint == "/v1/completions":
        body.update(prompt=request.prompt_token_ids, max_tokens=request.output_len)
    else:
        text = tokenizer.decode(request.prompt_token_ids)
        body.update(
            messages=[{"role": "user", "content": text}], max_completion_tokens=request.output_len
        )
    if args.ignore_eos:
        body["ignore_eos"] = True
    return body


def summarize(results: list[RequestResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    num_output = sum(r.num_output_tokens for r in ok)
    num_prompt = sum(r.num_prompt_tokens for r in ok)
    tpots = [
        (r.latency - r.ttft) / (r.num_output_tokens - 1) for r in ok if r.num_output_tokens > 1
    ]
    summary: dict[str, Any] = {
        "duration_s": duration,
        "successful_requests": len(ok),
        "failed_requests": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.success})[:10],
        "total_input_tokens": num_prompt,
        "total_output_tokens": num_output,
        "total_cached_tokens": sum(r.num_cached_tokens for r in ok),
        "request_throughput": len(ok) / duration,
        "output_throughput": num_output / duration,
        "total_token_throughput": (num_prompt + num_output) / duration,
    }
    for name, values in (
        ("ttft", [r.ttft for r in ok]),
        ("tpot", tpots),
        ("itl", [gap for r in ok for gap in r.itl]),
        ("e2el", [r.latency for r in ok]),
    ):
        ms = np.asarray(values, dtype=np.float64) * 1000.0
        for stat, fn in (
            ("mean", np.mean),
            ("median", np.median),
            ("p99", lambda a: np.percentile(a, 99)),
        ):
            summary[f"{stat}_{name}_ms"] = float(fn(ms)) if ms.size else None
    return summary


def format_report(s: dict[str, Any]) -> str:
    lines = [
        "=" * 20 + " Serving benchmark " + "=" * 20,
        f"Successful requests:            {s['successful_requests']}",
        f"Failed requests:                {s['failed_requests']}",
        f"Duration (s):                   {s['duration_s']:.2f}",
        f"Total input tokens:             {s['total_input_tokens']}",
        f"Cached input tokens:            {s['total_cached_tokens']}",
        f"Total output tokens:            {s['total_output_tokens']}",
        f"Request throughput (req/s):     {s['request_throughput']:.2f}",
        f"Output token throughput (tok/s): {s['output_throughput']:.2f}",
        f"Total token throughput (tok/s): {s['total_token_throughput']:.2f}",
    ]
    for name, title in (
        ("ttft", "Time to first token"),
        ("tpot", "Time per output token"),
        ("itl", "Inter-token latency"),
        ("e2el", "End-to-end latency"),
    ):
        lines.append(f"---- {title} (ms) ----")
        for stat in ("mean", "median", "p99"):
            value = s[f"{stat}_{name}_ms"]
            lines.append(
                f"{stat.capitalize() + ':':<32}{'n/a' if value is None else f'{value:.2f}'}"
            )
    lines += [f"Errors: {e}" for e in s["errors"]]
    return "\n".join(lines)
