"""The wire of a weight transfer, shared by the trainer (pagedlm.rl.sender) and the engine's worker
(pagedlm.worker.weight_update), so the two cannot disagree: the process group they meet in, and a
chunk of tensors packed into one byte buffer that one broadcast carries.

The group is built directly over a TCPStore (the trainer, rank 0, hosts it), not through
torch.distributed.init_process_group: it leaves the process's default group alone, so a trainer's
own torch.distributed use, and later the engine's tensor parallelism, live beside it. gloo on the
CPU, NCCL on CUDA. World: the trainer plus every engine worker (rank_offset + its local rank).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

GROUP_PREFIX = "pagedlm_weight_transfer"
ALIGN_BYTES = 16  # every tensor of a packed chunk starts at a multiple: any dtype can view it
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TransferInit:
    """init_info of init_weight_transfer_engine (vLLM's NCCL backend's fields)."""

    master_address: str
    master_port: int
    world_size: int  # the trainer + every engine worker
    rank_offset: int = 1  # the first engine worker's rank; the trainer is rank 0
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_dict(cls, init_info: dict) -> TransferInit:
        """ValueError naming what is wrong with a caller's init_info."""
        if not isinstance(init_info, dict):
            raise ValueError(f"init_info must be a dict, not {type(init_info).__name__}")
        unknown = sorted(set(init_info) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"init_info: unknown key(s) {unknown}")
        try:
            init = cls(**init_info)
        except TypeError as exc:
            raise ValueError(f"init_info: {exc}") from exc
        if not 1 <= init.rank_offset < init.world_size:
            raise ValueError(
                f"init_info: rank_offset {init.rank_offset} must be in [1, world_size "
                f"{init.world_size}) (the trainer is rank 0)"
            )
        if not 0 < init.master_port < 65536:
            raise ValueError(f"init_info: master_port {init.master_port} is not a port")
        return init


@dataclass(frozen=True)
class ChunkInfo:
    """update_info of update_weights: one chunk's tensors, in packing order (vLLM's names)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    @classmethod
    def from_dict(cls, update_info: dict) -> ChunkInfo:
        if not isinstance(update_info, dict) or set(update_info) != {
            "names",
            "dtype_names",
            "shapes",
        }:
            raise ValueError("update_info must be a dict of names, dtype_names and shapes")
        info = cls(**update_info)
        if not all(isinstance(v, list) for v in (info.names, info.dtype_names, info.shapes)):
            raise ValueError("update_info: names, dtype_names and shapes must be lists")
        if not all(isinstance(name, str) for name in info.names):
            raise ValueError("update_info: names must be strings")
        if not len(info.names) == len(info.dtype_names) == len(info.shapes):
            raise ValueError("update_info: names, dtype_names and shapes differ in length")
        for name, shape in zip(info.names, info.shapes):
            if not isinstance(shape, (list, tuple)) or not all(
                isinstance(d, int) and d >= 0 for d in shape
            ):
                raise ValueError(f"update_info: shape {shape!r} of {name!r} is not a list of sizes")
        for dtype_name in info.dtype_names:
            parse_dtype(dtype_name)
        return info

    @classmethod
    def of(cls, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> ChunkInfo:
        return cls(
            names=[name for name, _ in named_tensors],
            dtype_names=[dtype_name(t.dtype) for _, t in named_tensors],
            shapes=[list(t.shape) for _, t in named_tensors],
        )

    def to_dict(self) -> dict:
        return {"names": self.names, "dtype_names": self.dtype_names, "shapes": self.shapes}

    def offsets(self) -> tuple[list[int], int]:
        """Each tensor's byte offset in the packed buffer, and the buffer's size."""
        offsets, end = [], 0
        for name, shape in zip(self.dtype_names, self.shapes):
            start = -(-end // ALIGN_BYTES) * ALIGN_BYTES
            offsets.append(start)
            end = start + _numel(shape) * parse_dtype(name).itemsize
        return offsets, end


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """A floating-point torch dtype by name ("bfloat16"); ValueError for anything else."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"update_info: dtype {name!r} is not a floating-point torch dtype")
    return dtype


def pack(named_tensors: Sequence[tuple[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    """The chunk's tensors in one uint8 buffer [total bytes] on device, laid out as ChunkInfo.of
    says."""
    _, total = ChunkInfo.of(named_tensors).offsets()
    buffer = torch.zeros(total, dtype=torch.uint8, device=device)
    pack_into(named_tensors, buffer)
    return buffer


def pack_into(named_tensors: Sequence[tuple[str, torch.Tensor]], buffer: torch.Tensor) -> None:
    """The chunk's tensors into the start of buffer [>= total bytes] uint8 (the gaps between them
    keep what they held)."""
    offsets, total = ChunkInfo.of(named_tensors).offsets()
    if buffer.numel() < total:
        raise ValueError(
            f"pack_into: the chunk needs {total} bytes, the buffer has {buffer.numel()}"
        )
    for (_, tensor), offset in zip(named_tensors, offsets):
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[offset : offset + flat.numel()].copy_(flat)


def unpack(info: ChunkInfo, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views of a received buffer [total bytes] as the chunk's tensors (no copy)."""
    offsets, _ = info.offsets()
    tensors = []
    for name, dtype, shape, offset in zip(info.names, info.dtype_names, info.shapes, offsets):
        dtype = parse_dtype(dtype)
        num_bytes = _numel(shape) * dtype.itemsize
        tensors.append((name, buffer[offset : offset + num_bytes].view(dtype).view(shape)))
    return tensors


def new_group(
    init: TransferInit, rank: int, device: torch.device, *, store: dist.Store | None = None
) -> dist.ProcessGroup:
    """The transfer's own group; blocks until every rank has joined. The trainer passes the
    store it hosts (host_store); a worker connects to it."""
    timeout = datetime.timedelta(seconds=init.timeout_s)
    if store is None:
        store = dist.TCPStore(
            init.master_address, init.master_port, init.world_size, False, timeout=timeout
        )
    prefixed = dist.PrefixStore(GROUP_PREFIX, store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, init.world_size, options)
    return dist.ProcessGroupGloo(prefixed, rank, init.world_size, timeout)


def host_store(master_address: str, master_port: int, world_size: int, timeout_s: float):
    """The trainer's TCPStore (port 0: a free one, read back from .port); returns at once."""
    return dist.TCPStore(
        master_address,
        master_port,
        world_size,
        True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def broadcast(group: dist.ProcessGroup, buffer: torch.Tensor) -> dist.Work:
    """The trainer's (rank 0) buffer into every rank's; returns the pending work."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([buffer], options)


def _numel(shape: Sequence[int]) -> int:
    numel = 1
    for dim in shape:
        numel *= dim
    return numel
