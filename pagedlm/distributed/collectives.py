"""The collectives over the TP group. Callers test `group.size > 1` once at build time, so a
tp = 1 model holds no call to these at all (no op, no branch per step)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pagedlm.distributed.parallel_state import TPGroup


def all_reduce(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Sum over ranks, in place; returns x."""
    dist.all_reduce(x, group=group.device_group)
    return x


def all_gather_last_dim(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """x [N, C] on each rank -> [N, size * C]: rank r's columns at [r * C, (r + 1) * C)."""
    parts = all_gather_rows(x, group)  # [P, N, C]
    return parts.permute(1, 0, 2).reshape(x.shape[0], group.size * x.shape[1])


def gather_last_dim_to_first(x: torch.Tensor, group: TPGroup) -> torch.Tensor | None:
    """x [N, C] on each rank -> [N, size * C] on rank 0 (None elsewhere)."""
    x = x.contiguous()
    if not group.is_first:
        dist.gather(x, None, dst=0, group=group.device_group)
        return None
    parts = [torch.empty_like(x) for _ in range(group.size)]
    dist.gather(x, parts, dst=0, group=group.device_group)
    return torch.cat(parts, dim=1)


def broadcast_from_first(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Rank 0's x on every rank, in place (x contiguous)."""
    dist.broadcast(x, src=0, group=group.device_group)
    return x


def all_gather_rows(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """x [n, ...] (same n on every rank) -> [size, n, ...]."""
    out = torch.empty((group.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group.device_group)
    return out.view(group.size, *x.shape)


def min_over_ranks(value: int, group: TPGroup) -> int:
    """The least of each rank's value (host, at start-up: the KV cache's block count)."""
    if group.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group.cpu_group)
    return int(t[0])  # sync-ok: a host tensor at start-up
