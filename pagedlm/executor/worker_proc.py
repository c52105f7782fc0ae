"""A TP worker process: joins the group, builds its rank's ModelRunner, then runs what the
broadcast ring brings (steps, calls) until told to stop or its parent is gone. Rank 0 sends each
step's output and each call's result to the executor; every rank reads its own outputs (the
runner records the sampled tokens into its rows only once read). On CUDA one step's output waits
while the next step launches, so the device never idles on the ring."""

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
from pagedlm.distributed.shm_broadcast import BroadcastHandle, BroadcastReader, Timeout

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner

_NEXT_STEP_WAIT_S = 1e-3  # CUDA: how long a launched step's output waits for the next step


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
    staged = GrammarBitmask(rows.sample_indices[:num_rows], rows.bitmask[:num_rows])
    staged.sample_indices[:] = grammar.sample_indices
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
        self.pending: deque = deque()  # launched steps whose output is not sent yet
        self.keep_pending = 1 if runner.use_cuda else 0  # a CPU step is done once launched

    def run(self) -> None:
        while True:
            try:
                message = self.reader.dequeue(
                    _NEXT_STEP_WAIT_S if self.pending else None, self._check_parent
                )
            except Timeout:
                self._flush(0)
                continue
            if message[0] == "shutdown":
                self._flush(0)
                return
            if message[0] == "execute_forward":
                self.runner.execute_forward(message[1])
            elif message[0] == "sample_tokens":
                grammar = stage_grammar(self.runner, message[1])
                self.pending.append(self.runner.sample_tokens(grammar))
                self._flush(self.keep_pending)
            else:
                self._flush(0)
                _send(self.results, run_call(self.runner, *message[1:]), self.rank)

    def _flush(self, keep: int) -> None:
        while len(self.pending) > keep:
            output = self.pending.popleft().get_output()
            _send(self.results, ("output", output), self.rank)

    def _check_parent(self) -> None:
        if os.getppid() != self.parent:
            raise ParentGone


if __name__ == "__main__":
    import sys

    worker_main(*pickle.load(sys.stdin.buffer))
