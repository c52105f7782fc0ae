"""The engine core's heartbeat: a thread in the core process sends an empty message every
HEARTBEAT_INTERVAL_S on a socket of its own, so the front end sees the process run even while one
step takes long; a stopped process (SIGSTOP) or one stuck holding the GIL stops beating. A beat
carries the time it was sent (time.monotonic(): one clock for every process of the machine), so a
beat the front end reads late, its event loop busy, still dates the core's last sign of life."""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass

import zmq

HEARTBEAT_INTERVAL_S = 0.5
_BEAT = struct.Struct("d")  # when the beat was sent


@dataclass(frozen=True)
class HeartbeatTimeouts:
    """How long the front end waits for a beat before /health turns 503 (`unhealthy_s`; new
    requests get 503 too, those in flight wait), and before it declares the core dead (`dead_s`)."""

    unhealthy_s: float = 5.0
    dead_s: float = 30.0

    def __post_init__(self) -> None:
        if self.unhealthy_s < 2 * HEARTBEAT_INTERVAL_S:
            raise ValueError(
                f"--heartbeat-timeout must be at least {2 * HEARTBEAT_INTERVAL_S:g} s "
                f"(twice the beat interval), got {self.unhealthy_s:g}"
            )
        if self.dead_s < self.unhealthy_s:
            raise ValueError(
                f"--stall-timeout must be at least --heartbeat-timeout "
                f"({self.unhealthy_s:g} s), got {self.dead_s:g}"
            )


def _conflated(ctx: zmq.Context, kind: int) -> zmq.Socket:
    """A socket that keeps only its newest message: a beat is news only as the latest one."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.CONFLATE, 1)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


class HeartbeatSender:
    """In the core process; stop() before the context is terminated."""

    def __init__(self, ctx: zmq.Context, addr: str) -> None:
        self._ctx = ctx
        self._addr = addr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pagedlm-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        sock = _conflated(self._ctx, zmq.PUSH)  # a zmq socket belongs to the thread using it
        sock.connect(self._addr)
        try:
            while True:
                try:
                    sock.send(_BEAT.pack(time.monotonic()), flags=zmq.NOBLOCK)
                except zmq.Again:  # the front end is not connected yet (or gone)
                    pass
                if self._stop.wait(HEARTBEAT_INTERVAL_S):
                    return
        finally:
            sock.close()


class HeartbeatMonitor:
    """In the front end: binds the heartbeat socket, tells how long the core has been silent."""

    def __init__(self, ctx: zmq.Context, addr: str) -> None:
        self._sock = _conflated(ctx, zmq.PULL)
        self._sock.bind(addr)
        self._last_beat = time.monotonic()

    def restart(self) -> None:
        """From now on the core is expected to beat (it just said it is ready)."""
        self._last_beat = time.monotonic()

    def silent_s(self) -> float:
        """Seconds since the newest beat."""
        if self._sock.poll(0):
            (sent,) = _BEAT.unpack(self._sock.recv())
            self._last_beat = max(self._last_beat, sent)
        return time.monotonic() - self._last_beat

    def close(self) -> None:
        self._sock.close()
