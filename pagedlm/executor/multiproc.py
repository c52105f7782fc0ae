"""MultiprocExecutor: one worker process per TP rank on this host (vLLM's "mp" backend).

The engine core keeps its one scheduler; each step's SchedulerOutput goes to every worker through
the shared-memory broadcast ring (distributed/shm_broadcast.py), and rank 0 alone sends back each
step's ModelRunnerOutput (and each call's result) over one ZeroMQ PULL socket, in order. Steps stay
pipelined: execute_forward and sample_tokens (or execute_model, both) return at once, a
RemoteOutput's get_output() waits for that step's message only.

Faults: while waiting, the executor checks its workers; one that exited (a crash, a kill, a
failed start) ends the executor with one error naming the rank and its exit code, after every
other worker is stopped (killed past _JOIN_S). A worker reports its own exception before exiting.
A hung worker (alive, not answering: stopped, deadlocked) ends it too: no output of an awaited step
from rank 0, or no free chunk in the ring, for PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS; the error
names the ranks that have not read the ring's messages and the oldest they missed (a rank that
read them all waits in its peers' collectives), and every worker is killed. Calls (a weight
reload, sleep) may take long: they wait without that timeout.
Workers are fresh interpreters (`python -m pagedlm.executor.worker_proc`, arguments pickled on
stdin): multiprocessing's spawn would import the caller's __main__ again, and a forked child hangs
in its first OpenMP region when the parent's pool ran. They watch their parent and exit once it
is gone; the executor's finalizer (close(), garbage collection, interpreter exit) stops them.
"""

from __future__ import annotations

import logging
import pickle
import socket
import subprocess
import sys
import time
import uuid
import weakref
from collections import deque
from typing import Any

import zmq

from pagedlm import envs
from pagedlm.config import EngineConfig
from pagedlm.core.sched_output import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from pagedlm.distributed.shm_broadcast import BroadcastWriter, Timeout
from pagedlm.distributed.weight_shards import split_update_call
from pagedlm.executor.base import WorkerFailed
from pagedlm.worker.grammar_inputs import new_grammar_rows

logger = logging.getLogger(__name__)

_POLL_MS = 100  # between liveness checks while waiting on rank 0
_JOIN_S = 5.0


class RemoteOutput:
    """A step launched on the workers; get_output() waits for rank 0's output of it."""

    def __init__(self, executor: MultiprocExecutor, step_id: int) -> None:
        self._executor, self._step_id = executor, step_id
        self._result: ModelRunnerOutput | None = None

    def get_output(self) -> ModelRunnerOutput:
        if self._result is None:
            self._result = self._executor.wait_output(self._step_id)
        return self._result


