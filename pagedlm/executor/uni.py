"""UniExecutor: the model runs in this process (tp = 1's "uni", and each rank of an
"external_launcher" group). The step calls are the ModelRunner's own bound methods, so the
engine core's step path costs nothing more than calling the runner directly."""

from __future__ import annotations

from typing import Any

from pagedlm.config import EngineConfig
from pagedlm.worker.model_runner import ModelRunner


class UniExecutor:
    failed: str | None = None  # an in-process runner's errors raise in the caller instead

    def __init__(self, config: EngineConfig) -> None:
        self.runner: ModelRunner | None = ModelRunner(config)
        self.runner.load_model()
        self.device = self.runner.device
        self.execute_forward = self.runner.execute_forward
        self.grammar_bitmask = self.runner.grammar_bitmask
        self.sample_tokens = self.runner.sample_tokens
        self.execute_model = self.runner.execute_model

    def determine_num_blocks(self) -> int:
        return self.runner.determine_num_blocks()

    def init_kv_cache(self, num_blocks: int) -> None:
        self.runner.init_kv_cache(num_blocks)

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
        """The runner dropped (its memory freed once nothing else holds it)."""
        if self.runner is None:
            return
        self.runner = None
        del self.execute_forward, self.grammar_bitmask, self.sample_tokens, self.execute_model
