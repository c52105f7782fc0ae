"""The TP worker's loop (executor/worker_proc.py) over a fake runner and ring: a step's output is
sent once the device finished it, found while the worker waits for its next message, never by
blocking on it; the next step is launched while the one before still runs; a call or shutdown
first sends every launched step's output, in order."""

from __future__ import annotations

import os
import pickle
from collections import deque

from pagedlm.executor.worker_proc import WorkerLoop


class FakeStep:
    """A launched step; `done` is the device's progress, which get_output must not outrun."""

    def __init__(self, step_id: int, log: list) -> None:
        self.step_id, self.done, self.log = step_id, False, log

    def is_done(self) -> bool:
        return self.done

    def get_output(self) -> str:
        self.log.append(("read", self.step_id, self.done))
        return f"out{self.step_id}"


class FakeRunner:
    def __init__(self, log: list) -> None:
        self.log, self.steps = log, []

    def execute_forward(self, step_id: int) -> None:
        self.log.append(("forward", step_id))

    def sample_tokens(self, grammar: None) -> FakeStep:
        step = FakeStep(len(self.steps), self.log)
        self.steps.append(step)
        return step

    def ping(self) -> str:
        return "pong"


class FakeReader:
    """Hands out the messages; before each, `polls` calls of the loop's wait callback, then the
    message's `before` hook (the device finishing steps meanwhile)."""

    def __init__(self, script: list) -> None:
        self.script = deque(script)

    def dequeue(self, timeout, alive):
        message, before, polls = self.script.popleft()
        for _ in range(polls):
            alive()
        before()
        alive()
        return message


class FakeSocket:
    def __init__(self, log: list) -> None:
        self.log = log

    def send(self, data: bytes) -> None:
        self.log.append(("sent", pickle.loads(data)))


def _run(script_of) -> list:
    log: list = []
    runner = FakeRunner(log)
    reader = FakeReader(script_of(runner))
    WorkerLoop(runner, reader, FakeSocket(log), 0, os.getppid()).run()
    return log


def _nothing() -> None:
    pass


def test_an_unfinished_step_is_never_waited_for_before_the_next_one_launches() -> None:
    def finish(runner, i):
        def hook() -> None:
            runner.steps[i].done = True

        return hook

    log = _run(
        lambda runner: [
            (("execute_forward", 0), _nothing, 2),
            (("sample_tokens", None), _nothing, 0),
            (("execute_forward", 1), _nothing, 3),  # step 0 still running
            (("sample_tokens", None), finish(runner, 0), 0),
            (("execute_forward", 2), finish(runner, 1), 5),
            (("sample_tokens", None), _nothing, 0),
            (("shutdown",), _nothing, 0),
        ]
    )
    assert [entry for entry in log if entry[0] == "read"] == [
        ("read", 0, True),
        ("read", 1, True),
        ("read", 2, False),  # shutdown: the last step's output waits for the device
    ]
    assert log.index(("forward", 1)) < log.index(("read", 0, True))
    assert log.index(("read", 1, True)) < log.index(("forward", 2))  # sent while waiting
    assert [entry[1] for entry in log if entry[0] == "sent"] == [
        ("output", "out0"),
        ("output", "out1"),
        ("output", "out2"),
    ]


def test_a_call_sends_every_launched_steps_output_first() -> None:
    log = _run(
        lambda runner: [
            (("execute_forward", 0), _nothing, 0),
            (("sample_tokens", None), _nothing, 0),
            (("call", "ping", ()), _nothing, 1),
            (("shutdown",), _nothing, 0),
        ]
    )
    sent = [entry[1] for entry in log if entry[0] == "sent"]
    assert sent == [("output", "out0"), ("result", "pong")]
