"""`pagedlm serve`: bind the port, start the engine core, then uvicorn on that socket.

Life cycle: the first SIGTERM/SIGINT drains (new requests and /health get 503, those in flight run
to completion for up to --shutdown-timeout, then the rest are aborted) and exits 0; a second one
aborts what is in flight and exits at once. A dead engine core ends the server with exit code 1
once its requests have had their error, for a supervisor (systemd, Kubernetes) to restart it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import socket
from pathlib import Path
from types import FrameType

import uvicorn

from pagedlm.config import EngineArgs, default_model_path
from pagedlm.engine.heartbeat import HeartbeatTimeouts
from pagedlm.logger import configure_logging
from pagedlm.server.api_server import build_app
from pagedlm.server.async_engine import AdmissionLimits, AsyncLLM
from pagedlm.server.serving import ServingContext

logger = logging.getLogger("pagedlm.server")

CLOSE_CONNECTIONS_S = 5  # once uvicorn stops: for the responses' last bytes
POLL_PATHS = frozenset({"/health", "/metrics"})


class _Server(uvicorn.Server):
    """uvicorn's server with the life cycle of the module's docstring."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, shutdown_timeout_s: float) -> None:
        super().__init__(config)
        self._engine = engine
        self._shutdown_timeout_s = shutdown_timeout_s
        self._loop = asyncio.get_running_loop()
        self._drain: asyncio.Task | None = None
        self.exit_code = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's signal handler. It may run between any two bytecodes of the loop's thread,
        so it only schedules."""
        self._loop.call_soon_threadsafe(self._on_signal, signal.Signals(sig).name)

    def _on_signal(self, name: str) -> None:
        in_flight = self._engine.num_requests_in_flight
        if self._drain is None:
            logger.info(
                "%s: draining: new requests get 503, the %d in flight may run for %g s "
                "(--shutdown-timeout); a second signal exits at once",
                name,
                in_flight,
                self._shutdown_timeout_s,
            )
            self._drain = asyncio.create_task(self._drain_then_exit())
            return
        logger.warning("%s again: aborting the %d requests in flight, exiting now", name, in_flight)
        self._engine.abort_all()
        self.should_exit = self.force_exit = True

    async def _drain_then_exit(self) -> None:
        self._engine.stop_accepting()
        if not await self._engine.drain(self._shutdown_timeout_s):
            logger.warning(
                "--shutdown-timeout passed: aborting the %d requests still in flight",
                self._engine.num_requests_in_flight,
            )
            self._engine.abort_all()
        self.should_exit = True

    async def exit_when_the_core_dies(self) -> None:
        error = await self._engine.wait_until_dead()
        logger.error(
            "exiting with code 1 (for a supervisor to restart the server): the engine "
            "core died: %s",
            error,
        )
        self.exit_code = 1
        self.should_exit = True


class _HidePolls(logging.Filter):
    """uvicorn's access log without /health and /metrics (probes and scrapes every few seconds
    would drown the requests), unless it logs at debug level."""

    def __init__(self, access_logger: logging.Logger) -> None:
        super().__init__()
        self._logger = access_logger

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's access record: (client, method, path with query, HTTP version, status)
        args = record.args if isinstance(record.args, tuple) else ()
        path = str(args[2]).split("?", 1)[0] if len(args) > 2 else ""
        return path not in POLL_PATHS or self._logger.isEnabledFor(logging.DEBUG)


def served_model_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    return args.model or Path(default_model_path()).name


def bind_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound but not listening (connections are refused until uvicorn
    serves): a port in use fails here, before the model loads."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own bind
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port} (--host, --port): {exc.strerror}"
        ) from None
    return sock


async def serve(
    args: argparse.Namespace,
    engine_args: EngineArgs,
    sock: socket.socket,
    heartbeat: HeartbeatTimeouts,
) -> int:
    """Serves until a signal or the core's death; the exit code. The core process starts at once
    and builds the engine config from `engine_args`, while this process builds the same config
    (one GGUF parse each instead of one after the other)."""
    name = served_model_name(args)
    limits = AdmissionLimits(args.max_num_queued_reqs, args.max_num_queued_tokens)
    engine = AsyncLLM(engine_args, name, limits, args.log_stats_interval, heartbeat)
    try:
        await engine.start()
        tool_parser = args.tool_call_parser if args.enable_auto_tool_choice else None
        app = build_app(
            ServingContext(engine, name, tool_parser, args.reasoning_parser),
            args.api_key,
            args.max_request_body_bytes,
            dev_endpoints=args.enable_dev_endpoints,
        )
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level=args.uvicorn_log_level,
            timeout_graceful_shutdown=CLOSE_CONNECTIONS_S,
        )
        access_logger = logging.getLogger("uvicorn.access")  # configured by uvicorn.Config
        access_logger.addFilter(_HidePolls(access_logger))
        server = _Server(config, engine, args.shutdown_timeout)
        freeze_start_up_objects()
        watch = asyncio.create_task(server.exit_when_the_core_dies())
        _log_usage(args, name)
        await server.serve(sockets=[sock])
        watch.cancel()
        if server.force_exit:  # a second signal: no waiting for the core either
            engine.kill_core()
        return server.exit_code
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # while stopping: a signal hurries the core
            signal.signal(sig, lambda *_: engine.kill_core())
        await engine.shutdown()


def freeze_start_up_objects() -> None:
    """Start-up leaves ~360k objects (torch, the tokenizer, the app) that garbage collection
    would walk in every full collection while serving: 0.4-0.9 s with the event loop stopped,
    every stream's tokens held back meanwhile (benchmarks/fake_core_serve.py logs them). Frozen,
    a collection walks only what serving made (as the engine core does, engine_core.py)."""
    gc.collect()
    gc.freeze()


def _log_usage(args: argparse.Namespace, name: str) -> None:
    base = f"http://{args.host}:{args.port}"
    auth = ' -H "Authorization: Bearer $API_KEY"' if args.api_key else ""  # never log the key
    logger.info(
        "serving %s on %s (OpenAI API at %s/v1). Try:\n  curl %s/v1/chat/completions "
        '-H \'Content-Type: application/json\'%s -d \'{"model": "%s", "messages": '
        '[{"role": "user", "content": "Hello!"}], "max_tokens": 32}\'',
        name,
        base,
        base,
        base,
        auth,
        name,
    )


def run_server(args: argparse.Namespace) -> None:
    """Blocks until the server stops; exits with its code. A signal during start-up exits 0."""
    configure_logging()
    heartbeat = HeartbeatTimeouts(args.heartbeat_timeout, args.stall_timeout)
    engine_args = EngineArgs.from_cli_args(args)
    sock = bind_socket(args.host, args.port)

    def exit_during_startup(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, exit_during_startup)
    exit_code = asyncio.run(serve(args, engine_args, sock, heartbeat))
    if exit_code:
        raise SystemExit(exit_code)