class MultiprocExecutor:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.device
        self.runner = None  # every rank's runs in its worker process
        size = config.parallel.tensor_parallel_size
        self._ctx = zmq.Context()
        self._results = self._ctx.socket(zmq.PULL)
        results_path = f"ipc:///tmp/pagedlm-tp-{uuid.uuid4().hex[:12]}"
        self._results.bind(results_path)
        self._broadcast = BroadcastWriter(num_readers=size)
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self._procs: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(
            self, _stop, self._procs, self._broadcast, self._results, self._ctx
        )
        self._outputs: dict[int, ModelRunnerOutput] = {}  # rank 0's, arrived before asked for
        self._launched_step_id = 0  # the step between execute_forward and sample_tokens
        self.failed: str | None = None  # why the workers stopped; every later call raises it
        self._timeout = envs.PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS  # a step's, then it hung
        # the ring's messages written, newest last: (kind, step id or None for a call)
        self._sent: deque[tuple[str, int | None]] = deque(maxlen=self._broadcast.handle.num_chunks)
        for rank in range(size):
            args = (config, rank, size, init_method, self._broadcast.handle, results_path)
            self._procs.append(_start_worker(args))
        self.num_blocks = self._wait("ready")  # every rank loaded, KV size agreed (least)
        logger.info("tensor parallel: %d worker processes ready", size)

    # ---- the engine core's calls ----

    def load_model(self) -> None:
        """Loaded by every worker at start."""

    def determine_num_blocks(self) -> int:
        return self.num_blocks

    def init_kv_cache(self, num_blocks: int) -> None:
        self._call("init_kv_cache", num_blocks)

    def execute_model(self, sched: SchedulerOutput) -> RemoteOutput:
        self.execute_forward(sched)
        return self.sample_tokens(None)

    def execute_forward(self, sched: SchedulerOutput) -> None:
        """The step's forward on every rank; its sampling waits for sample_tokens (the runner's
        split: the engine core fills a constrained step's bitmask in between)."""
        self._enqueue_step(("execute_forward", sched), sched.step_id)
        self._launched_step_id = sched.step_id

    def grammar_bitmask(self, num_words: int) -> GrammarBitmask:
        """Host rows here (each rank copies the filled ones into its own pinned rows)."""
        return new_grammar_rows(self.config, num_words)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> RemoteOutput:
        self._enqueue_step(("sample_tokens", grammar), self._launched_step_id)
        return RemoteOutput(self, self._launched_step_id)

    def sleep(self, level: int, tags: set[str]) -> None:
        self._call("sleep", level, tags)

    def wake_up(self, tags: set[str]) -> None:
        self._call("wake_up", tags)

    def collective_rpc(
        self, method: str, args: tuple | list = (), kwargs: dict | None = None
    ) -> Any:
        """collective_rpc's method on every rank (pagedlm/worker/rpc.py); rank 0's result. A
        colocated trainer's tensors are sliced here, each rank sent its slices alone."""
        if method == "update_weights_from_tensor":
            size = self.config.parallel.tensor_parallel_size
            calls = split_update_call(args, kwargs, self.config.model, size)
            return self._call_each(method, [("call", "rpc", (method, *call)) for call in calls])
        return self._call("rpc", method, args, kwargs)

    def check_health(self) -> None:
        if any(proc.poll() is not None for proc in self._procs):
            self._fail(self._why([]))

    def shutdown(self) -> None:
        self._finalizer()

    # ---- waiting on rank 0 ----

    def wait_output(self, step_id: int) -> ModelRunnerOutput:
        if self.failed is not None:
            raise WorkerFailed(self.failed)
        while step_id not in self._outputs:
            self._wait("output", self._timeout)
        return self._outputs.pop(step_id)

    def _enqueue_step(self, message: tuple, step_id: int) -> None:
        if self.failed is not None:
            raise WorkerFailed(self.failed)
        try:
            self._broadcast.enqueue(message, self.check_health, self._timeout)
        except Timeout:
            self._fail_hung()
        self._sent.append((message[0], step_id))

    def _call(self, method: str, *args: Any) -> Any:
        if self.failed is not None:
            raise WorkerFailed(self.failed)
        self._broadcast.enqueue(("call", method, args), self.check_health)
        self._sent.append((args[0] if method == "rpc" else method, None))
        return self._wait("result")

    def _call_each(self, method: str, messages: list[tuple]) -> Any:
        """messages[rank] (each a call of `method`) to each rank alone; rank 0's result."""
        if self.failed is not None:
            raise WorkerFailed(self.failed)
        self._broadcast.enqueue_each(messages, self.check_health)
        self._sent.append((method, None))
        return self._wait("result")

    def _wait(self, kind: str, timeout: float | None = None) -> Any:
        """The next message of this kind from rank 0 (step outputs met on the way are kept);
        the workers hung once none came for `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while not self._results.poll(_POLL_MS):
                self.check_health()
                if deadline is not None and time.monotonic() > deadline:
                    self._fail_hung()
            message = pickle.loads(self._results.recv())
            tag = message[0]
            if tag == "output":
                self._outputs[message[1].step_id] = message[1]
                if kind == "output":
                    return None
            elif tag == "error":
                self._fail(self._why([message]))
            elif tag == "raise":  # a call's own error (bad arguments): the workers go on
                raise message[1]
            elif tag == kind:
                return message[1]

    def _why(self, reports: list[tuple]) -> str:
        """The workers that exited, then the error reports the ranks sent (those arriving within
        _POLL_MS more too): a dead rank is the cause, its peers' failed collectives follow."""
        while self._results.poll(_POLL_MS):
            message = pickle.loads(self._results.recv())
            if message[0] == "error":
                reports.append(message)
        exits = [
            f"TP worker rank {rank} (pid {proc.pid}) exited with code {proc.returncode}"
            for rank, proc in enumerate(self._procs)
            if proc.poll() is not None
        ]
        errors = [f"TP worker rank {rank} failed: {text}" for _, rank, text in sorted(reports)]
        return "; ".join(exits + errors)

    def _fail_hung(self) -> None:
        """Every worker killed (a stopped or deadlocked one would not stop when asked), then the
        error naming the ranks behind."""
        message = self._why_hung()
        for proc in self._procs:
            proc.kill()
            proc.wait()
        self._fail(message)

    def _why_hung(self) -> str:
        """The ranks furthest behind in the ring are the hung ones; the others read further and
        wait in a collective on them."""

        def what(unread: int) -> str:
            kind, step_id = self._sent[-unread]
            return f"the call {kind}" if step_id is None else f"{kind} of step {step_id}"

        unread = [self._broadcast.unread(rank) for rank in range(len(self._procs))]
        quiet = f"no answer for {self._timeout:g} s"
        most = max(unread)
        if most == 0:
            return (
                f"TP workers stopped answering ({quiet}): every rank read up to {what(1)}, "
                "rank 0 sent nothing since (a rank is stuck inside a step)"
            )
        hung = [
            f"TP worker rank {rank} (pid {self._procs[rank].pid}) stopped answering ({quiet}): "
            f"it has not read {what(most)}"
            for rank, count in enumerate(unread)
            if count == most
        ]
        waiting = [
            f"rank {rank} read up to {what(count + 1)} (it waits on them in a collective)"
            for rank, count in enumerate(unread)
            if count < most
        ]
        return "; ".join(hung + waiting)

    def _fail(self, message: str) -> None:
        if self.failed is None:
            logger.error("%s; stopping the other workers", message)
            self.failed = message
            self._finalizer()
        raise WorkerFailed(self.failed)


def _start_worker(args: tuple) -> subprocess.Popen:
    """A fresh interpreter running worker_proc (not multiprocessing's spawn, which would import
    the user's __main__ again), its arguments pickled on stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedlm.executor.worker_proc"], stdin=subprocess.PIPE
    )
    proc.stdin.write(pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL))
    proc.stdin.close()
    return proc


def _stop(procs: list, broadcast: BroadcastWriter, results: zmq.Socket, ctx: zmq.Context) -> None:
    """Every worker asked to stop (if the ring has room), given _JOIN_S, then killed."""
    if procs and all(p.poll() is None for p in procs):
        try:
            broadcast.enqueue(("shutdown",), _raise_if_any_exited(procs))
        except Exception:  # a worker gone: the rest are killed below
            pass
    for proc in procs:
        try:
            proc.wait(_JOIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    broadcast.close()
    results.close(linger=0)
    ctx.term()


def _raise_if_any_exited(procs: list):
    deadline = time.monotonic() + _JOIN_S

    def check() -> None:
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError("a worker exited or the ring stayed full")

    return check


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
