"""Weight updates at tp > 1: the sender slices every tensor per rank and each rank receives its
slice only, never the full tensor (vLLM's sharded transfer). The slices are sharding.py's, the
ones each rank's loader expects, so sender and receiver cannot disagree.

Two senders: the driver (update_weights_from_tensor through the executor, split_update_call) and
a trainer process (pagedlm.rl.sender), which learns the slices from the engine (shard_layout, in
plain lists so that it travels over the server's wire too)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from pagedlm.distributed.sharding import TensorSlice, checkpoint_slice, narrow
from pagedlm.errors import InvalidRequest

if TYPE_CHECKING:
    from pagedlm.config import ModelConfig

# a tensor's name -> each rank's part of it (None: replicated, the whole tensor)
RankSlices = Callable[[str], list[TensorSlice | None]]


def config_slices(config: ModelConfig, tp: int) -> RankSlices:
    """Each rank's part of a checkpoint tensor (config: the model's, not a rank's)."""
    return lambda name: [checkpoint_slice(name, config, rank, tp) for rank in range(tp)]


def split(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    slices: RankSlices,
    tp: int,
    source: str,
    compact: bool = True,
) -> list[list[tuple[str, torch.Tensor]]]:
    """Per rank, its (name, slice) of every pair; a slice is a compact copy (pickling a view
    would carry its whole storage), or with compact False a view (for a caller that copies it
    itself). A pair that is not (name, tensor) goes to every rank as it is, for the rank's loader
    to refuse it with its own error. ValueError: a tensor whose full size is not the model's."""
    per_rank: list[list[tuple[str, torch.Tensor]]] = [[] for _ in range(tp)]
    for pair in named_tensors:
        if not _is_named_tensor(pair):
            for pairs in per_rank:
                pairs.append(pair)
            continue
        name, tensor = pair
        for rank, part in enumerate(slices(name)):
            piece = narrow(tensor, part, name, source)
            if compact and part is not None:
                piece = piece.clone(memory_format=torch.contiguous_format)
            per_rank[rank].append((name, piece))
    return per_rank


def split_update_call(
    args: tuple | list, kwargs: dict | None, config: ModelConfig, tp: int
) -> list[tuple[tuple, dict]]:
    """update_weights_from_tensor's (args, kwargs) for each rank: its slices of named_tensors."""
    from pagedlm.worker.weight_update import update_weights_from_tensor

    method = "update_weights_from_tensor"
    try:
        bound = inspect.signature(update_weights_from_tensor).bind(None, *args, **(kwargs or {}))
        named = bound.arguments.pop("named_tensors")
        bound.arguments.pop("runner")
        pairs = list(named.items() if isinstance(named, dict) else named)
        per_rank = split(pairs, config_slices(config, tp), tp, method)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{method}: {exc}", param="args") from exc
    return [((), {**bound.arguments, "named_tensors": pairs}) for pairs in per_rank]


def shard_layout(config: ModelConfig, tp: int, names: Iterable[str]) -> dict[str, Any]:
    """What a trainer needs to slice for this engine: {"tp_size", "slices": {name: per rank,
    [dim, start, length, full] or None}}; names not listed are replicated."""
    slices = config_slices(config, tp)
    return {
        "tp_size": tp,
        "slices": {
            name: [None if part is None else _to_list(part) for part in slices(name)]
            for name in names
            if tp > 1 and checkpoint_slice(name, config, 0, tp) is not None
        },
    }


def layout_slices(layout: dict[str, Any]) -> tuple[int, RankSlices]:
    """The tp size and each rank's part of a tensor, from shard_layout's answer."""
    tp = layout["tp_size"]
    parts = {
        name: [None if part is None else TensorSlice(*part) for part in per_rank]
        for name, per_rank in layout["slices"].items()
    }
    return tp, lambda name: parts.get(name, [None] * tp)


def _to_list(part: TensorSlice) -> list[int]:
    return [part.dim, part.start, part.length, part.full]


def _is_named_tensor(pair: Any) -> bool:
    return (
        isinstance(pair, (tuple, list))
        and len(pair) == 2
        and isinstance(pair[0], str)
        and isinstance(pair[1], torch.Tensor)
    )
