"""RayExecutor: one Ray actor per TP rank, on any host of a Ray cluster (distributed_executor_backend
"ray"; `pip install pagedlm[ray]`).

The engine core keeps its one scheduler; each step is one actor call per rank (Ray carries the
SchedulerOutput, put in the object store once per step): execute_forward, then sample_tokens, whose
call returns the step's output (rank 0's; the other ranks read theirs and return None). Ray runs one
caller's calls to an actor in order, so the steps stay in order and the engine core keeps two in
flight. The ranks form their torch.distributed group (NCCL on GPUs, gloo on CPUs) at rank 0's host
address. On CUDA each actor takes one GPU (Ray sets its CUDA_VISIBLE_DEVICES: the actor's device
0); on the CPU one CPU; the ranks' bundles form one placement group packed onto as few hosts as
hold them (TP's all-reduces are fastest within a host).

Start: this process joins the cluster `ray start` made (RAY_ADDRESS, or the local one), or starts
a local Ray if there is none (ray.init()); a caller may call ray.init itself first. Faults: an actor
that died or raised ends the executor with WorkerFailed naming its rank; a step's output not back
within PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS names the ranks that have not finished it. Shutdown
kills the actors.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from pagedlm import envs
from pagedlm.config import EngineConfig
from pagedlm.core.sched_output import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from pagedlm.distributed.weight_shards import split_update_call
from pagedlm.executor.base import WorkerFailed
from pagedlm.worker.grammar_inputs import new_grammar_rows

logger = logging.getLogger(__name__)

_PLACEMENT_TIMEOUT_S = 60.0  # for the cluster to hold one bundle per rank


class RankActor:
    """One TP rank inside a Ray actor (made remote by RayExecutor)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.runner = None

    def address(self) -> str:
        """A tcp:// address on this actor's host for the group's rendezvous (rank 0's)."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def start(self, config: EngineConfig, init_method: str) -> int:
        from pagedlm.executor.worker_proc import start_runner

        self.runner = start_runner(config, self.rank, self.size, init_method, device_index=0)
        return self.runner.determine_num_blocks()

    def execute_forward(self, sched: SchedulerOutput) -> None:
        self.runner.execute_forward(sched)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> ModelRunnerOutput | None:
        from pagedlm.executor.worker_proc import stage_grammar

        output = self.runner.sample_tokens(stage_grammar(self.runner, grammar)).get_output()
        return output if self.rank == 0 else None

    def call(self, method: str, args: tuple) -> tuple[str, Any]:
        from pagedlm.executor.worker_proc import run_call

        return run_call(self.runner, method, args)


class RayOutput:
    """A step launched on the actors; get_output() waits for it: its forward's calls too (so a
    rank's error in either surfaces), refs [execute_forward per rank, sample_tokens per rank]."""

    def __init__(self, executor: RayExecutor, refs: list, step_id: int) -> None:
        self._executor, self._refs, self._step_id = executor, refs, step_id
        self._result: ModelRunnerOutput | None = None

    def get_output(self) -> ModelRunnerOutput:
        if self._result is None:
            executor = self._executor
            results = executor.get(self._refs, f"step {self._step_id}", executor.step_timeout)
            self._result = results[len(results) // 2]  # rank 0's sample_tokens
        return self._result


class RayExecutor:
    def __init__(self, config: EngineConfig) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init()
        self.config, self.device, self.runner = config, config.device, None
        self.failed: str | None = None
        self.step_timeout = envs.PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS
        size = config.parallel.tensor_parallel_size
        on_gpus = config.device.type == "cuda"
        self._group = _placement_group(size, {"GPU": 1} if on_gpus else {"CPU": 1})
        actor = ray.remote(RankActor)
        self._actors = [
            actor.options(
                num_cpus=0 if on_gpus else 1,
                num_gpus=1 if on_gpus else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, rank),
            ).remote(rank, size)
            for rank in range(size)
        ]
        self._forward_refs: list = []  # the launched step's execute_forward calls
        self._launched_step_id = 0
        init_method = self.get([self._actors[0].address.remote()], "start-up")[0]
        starts = [a.start.remote(config, init_method) for a in self._actors]
        self.num_blocks = self.get(starts, "start-up")[0]  # every rank agreed (the least)
        logger.info("tensor parallel: %d Ray actors ready", size)

    def determine_num_blocks(self) -> int:
        return self.num_blocks

    def init_kv_cache(self, num_blocks: int) -> None:
        self._call("init_kv_cache", num_blocks)

    def execute_forward(self, sched: SchedulerOutput) -> None:
        import ray

        self.check_health()
        sched_ref = ray.put(sched)  # serialised once for every rank
        self._forward_refs = [a.execute_forward.remote(sched_ref) for a in self._actors]
        self._launched_step_id = sched.step_id

    def grammar_bitmask(self, num_words: int) -> GrammarBitmask:
        """Host rows here (each rank copies the filled ones into its own pinned rows)."""
        return new_grammar_rows(self.config, num_words)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> RayOutput:
        import ray

        self.check_health()
        grammar_ref = None if grammar is None else ray.put(grammar)
        samples = [a.sample_tokens.remote(grammar_ref) for a in self._actors]
        refs, self._forward_refs = self._forward_refs + samples, []
        return RayOutput(self, refs, self._launched_step_id)

    def execute_model(self, sched: SchedulerOutput) -> RayOutput:
        self.execute_forward(sched)
        return self.sample_tokens(None)

    def collective_rpc(
        self, method: str, args: tuple | list = (), kwargs: dict | None = None
    ) -> Any:
        if method == "update_weights_from_tensor":  # each rank sent its own slices alone
            calls = split_update_call(args, kwargs, self.config.model, len(self._actors))
            return self._call_each([("rpc", (method, *call)) for call in calls])
        return self._call("rpc", method, args, kwargs)

    def sleep(self, level: int, tags: set[str]) -> None:
        self._call("sleep", level, tags)

    def wake_up(self, tags: set[str]) -> None:
        self._call("wake_up", tags)

    def check_health(self) -> None:
        """Ray reports a dead actor at the next get (get() then fails the executor)."""
        if self.failed is not None:
            raise WorkerFailed(self.failed)

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None

    def _call(self, method: str, *args: Any) -> Any:
        return self._call_each([(method, args)] * len(self._actors))

    def _call_each(self, calls: list[tuple[str, tuple]]) -> Any:
        """calls[rank] on each rank; rank 0's result (or its caller's error, raised)."""
        self.check_health()
        refs = [a.call.remote(method, args) for a, (method, args) in zip(self._actors, calls)]
        tag, value = self.get(refs, calls[0][0])[0]
        if tag == "raise":
            raise value
        return value

    def get(self, refs: list, what: str, timeout: float | None = None) -> list:
        """The calls' results; WorkerFailed (the actors killed) when a rank died, raised or did
        not answer within timeout. refs: one or more per rank, in rank order each round."""
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
            ranks = sorted({i % len(self._actors) for i, ref in enumerate(refs) if ref in pending})
            self._fail(
                f"TP worker rank {', '.join(map(str, ranks))} stopped answering (no answer for "
                f"{timeout:g} s) in {what}"
            )
        except Exception as exc:  # an actor died (RayActorError) or raised (RayTaskError)
            self._fail(f"TP worker rank {self._failed_rank(refs)} failed in {what}: {exc}")

    def _failed_rank(self, refs: list) -> int:
        """The first rank whose finished call failed."""
        import ray

        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for i, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except Exception:
                    return i % len(self._actors)
        return 0

    def _fail(self, message: str) -> None:
        if self.failed is None:
            logger.error("%s; stopping the other workers", message)
            self.failed = message
            self.shutdown()
        raise WorkerFailed(self.failed)


def _placement_group(size: int, bundle: dict[str, int]) -> Any:
    """One bundle per rank (a GPU, or a CPU), packed onto as few hosts as hold them (the ranks'
    all-reduces are fastest within a host); ValueError when the cluster cannot hold them."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([dict(bundle) for _ in range(size)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=_PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise ValueError(
            f"tensor_parallel_size {size}: the Ray cluster cannot give {size} ranks {bundle} "
            f"each within {_PLACEMENT_TIMEOUT_S:g} s (`ray status` shows its free resources)"
        )
    return group
