"""Where the engine core's model runs: in process ("uni": the ModelRunner itself) or one worker
process per TP rank ("mp": MultiprocExecutor). Both take the same calls from the core."""

from __future__ import annotations

from typing import Any

from pagedlm.config import EngineConfig


def make_executor(config: EngineConfig) -> Any:
    """A started executor: its model loaded (every rank's, for "mp")."""
    if config.parallel.distributed_executor_backend == "mp":
        from pagedlm.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config)
    from pagedlm.worker.model_runner import ModelRunner

    runner = ModelRunner(config)
    runner.load_model()
    return runner
