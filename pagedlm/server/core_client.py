"""The front end's end of one engine-core process (core_process.py): the process, the socket its
inputs go out on, the socket its outputs come in on, and its heartbeat. At data_parallel_size N
the front end holds N of them, one per dp rank, each with sockets of its own."""

from __future__ import annotations

import asyncio
import multiprocessing
import os

import zmq
import zmq.asyncio

from pagedlm.config import EngineArgs, EngineConfig
from pagedlm.engine import wire
from pagedlm.engine.core_process import CoreAddresses, run_core
from pagedlm.engine.heartbeat import HeartbeatMonitor

_EXIT_POLL_S = 0.5  # while waiting for the first message: how often the process is checked


class CoreGone(RuntimeError):
    """The core's input socket has no reader: its process is gone."""


class CoreClient:
    def __init__(self, rank: int, ipc_dir: str, ctx: zmq.Context, actx: zmq.asyncio.Context):
        self.rank = rank
        self.addresses = CoreAddresses(
            *(f"ipc://{ipc_dir}/{name}-{rank}" for name in ("input", "output", "heartbeat"))
        )
        self._input = ctx.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)
        self._input.bind(self.addresses.input)
        self.heartbeat = HeartbeatMonitor(ctx, self.addresses.heartbeat)
        self.output = actx.socket(zmq.PULL)
        self.output.setsockopt(zmq.RCVHWM, 0)
        self.output.bind(self.addresses.output)
        self.proc: multiprocessing.process.BaseProcess | None = None  # set by start()

    def start(self, source: EngineConfig | EngineArgs, size: int) -> None:
        """Starts the process of dp rank `self.rank` of `size` (data_parallel_size)."""
        self.proc = multiprocessing.get_context("spawn").Process(
            target=run_core,
            name=f"pagedlm-engine-core-{self.rank}" if size > 1 else "pagedlm-engine-core",
            daemon=True,
            args=(source, self.addresses, os.getpid(), self.rank),
        )
        self.proc.start()

    def send(self, data: bytes) -> None:
        """Never blocks (no send limit); raises CoreGone."""
        try:
            self._input.send(data, flags=zmq.NOBLOCK)
        except zmq.Again:
            raise CoreGone("its input socket has no reader (the process is gone)") from None

    async def first_message(self) -> wire.FromCore | None:
        """The core's first message (Ready or Dead); None if its process exits first."""
        recv = asyncio.ensure_future(self.output.recv())
        while not recv.done():
            await asyncio.wait([recv], timeout=_EXIT_POLL_S)
            if not recv.done() and not self.proc.is_alive():
                recv.cancel()
                return None
        return wire.from_core_decoder().decode(recv.result())

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def join(self, timeout_s: float | None = None) -> None:
        if self.proc is not None:
            self.proc.join(timeout_s)

    def kill(self) -> None:
        if self.is_alive():
            self.proc.kill()

    def close(self) -> None:
        self.heartbeat.close()
        self._input.close(linger=0)
        self.output.close(linger=0)
