"""The worker's weight changes (collective_rpc methods, registered in worker/rpc.py): a reload from
disk, tensors from a trainer in the same process, and vLLM's four-phase transfer from a trainer
over torch.distributed (pagedlm.rl.transport) or, colocated, through a shared bucket
(pagedlm.rl.ipc). Each copies into the existing parameter storages
(CUDA graphs bind them) only after validating what it copies, and sets the weight version, which
the engine core reads (get_weight_version) to stamp outputs and reset the prefix cache. At tp > 1
each runs on every rank, which reads, is sent, or receives only its own slice of each tensor
(distributed/weight_shards.py); rank 0's result is the engine's.

Each function takes the model runner first (worker/rpc.py calls it so); the state a runner's
transfer needs lives here, keyed by the runner, so the runner carries nothing of it."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pagedlm.distributed.sharding import narrowed_shape
from pagedlm.distributed.weight_shards import shard_layout
from pagedlm.model import loader
from pagedlm.model.loader import Shard
from pagedlm.rl import ipc
from pagedlm.rl.transport import ChunkInfo, TransferInit, broadcast, new_group, unpack

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner

INITIAL_WEIGHT_VERSION = "default"  # vLLM's


@dataclass
class _WeightState:
    version: str = INITIAL_WEIGHT_VERSION
    num_changes: int = 0  # names a change that brings no version of its own
    receiver: _GroupReceiver | _IpcReceiver | None = None  # between init and shutdown
    updating: bool = False  # between start_weight_update and finish_weight_update


_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # runner -> _WeightState


def _state(runner: ModelRunner) -> _WeightState:
    state = _STATES.get(runner)
    if state is None:
        state = _STATES[runner] = _WeightState()
    return state


def get_weight_version(runner: ModelRunner) -> str:
    return _state(runner).version


def update_weight_version(runner: ModelRunner, weight_version: str) -> str:
    """Names the current weights (vLLM's update_weight_version); the weights stay."""
    state = _state(runner)
    state.version = _version_name(weight_version)
    return state.version


def reload_weights(
    runner: ModelRunner, weights_path: str, weight_version: str | None = None
) -> str:
    """Every weight from a Hugging Face folder (safetensors) or a GGUF file of the same
    architecture, in place; a name or shape mismatch raises ValueError and keeps the weights.
    Returns the new weight version."""
    if not isinstance(weights_path, str):
        raise ValueError(f"weights_path must be a path string, not {type(weights_path).__name__}")
    _refuse_during_transfer(runner, "reload_weights")
    try:
        loader.reload_weights(runner.model, runner.config.model, weights_path, _shard(runner))
    except loader.PartialReload:
        _changed(runner, None)  # mixed weights are not the old version: no old KV may serve them
        raise
    return _changed(runner, weight_version)


def update_weights_from_tensor(
    runner: ModelRunner,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    weight_version: str | None = None,
) -> str:
    """A colocated trainer's tensors (Hugging Face names, any subset of the weights; a dict or
    (name, tensor) pairs), copied in place once all of them are checked; at tp > 1 this rank's
    slices of them (the executor cut them: distributed/weight_shards.py). Returns the new
    version."""
    _refuse_during_transfer(runner, "update_weights_from_tensor")
    pairs = list(named_tensors.items() if isinstance(named_tensors, dict) else named_tensors)
    loader.update_weights(runner.model, pairs, "update_weights_from_tensor", _shard(runner))
    return _changed(runner, weight_version)


def get_weight_shard_layout(runner: ModelRunner) -> dict:
    """The engine's tp size and each rank's slice of every sharded tensor, for a trainer that
    sends each rank its slice (weight_shards.shard_layout)."""
    if runner.tp is None:
        return {"tp_size": 1, "slices": {}}
    tp = runner.tp
    return shard_layout(tp.full_model, tp.group.size, loader.checkpoint_layout(runner.model))


def init_weight_transfer_engine(runner: ModelRunner, init_info: dict) -> None:
    """Joins the trainer's group (blocks until every rank has joined: the trainer joins meanwhile).
    init_info: master_address, master_port, world_size, rank_offset (the first worker's rank; TP
    rank r joins as rank_offset + r); or {"transport": "ipc"} for a colocated trainer's shared
    bucket (tp = 1 only)."""
    state = _state(runner)
    if state.receiver is not None:
        raise ValueError("init_weight_transfer_engine: a transfer group is open already")
    if isinstance(init_info, dict) and init_info.get("transport") == ipc.TRANSPORT:
        if set(init_info) != {"transport"}:
            raise ValueError("init_info: transport 'ipc' takes no other key")
        if runner.tp is not None:
            raise ValueError(
                "init_info: transport 'ipc' needs tensor_parallel_size 1; at tp > 1 use the "
                "'distributed' transport (each rank receives its slice)"
            )
        state.receiver = _IpcReceiver()
        return
    init = TransferInit.from_dict(init_info)
    tp_rank, tp_size = (0, 1) if runner.tp is None else (runner.tp.group.rank, runner.tp.group.size)
    if init.rank_offset + tp_size > init.world_size:
        raise ValueError(
            f"init_info: world_size {init.world_size} leaves no rank for TP rank {tp_size - 1} "
            f"(rank_offset {init.rank_offset}, tensor_parallel_size {tp_size})"
        )
    group = new_group(init, init.rank_offset + tp_rank, runner.device)
    state.receiver = _GroupReceiver(group, _shard(runner))


def start_weight_update(runner: ModelRunner) -> None:
    state = _state(runner)
    if state.receiver is None:
        raise ValueError("start_weight_update: call init_weight_transfer_engine first")
    if state.updating:
        raise ValueError("start_weight_update: an update is in progress already")
    state.updating = True


def update_weights(runner: ModelRunner, update_info: dict) -> None:
    """Receives one chunk (names, dtype_names, shapes: its tensors in packing order; over IPC
    also the bucket's handle), then checks and copies it in place. A broadcast chunk is received
    whatever its content, so that the trainer's broadcast completes; a bad name or shape then
    raises and copies nothing of this chunk."""
    state = _state(runner)
    if state.receiver is None or not state.updating:
        raise ValueError("update_weights: call start_weight_update first")
    info, buffer = state.receiver.receive(update_info, runner.device)
    loader.update_weights(runner.model, unpack(info, buffer), "update_weights", _shard(runner))
    state.receiver.done_reading(runner.device)


def finish_weight_update(runner: ModelRunner, weight_version: str | None = None) -> str:
    """Ends the update; the weights received become the version given (else a new number)."""
    state = _state(runner)
    if not state.updating:
        raise ValueError("finish_weight_update: no update is in progress")
    state.updating = False
    return _changed(runner, weight_version)


def shutdown_weight_transfer_engine(runner: ModelRunner) -> None:
    state = _state(runner)
    state.receiver, state.updating = None, False


class _GroupReceiver:
    """Chunks from the trainer over its torch.distributed group, each into a new buffer: at
    tp = 1 a broadcast; at tp > 1 this rank's slices alone, sent to it by the trainer (the
    chunk's update_info names the full shapes; this rank receives them narrowed to its shard)."""

    def __init__(self, group: dist.ProcessGroup, shard: Shard | None) -> None:
        self.group, self.shard = group, shard

    def receive(self, update_info: dict, device: torch.device) -> tuple[ChunkInfo, torch.Tensor]:
        info = ChunkInfo.from_dict(update_info)
        if self.shard is not None:
            info = local_chunk(info, self.shard)
        _, num_bytes = info.offsets()
        buffer = torch.empty(num_bytes, dtype=torch.uint8, device=device)  # [num_bytes]
        if self.shard is None:
            broadcast(self.group, buffer).wait()
        else:
            self.group.recv([buffer], 0, 0).wait()
        return info, buffer

    def done_reading(self, device: torch.device) -> None:
        """The buffer is this side's own: nothing to hand back."""


class _IpcReceiver:
    """Chunks in the trainer's shared bucket (pagedlm.rl.ipc); the bucket last opened is kept, so
    the trainer's one allocation is mapped once."""

    def __init__(self) -> None:
        self._handle: dict | None = None
        self._bucket: torch.Tensor | None = None  # [bucket bytes] uint8

    def receive(self, update_info: dict, device: torch.device) -> tuple[ChunkInfo, torch.Tensor]:
        if not isinstance(update_info, dict) or ipc.BUCKET_KEY not in update_info:
            raise ValueError(f"update_info: transport 'ipc' needs the {ipc.BUCKET_KEY!r} handle")
        handle = update_info[ipc.BUCKET_KEY]
        info = ChunkInfo.from_dict({k: v for k, v in update_info.items() if k != ipc.BUCKET_KEY})
        if handle != self._handle:
            self._bucket, self._handle = None, None  # the old mapping goes before the new opens
            self._bucket, self._handle = ipc.open_bucket(handle, device), handle
        _, num_bytes = info.offsets()
        if num_bytes > self._bucket.numel():
            raise ValueError(
                f"update_info: the chunk needs {num_bytes} bytes, the bucket has "
                f"{self._bucket.numel()}"
            )
        return info, self._bucket

    def done_reading(self, device: torch.device) -> None:
        """The copies out of the bucket are complete before the trainer refills it."""
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()


def local_chunk(info: ChunkInfo, shard: Shard) -> ChunkInfo:
    """The chunk as this rank receives it: each shape narrowed to the rank's slice."""
    shapes = [
        list(narrowed_shape(tuple(shape), shard(name), name, "update_weights"))
        for name, shape in zip(info.names, info.shapes)
    ]
    return ChunkInfo(info.names, info.dtype_names, shapes)


def _shard(runner: ModelRunner) -> Shard | None:
    return None if runner.tp is None else runner.tp.shard


def _refuse_during_transfer(runner: ModelRunner, method: str) -> None:
    if _state(runner).updating:
        raise ValueError(f"{method}: a weight transfer is in progress (finish_weight_update first)")


def _changed(runner: ModelRunner, weight_version: str | None) -> str:
    state = _state(runner)
    state.num_changes += 1
    state.version = (
        str(state.num_changes) if weight_version is None else _version_name(weight_version)
    )
    return state.version


def _version_name(weight_version: object) -> str:
    if not isinstance(weight_version, (str, int)) or isinstance(weight_version, bool):
        raise ValueError(f"weight_version must be a string, not {type(weight_version).__name__}")
    return str(weight_version)
