"""`pagedlm serve`: start the engine core, then uvicorn; SIGTERM/SIGINT stop accepting, abort
what is in flight, stop the core process and exit 0."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from types import FrameType

import uvicorn

from pagedlm.config import EngineArgs, default_model_path
from pagedlm.server.api_server import build_app
from pagedlm.server.async_engine import AdmissionLimits, AsyncLLM
from pagedlm.server.serving import ServingContext

logger = logging.getLogger("pagedlm.server")

GRACEFUL_SHUTDOWN_S = 10


class _Server(uvicorn.Server):
    """uvicorn's server; its signal handler also tells the engine to stop taking requests and
    to abort those in flight, so open streams end at once instead of running to completion."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM) -> None:
        super().__init__(config)
        self._engine = engine
        self._loop = asyncio.get_running_loop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._loop.call_soon_threadsafe(self._engine.stop_accepting)


def served_model_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    return args.model or Path(default_model_path()).name


async def serve(args: argparse.Namespace, engine_args: EngineArgs) -> None:
    """The core process starts at once and builds the engine config from `engine_args`, while
    this process builds the same config (one GGUF parse each instead of one after the other)."""
    name = served_model_name(args)
    limits = AdmissionLimits(args.max_num_queued_reqs, args.max_num_queued_tokens)
    engine = AsyncLLM(engine_args, name, limits, args.log_stats_interval)
    try:
        await engine.start()
        app = build_app(ServingContext(engine, name), args.api_key, args.max_request_body_bytes)
        server = _Server(uvicorn.Config(app, host=args.host, port=args.port, lifespan="off",
                                        log_level=args.uvicorn_log_level,
                                        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S), engine)
        # uvicorn re-raises the signal it caught once it has shut down: let that be a no-op.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        _log_usage(args, name)
        await server.serve()
    finally:
        await engine.shutdown()


def _log_usage(args: argparse.Namespace, name: str) -> None:
    base = f"http://{args.host}:{args.port}"
    auth = ' -H "Authorization: Bearer $API_KEY"' if args.api_key else ""  # never log the key
    logger.info("serving %s on %s (OpenAI API at %s/v1). Try:\n  curl %s/v1/chat/completions "
                "-H 'Content-Type: application/json'%s -d '{\"model\": \"%s\", \"messages\": "
                "[{\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 32}'",
                name, base, base, base, auth, name)


def run_server(args: argparse.Namespace) -> None:
    """Blocks until the server is stopped by a signal. A signal during start-up exits 0 too."""
    from pagedlm.cli import engine_args_from

    def exit_during_startup(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, exit_during_startup)
    asyncio.run(serve(args, engine_args_from(args)))
