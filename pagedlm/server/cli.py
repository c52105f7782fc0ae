"""`pagedlm serve [MODEL]`: the subcommand's flags (the engine's, plus the server's)."""

from __future__ import annotations

import argparse
from typing import Any

from pagedlm.config import EngineArgs
from pagedlm.engine.heartbeat import HeartbeatTimeouts

# The names of pagedlm/server/tool_parsers' parsers (importing it would import pydantic here).
TOOL_PARSER_NAMES = (
    "hermes",
    "llama3_json",
    "llama4_pythonic",
    "mistral",
    "pythonic",
    "qwen3_coder",
)
# pagedlm/server/reasoning.py's parsers, by name.
REASONING_PARSER_NAMES = ("deepseek_r1", "qwen3")
# Parsing a body this large takes well under a second of the pool's time (a 16 MiB one stalled
# /health ~2.4 s on the 2-core CI machine); a max_model_len prompt is a few hundred KiB at most.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# Under Kubernetes' default grace period (30 s) with room for the core's exit.
DEFAULT_SHUTDOWN_TIMEOUT_S = 20.0


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds `serve` to `pagedlm`'s subcommands; imports nothing heavy of the server (FastAPI,
    uvicorn, torch) until it runs: only the heartbeat's defaults, with zmq."""
    parser = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server",
        description="Serve a model over OpenAI's HTTP API.",
    )
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="a model folder or .gguf file (same as --model; default: SmolLM2-135M)",
    )
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    group.add_argument(
        "--served-model-name",
        default=None,
        help="the name clients use in `model` (default: MODEL as given, or the "
        "default model's file name)",
    )
    group.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health",
    )
    group.add_argument(
        "--max-num-queued-reqs",
        type=_positive,
        default=None,
        help="admission control: most requests in flight (waiting + running; a "
        "request with n counts n); over it: 503 (default: no limit)",
    )
    group.add_argument(
        "--max-num-queued-tokens",
        type=_positive,
        default=None,
        help="admission control: most prompt tokens of requests still in prefill; "
        "over it: 503 (default: no limit)",
    )
    group.add_argument(
        "--max-request-body-bytes",
        type=_positive,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"larger bodies get 413 (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        help="on SIGTERM/SIGINT: new requests get 503 while those in flight run "
        "for up to this many seconds, then the rest are aborted; 0: abort at "
        "once. A second signal exits at once "
        f"(default: {DEFAULT_SHUTDOWN_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=HeartbeatTimeouts.unhealthy_s,
        help="seconds without a heartbeat from the engine core before /health and "
        "new requests get 503 (default: %(default)g)",
    )
    group.add_argument(
        "--stall-timeout",
        type=_seconds,
        default=HeartbeatTimeouts.dead_s,
        help="seconds without a heartbeat before the engine core is declared dead: "
        "the server then exits 1, as when the core dies (default: %(default)g)",
    )
    group.add_argument(
        "--log-stats-interval",
        type=float,
        default=5.0,
        help="seconds between two stats log lines (default: 5)",
    )
    group.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='tool_choice "auto": the model\'s output is read for tool calls by '
        "--tool-call-parser's parser",
    )
    group.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSER_NAMES),
        default=None,
        help='the format of the model\'s tool calls, for tool_choice "auto"',
    )
    group.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSER_NAMES),
        default=None,
        help="split the model's <think>...</think> out of chat answers into "
        "message.reasoning_content (streamed: delta.reasoning_content); deepseek_r1: the "
        "output may start inside the block, qwen3: only an output opening with <think> reasons",
    )
    group.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    group.add_argument(
        "--enable-dev-endpoints",
        action="store_true",
        help="serve the memory-lifecycle and RL endpoints (/sleep, /wake_up, /pause, /resume, "
        "/reset_prefix_cache, /collective_rpc, ...: pagedlm/server/dev_endpoints.py); they "
        "need the API key like every route; off: 404",
    )
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(func=run_serve)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def run_serve(args: argparse.Namespace) -> None:
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser "
            f"({', '.join(sorted(TOOL_PARSER_NAMES))})"
        )
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(
                f"model: given twice, as MODEL={args.model_tag!r} and --model={args.model!r}"
            )
        args.model = args.model_tag
    from pagedlm.server.launch import run_server

    run_server(args)
