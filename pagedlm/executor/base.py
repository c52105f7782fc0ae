"""The one interface the engine core drives its model through, whichever executor runs it: in
process (UniExecutor) or in worker processes (MultiprocExecutor). The engine core never asks which.

A step is split in two (the ModelRunner's split): execute_forward launches the forward,
sample_tokens its sampling (the engine core fills a constrained step's grammar bitmask, from
grammar_bitmask's rows, in between) and returns at once; the pending output's get_output() waits
for that step's sampled tokens. `failed` says why the workers stopped (None while they run): every
later call raises WorkerFailed with it, and the engine core collects no step in flight then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pagedlm.core.sched_output import GrammarBitmask, ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    import torch

    from pagedlm.worker.model_runner import ModelRunner


class WorkerFailed(RuntimeError):
    """A TP worker died, raised or stopped answering: the executor (and the engine) cannot go on."""


class PendingOutput(Protocol):
    def get_output(self) -> ModelRunnerOutput: ...


@runtime_checkable
class Executor(Protocol):
    device: torch.device  # rank 0's
    failed: str | None
    runner: ModelRunner | None  # the in-process one (for inspection); None in worker processes

    def determine_num_blocks(self) -> int:
        """The KV cache's blocks every rank can hold (measured at start-up)."""

    def init_kv_cache(self, num_blocks: int) -> None: ...

    def execute_forward(self, sched: SchedulerOutput) -> None: ...

    def grammar_bitmask(self, num_words: int) -> GrammarBitmask: ...

    def sample_tokens(self, grammar: GrammarBitmask | None) -> PendingOutput: ...

    def execute_model(self, sched: SchedulerOutput) -> PendingOutput:
        """execute_forward then sample_tokens(None)."""

    def collective_rpc(
        self, method: str, args: tuple | list = (), kwargs: dict | None = None
    ) -> Any:
        """A registered worker method (pagedlm/worker/rpc.py) on every rank; rank 0's result."""

    def sleep(self, level: int, tags: set[str]) -> None: ...

    def wake_up(self, tags: set[str]) -> None: ...

    def check_health(self) -> None:
        """Raises WorkerFailed once a worker died or stopped answering (sets `failed`)."""

    def shutdown(self) -> None:
        """Every worker stopped and all they hold freed; idempotent."""
