"""The `pagedlm` command: generate | chat | serve | bench throughput | latency | serve."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pagedlm.config import EngineArgs
from pagedlm.logger import configure_logging


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Sampling flags; the seed is the engine's --seed."""
    group = parser.add_argument_group("sampling")
    group.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default: 0)")
    group.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default: 1)")
    group.add_argument("--top-k", type=int, default=0, help="0: off (default: 0)")
    group.add_argument("--min-p", type=float, default=0.0, help="(default: 0)")
    group.add_argument(
        "--max-tokens", type=int, default=64, help="tokens to generate (default: 64)"
    )
    group.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")


def sampling_params_from(namespace: argparse.Namespace) -> Any:
    from pagedlm.sampling_params import SamplingParams

    return SamplingParams(
        temperature=namespace.temperature,
        top_p=namespace.top_p,
        top_k=namespace.top_k,
        min_p=namespace.min_p,
        max_tokens=namespace.max_tokens,
        seed=namespace.seed,
        ignore_eos=namespace.ignore_eos,
    )


def _run_generate(args: argparse.Namespace) -> None:
    from pagedlm.llm import LLM

    params = sampling_params_from(args)
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    outputs = llm.generate(args.prompts, params, use_tqdm=False)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}")
        print(f"Output: {output.outputs[0].text}")
        print("-" * 60)


def _run_chat(args: argparse.Namespace) -> None:
    from pagedlm.chat_repl import run_chat_repl
    from pagedlm.llm import LLM

    params = sampling_params_from(args)
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    run_chat_repl(llm, params, sys.stdin, sys.stdout, args.system)


def _run_bench_throughput(args: argparse.Namespace) -> None:
    from pagedlm.bench.throughput import run_throughput

    run_throughput(args, EngineArgs.from_cli_args(args))


def _run_bench_latency(args: argparse.Namespace) -> None:
    from pagedlm.bench.latency import run_latency

    run_latency(args, EngineArgs.from_cli_args(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedlm", description="pagedlm: LLM inference engine")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="complete prompts and print the outputs")
    generate.add_argument("prompts", nargs="+", metavar="PROMPT")
    EngineArgs.add_cli_args(generate)
    add_sampling_args(generate)
    generate.set_defaults(func=_run_generate)

    chat = commands.add_parser("chat", help="interactive chat on stdin (/exit or EOF ends)")
    chat.add_argument("--system", default=None, help="a system message")
    EngineArgs.add_cli_args(chat)
    add_sampling_args(chat)
    chat.set_defaults(func=_run_chat)

    from pagedlm.bench.latency import add_latency_args
    from pagedlm.bench.throughput import add_throughput_args

    bench = commands.add_parser("bench", help="benchmarks")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    throughput = bench_commands.add_parser("throughput", help="offline throughput on a dataset")
    add_throughput_args(throughput)
    EngineArgs.add_cli_args(throughput)
    throughput.set_defaults(func=_run_bench_throughput)
    latency = bench_commands.add_parser("latency", help="latency of one batch, end to end")
    add_latency_args(latency)
    EngineArgs.add_cli_args(latency)
    latency.set_defaults(func=_run_bench_latency)

    from pagedlm.bench.serve import add_parser as add_bench_serve_parser
    from pagedlm.server.cli import add_serve_parser

    add_bench_serve_parser(bench_commands)
    add_serve_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging()
    try:
        args.func(args)
    except ValueError as exc:
        print(f"pagedlm: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
