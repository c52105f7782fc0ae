"""A TP worker process: joins the group, builds its rank's ModelRunner, then runs what the
broadcast ring brings (steps, calls) until told to stop or its parent is gone. Rank 0 sends each
step's output and each call's result to the executor; every rank reads its own outputs (the
runner records the sampled tokens into its rows only once read). A step's output is sent once the
device has finished it, found by polling while the worker waits on the ring, so the worker never
blocks on the device: the next step's message is read, and its inputs prepared, while the one
before still runs (a blocking read there left the device idle for that preparation)."""

from __future__ import annotations

import os
import pickle
import traceback
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import zmq

from pagedlm import envs
from pagedlm.config import EngineConfig
from pagedlm.core.sched_output import GrammarBitmask
from pagedlm.distributed.shm_broadcast import BroadcastHandle, BroadcastReader

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner


class ParentGone(Exception):
    pass


def worker_main(
    config: EngineConfig,
    rank: int,
    size: int,
    init_method: str,
    handle: BroadcastHandle,
    results_path: str,
) -> None:
    parent = os.getppid()
    ctx = zmq.Context()
    results = ctx.socket(zmq.PUSH)
    results.connect(results_path)
    try:
        index = 0 if envs.PAGEDLM_TP_ONE_DEVICE else rank
        runner = start_runner(config, rank, size, init_method, index)
        reader = BroadcastReader(handle, rank)
        _send(results, ("ready", runner.determine_num_blocks()), rank)
        WorkerLoop(runner, reader, results, rank, parent).run()
    except ParentGone:
        pass
    except BaseException as exc:  # reported, then this process exits non-zero
        message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        results.send(pickle.dumps(("error", rank, message)))
        results.close(linger=2000)
        os._exit(1)
    results.close(linger=1000)
    ctx.term()


def start_runner(
    config: EngineConfig, rank: int, size: int, init_method: str, device_index: int
) -> ModelRunner:
    """This rank's runner, its model loaded, in the TP group (also the Ray executor's actors)."""
    import torch

    from pagedlm.distributed.parallel_state import init_tp_group
    from pagedlm.worker.model_runner import ModelRunner

    if config.device.type == "cuda":
        torch.cuda.set_device(device_index)
        config = replace(config, device=torch.device("cuda", device_index))
    else:  # the host's cores shared between the ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    init_tp_group(rank, size, config.device, init_method)
    runner = ModelRunner(config)
    runner.load_model()
    return runner


def stage_grammar(runner: ModelRunner, grammar: GrammarBitmask | None) -> GrammarBitmask | None:
    """The engine core's filled bitmask rows copied into this rank's pinned ones."""
    if grammar is None:
        return None
    num_rows, num_words = grammar.bitmask.shape
    rows = runner.grammar_bitmask(num_words)
    staged = GrammarBitmask(rows.logits_rows[:num_rows], rows.bitmask[:num_rows])
    staged.logits_rows[:] = grammar.logits_rows
    staged.bitmask[:] = grammar.bitmask
    return staged


def run_call(runner: ModelRunner, method: str, args: tuple) -> tuple[str, Any]:
    """A call's ("result", value), or ("raise", error) when an RPC's caller erred (bad
    arguments: the worker goes on); any other error propagates (the worker fails)."""
    from pagedlm.worker.rpc import call_worker_method

    if method != "rpc":
        return "result", getattr(runner, method)(*args)
    name, rpc_args, rpc_kwargs = args
    try:
        return "result", call_worker_method(runner, name, rpc_args, rpc_kwargs)
    except Exception as exc:
        return "raise", exc


def _send(results: zmq.Socket, message: tuple, rank: int) -> None:
    if rank == 0:
        results.send(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


class WorkerLoop:
    def __init__(
        self, runner: Any, reader: BroadcastReader, results: zmq.Socket, rank: int, parent: int
    ) -> None:
        self.runner, self.reader, self.results, self.rank = runner, reader, results, rank
        self.parent = parent
        self.pending: deque = deque()  # launched steps whose output is not sent yet, oldest first

    def run(self) -> None:
        while True:
            message = self.reader.dequeue(None, self._poll)
            if message[0] == "shutdown":
                self._flush()
                return
            if message[0] == "execute_forward":
                self.runner.execute_forward(message[1])
            elif message[0] == "sample_tokens":
                grammar = stage_grammar(self.runner, message[1])
                self.pending.append(self.runner.sample_tokens(grammar))
                self._send_done()
            else:
                self._flush()
                _send(self.results, run_call(self.runner, *message[1:]), self.rank)

    def _poll(self) -> None:
        """While waiting on the ring: the parent still there, the finished steps' outputs sent."""
        if os.getppid() != self.parent:
            raise ParentGone
        self._send_done()

    def _send_done(self) -> None:
        """The outputs of the oldest steps the device has finished (a CPU step is, once launched)."""
        while self.pending and self.pending[0].is_done():
            self._send_output(self.pending.popleft())

    def _flush(self) -> None:
        """Every launched step's output, waiting for the device (before a call or shutdown)."""
        while self.pending:
            self._send_output(self.pending.popleft())

    def _send_output(self, pending: Any) -> None:
        _send(self.results, ("output", pending.get_output()), self.rank)


if __name__ == "__main__":
    import sys

    worker_main(*pickle.load(sys.stdin.buffer))
