"""This process's place in the tensor-parallel group: its rank, the group's size, the device group
(NCCL on CUDA, gloo on the CPU) and a gloo group for host tensors (start-up agreements such as the
KV cache's size). At tp = 1 nothing is initialised and every layer builds as it did without TP."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pagedlm import envs
from pagedlm.distributed.launcher_env import launcher_env


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int
    device_group: Any = None  # torch.distributed ProcessGroup; None at size 1
    cpu_group: Any = None  # gloo, for host tensors

    @property
    def is_first(self) -> bool:
        return self.rank == 0


_SINGLE = TPGroup(rank=0, size=1)
_group: TPGroup = _SINGLE


def get_tp_group() -> TPGroup:
    return _group


def init_tp_group(
    rank: int, world_size: int, device: torch.device, init_method: str = "env://"
) -> TPGroup:
    """Joins (creates) the default process group of world_size ranks and makes it the TP group:
    torchrun's environment (init_method env://) or the executor's tcp:// address."""
    global _group
    if world_size == 1:
        _group = _SINGLE
        return _group
    backend = "nccl" if device.type == "cuda" and not envs.PAGEDLM_TP_ONE_DEVICE else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    _group = TPGroup(rank, world_size, dist.group.WORLD, cpu_group)
    return _group


def init_from_env(device: torch.device) -> TPGroup:
    """torchrun-style: RANK and WORLD_SIZE (and MASTER_ADDR / MASTER_PORT) from the environment
    (the engine config checked they are there)."""
    launched = launcher_env()
    assert launched is not None, "external_launcher without RANK / WORLD_SIZE"
    return init_tp_group(launched.rank, launched.world_size, device)


@contextlib.contextmanager
def single_rank() -> Iterator[None]:
    """Layers built inside take no TP group: a model replicated whole on every rank (a
    speculative draft model at tp > 1), whose layers run no collectives."""
    global _group
    saved, _group = _group, _SINGLE
    try:
        yield
    finally:
        _group = saved


def destroy_tp_group() -> None:
    global _group
    if _group.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
    _group = _SINGLE
