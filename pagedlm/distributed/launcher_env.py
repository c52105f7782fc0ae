"""The launcher's environment: torchrun (and any launcher of its convention) starts every rank with
RANK, WORLD_SIZE and LOCAL_RANK set (MASTER_ADDR / MASTER_PORT are read by torch.distributed
itself). The one place pagedlm reads them, for distributed_executor_backend="external_launcher".
Imports nothing heavy: the engine config checks it."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherEnv:
    rank: int
    world_size: int
    local_rank: int  # the rank on this host: its GPU index (RANK where the launcher sets none)


def launcher_env() -> LauncherEnv | None:
    """This process's place in the launcher's group; None where no launcher started it."""
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world is None or rank is None:
        return None
    return LauncherEnv(int(rank), int(world), int(os.environ.get("LOCAL_RANK", rank)))
