"""Where the engine core's model runs: in process ("uni": UniExecutor), one worker process per
TP rank ("mp": MultiprocExecutor), one Ray actor per rank on any host of a Ray cluster ("ray":
RayExecutor), or in process as this rank of a group torchrun started ("external_launcher":
every rank runs the same script, its own engine core and scheduler, which plan the same steps
from the same requests; the sampled ids are broadcast from rank 0, so the ranks stay in step;
rank 0's outputs carry the logprobs). All are an Executor (base.py)."""

from __future__ import annotations

from pagedlm.config import EngineConfig
from pagedlm.executor.base import Executor


def make_executor(config: EngineConfig) -> Executor:
    """A started executor: its model loaded (every rank's, for "mp")."""
    backend = config.parallel.distributed_executor_backend
    if backend == "mp":
        from pagedlm.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config)
    if backend == "ray":
        from pagedlm.executor.ray_executor import RayExecutor

        return RayExecutor(config)
    from pagedlm.executor.uni import UniExecutor

    if backend == "external_launcher":
        config = _join_launched_group(config)
    return UniExecutor(config)


def _join_launched_group(config: EngineConfig) -> EngineConfig:
    """This process's rank of torchrun's group (once per process); on CUDA its LOCAL_RANK's GPU."""
    from dataclasses import replace

    import torch

    from pagedlm.distributed.launcher_env import launcher_env
    from pagedlm.distributed.parallel_state import get_tp_group, init_from_env

    if config.device.type == "cuda":
        launched = launcher_env()
        assert launched is not None, "external_launcher without RANK / WORLD_SIZE"
        local_rank = launched.local_rank
        torch.cuda.set_device(local_rank)
        config = replace(config, device=torch.device("cuda", local_rank))
    if get_tp_group().size == 1:
        init_from_env(config.device)
    return config
