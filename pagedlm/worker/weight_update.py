"""The worker's weight changes (collective_rpc methods, registered in worker/rpc.py): a reload from
disk, tensors from a trainer in the same process, and vLLM's four-phase transfer from a trainer
over torch.distributed (pagedlm.rl.transport). Each copies into the existing parameter storages
(CUDA graphs bind them) only after validating what it copies, and sets the weight version, which
the engine core reads (get_weight_version) to stamp outputs and reset the prefix cache.

Each function takes the model runner first (worker/rpc.py calls it so); the state a runner's
transfer needs lives here, keyed by the runner, so the runner carries nothing of it."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pagedlm.model import loader
from pagedlm.rl.transport import ChunkInfo, TransferInit, broadcast, new_group, unpack

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner

INITIAL_WEIGHT_VERSION = "default"  # vLLM's


@dataclass
class _WeightState:
    version: str = INITIAL_WEIGHT_VERSION
    num_changes: int = 0  # names a change that brings no version of its own
    group: dist.ProcessGroup | None = None
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
        loader.reload_weights(runner.model, runner.config.model, weights_path)
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
    (name, tensor) pairs), copied in place once all of them are checked. Returns the new version."""
    _refuse_during_transfer(runner, "update_weights_from_tensor")
    pairs = list(named_tensors.items() if isinstance(named_tensors, dict) else named_tensors)
    loader.update_weights(runner.model, pairs, "update_weights_from_tensor")
    return _changed(runner, weight_version)


def init_weight_transfer_engine(runner: ModelRunner, init_info: dict) -> None:
    """Joins the trainer's group (blocks until every rank has joined: the trainer joins meanwhile).
    init_info: master_address, master_port, world_size, rank_offset (this worker's rank)."""
    init = TransferInit.from_dict(init_info)
    state = _state(runner)
    if state.group is not None:
        raise ValueError("init_weight_transfer_engine: a transfer group is open already")
    state.group = new_group(init, init.rank_offset, runner.device)


def start_weight_update(runner: ModelRunner) -> None:
    state = _state(runner)
    if state.group is None:
        raise ValueError("start_weight_update: call init_weight_transfer_engine first")
    if state.updating:
        raise ValueError("start_weight_update: an update is in progress already")
    state.updating = True


def update_weights(runner: ModelRunner, update_info: dict) -> None:
    """Receives one chunk the trainer broadcasts (names, dtype_names, shapes: its tensors in
    packing order), then checks and copies it in place. The chunk is received whatever its
    content, so that the trainer's broadcast completes; a bad name or shape then raises and copies
    nothing of this chunk."""
    state = _state(runner)
    if state.group is None or not state.updating:
        raise ValueError("update_weights: call start_weight_update first")
    info = ChunkInfo.from_dict(update_info)
    _, num_bytes = info.offsets()
    buffer = torch.empty(num_bytes, dtype=torch.uint8, device=runner.device)  # [num_bytes]
    broadcast(state.group, buffer).wait()
    loader.update_weights(runner.model, unpack(info, buffer), "update_weights")


def finish_weight_update(runner: ModelRunner, weight_version: str | None = None) -> str:
    """Ends the update; the weights received become the version given (else a new number)."""
    state = _state(runner)
    if not state.updating:
        raise ValueError("finish_weight_update: no update is in progress")
    state.updating = False
    return _changed(runner, weight_version)


def shutdown_weight_transfer_engine(runner: ModelRunner) -> None:
    state = _state(runner)
    state.group, state.updating = None, False


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
