"""One writer, n readers on this host: a ring of fixed-size chunks in shared memory
(multiprocessing.shared_memory), each chunk a small header then a pickled message. Messages larger
than a chunk, and messages of one reader's own (enqueue_each: a TP rank's weight slices), go over
ZeroMQ (one PUSH socket per reader), the header saying so, so order holds.

Chunk header: byte 0 `written`, bytes 1..n one `read` flag per reader, then at offset 8 + n... the
payload size (u64; OVERSIZE: the payload is the reader's next ZeroMQ message). The writer takes a
chunk once it was never written or every reader has read it; it clears `written`, then the read
flags, writes the payload and size, and sets `written` last. A reader takes its next chunk once
`written` is set and its flag is not, then sets its flag. Waiting spins briefly, sleeps in the
shortest steps for its first 50 ms (a serving engine's next message comes within a step's host
time, milliseconds: a 1 ms sleep there delayed every step), then in doubling steps up to 1 ms
(idle workers cost the host next to nothing; the 2-core CI machine runs them beside the engine). A lock's acquire / release around the flag writes orders the stores on
weakly ordered CPUs (x86 keeps store order anyway).
"""

from __future__ import annotations

import pickle
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import zmq

OVERSIZE = (1 << 64) - 1
_SPINS = 64
_MIN_SLEEP = 1e-5
_MAX_SLEEP = 1e-3
_HOT_S = 0.05  # how long a wait sleeps in the shortest steps before backing off
_fence_lock = threading.Lock()


def _fence() -> None:
    with _fence_lock:
        pass


@dataclass(frozen=True)
class BroadcastHandle:
    """What a reader needs to attach (picklable: it goes to spawned worker processes)."""

    shm_name: str
    num_readers: int
    num_chunks: int
    chunk_bytes: int
    zmq_paths: tuple[str, ...]  # one ipc endpoint per reader

    @property
    def header_bytes(self) -> int:
        return 8 + self.num_readers + 8

    @property
    def stride(self) -> int:
        return self.header_bytes + self.chunk_bytes


class Timeout(Exception):
    """dequeue(timeout) found no message in time, or enqueue(timeout) no free chunk."""


class BroadcastWriter:
    def __init__(self, num_readers: int, num_chunks: int = 8, chunk_bytes: int = 1 << 20) -> None:
        tag = uuid.uuid4().hex[:12]
        paths = tuple(f"ipc:///tmp/pagedlm-bc-{tag}-{i}" for i in range(num_readers))
        probe = BroadcastHandle("", num_readers, num_chunks, chunk_bytes, paths)
        self._shm = shared_memory.SharedMemory(create=True, size=num_chunks * probe.stride)
        self._shm.buf[:] = bytes(len(self._shm.buf))
        self.handle = BroadcastHandle(self._shm.name, num_readers, num_chunks, chunk_bytes, paths)
        self._ctx = zmq.Context()
        self._sockets = []
        for path in paths:
            sock = self._ctx.socket(zmq.PUSH)
            sock.bind(path)
            self._sockets.append(sock)
        self._index = 0
        self.sent_bytes = [0] * num_readers  # each reader's message bytes so far

    def enqueue(
        self, obj: Any, alive: Callable[[], None] | None = None, timeout: float | None = None
    ) -> None:
        """Writes obj for every reader; waits for a free chunk (alive() is called while waiting,
        to raise when a reader died; Timeout after `timeout` seconds without one)."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        fits = len(data) <= self.handle.chunk_bytes
        self._write(data if fits else [data] * self.handle.num_readers, alive, timeout)

    def enqueue_each(self, objs: list[Any], alive: Callable[[], None] | None = None) -> None:
        """objs[i] for reader i alone, in the ring's order: each goes through its reader's
        socket, so a reader receives its own message's bytes and never another's."""
        assert len(objs) == self.handle.num_readers, "one message per reader"
        payload = [pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) for obj in objs]
        self._write(payload, alive, None)

    def unread(self, reader: int) -> int:
        """How many of the messages in the ring this reader has not read yet."""
        h, buf = self.handle, self._shm.buf
        bases = range(0, h.num_chunks * h.stride, h.stride)
        return sum(buf[base] == 1 and buf[base + 1 + reader] == 0 for base in bases)

    def _write(
        self, payload: bytes | list[bytes], alive: Callable[[], None] | None, timeout: float | None
    ) -> None:
        """payload: bytes in the chunk for every reader, or one message per reader's socket."""
        h, buf = self.handle, self._shm.buf
        base = self._index * h.stride
        flags = slice(base + 1, base + 1 + h.num_readers)
        _wait(lambda: buf[base] == 0 or all(buf[flags]), alive, timeout)
        buf[base] = 0
        _fence()
        buf[flags] = bytes(h.num_readers)
        size_at = base + 8 + h.num_readers
        if isinstance(payload, bytes):
            buf[size_at + 8 : size_at + 8 + len(payload)] = payload
            struct.pack_into("<Q", buf, size_at, len(payload))
        else:
            for sock, data in zip(self._sockets, payload):
                sock.send(data, copy=False)
            struct.pack_into("<Q", buf, size_at, OVERSIZE)
        for reader in range(h.num_readers):
            self.sent_bytes[reader] += len(
                payload if isinstance(payload, bytes) else payload[reader]
            )
        _fence()
        buf[base] = 1
        self._index = (self._index + 1) % h.num_chunks

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._ctx.term()
        self._shm.close()
        self._shm.unlink()


class BroadcastReader:
    def __init__(self, handle: BroadcastHandle, reader: int) -> None:
        self.handle, self.reader = handle, reader
        # the writer owns the segment: attaching must not register it with this process's
        # resource tracker, which would unlink it when this process exits
        register = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            self._shm = shared_memory.SharedMemory(name=handle.shm_name)
        finally:
            resource_tracker.register = register
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.connect(handle.zmq_paths[reader])
        self._index = 0

    def dequeue(self, timeout: float | None = None, alive: Callable[[], None] | None = None) -> Any:
        """The next message; Timeout after `timeout` seconds without one (None: wait on)."""
        h, buf = self.handle, self._shm.buf
        base = self._index * h.stride
        flag = base + 1 + self.reader
        _wait(lambda: buf[base] == 1 and buf[flag] == 0, alive, timeout)
        _fence()
        size_at = base + 8 + h.num_readers
        (size,) = struct.unpack_from("<Q", buf, size_at)
        if size == OVERSIZE:
            data = self._sock.recv(copy=True)
        else:
            data = bytes(buf[size_at + 8 : size_at + 8 + size])
        _fence()
        buf[flag] = 1
        self._index = (self._index + 1) % h.num_chunks
        return pickle.loads(data)

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
        self._shm.close()


def _wait(
    ready: Callable[[], bool],
    alive: Callable[[], None] | None,
    timeout: float | None = None,
) -> None:
    for _ in range(_SPINS):
        if ready():
            return
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    pause = _MIN_SLEEP
    while not ready():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise Timeout
        if alive is not None:
            alive()
        time.sleep(pause)
        if now - start >= _HOT_S:
            pause = min(pause * 2, _MAX_SLEEP)
