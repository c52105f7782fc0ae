"""UniExecutor: the model runs in this process (tp = 1's "uni", and each rank of an
"external_launcher" group). Each call goes straight to the ModelRunner: no copy, no thread, one
Python call more than calling the runner (well under a microsecond a step)."""

from __future__ import annotations

from typing import Any

from pagedlm.config import EngineConfig
from pagedlm.core.sched_output import GrammarBitmask, SchedulerOutput
from pagedlm.worker.model_runner import ModelRunner
from pagedlm.worker.runner_output import AsyncRunnerOutput


class UniExecutor:
    failed: str | None = None  # an in-process runner's errors raise in the caller instead

    def __init__(self, config: EngineConfig) -> None:
        self.runner: ModelRunner | None = ModelRunner(config)
        self.runner.load_model()
        self.device = self.runner.device

    def determine_num_blocks(self) -> int:
        return self.runner.determine_num_blocks()

    def init_kv_cache(self, num_blocks: int) -> None:
        self.runner.init_kv_cache(num_blocks)

    def execute_forward(self, sched: SchedulerOutput) -> None:
        self.runner.execute_forward(sched)

    def grammar_bitmask(self, num_words: int) -> GrammarBitmask:
        return self.runner.grammar_bitmask(num_words)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> AsyncRunnerOutput:
        return self.runner.sample_tokens(grammar)

    def execute_model(self, sched: SchedulerOutput) -> AsyncRunnerOutput:
        return self.runner.execute_model(sched)

    def collective_rpc(
        self, method: str, args: tuple | list = (), kwargs: dict | None = None
    ) -> Any:
        from pagedlm.worker.rpc import call_worker_method

        return call_worker_method(self.runner, method, args, kwargs)

    def sleep(self, level: int, tags: set[str]) -> None:
        self.runner.sleep(level, tags)

    def wake_up(self, tags: set[str]) -> None:
        self.runner.wake_up(tags)

    def check_health(self) -> None:
        """In process: nothing can die without the caller seeing it."""

    def shutdown(self) -> None:
        """The runner dropped (its memory freed once nothing else holds it); idempotent."""
        self.runner = None
