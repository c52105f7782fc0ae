"""The attention interface shared by the torch reference and the Triton kernels.

KV cache layout, one tensor per layer:
    kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim]   (0 = keys, 1 = values)
Token t of a sequence lives in block block_table[seq, t // block_size] at offset t % block_size,
i.e. slot = block_id * block_size + offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """One ragged batch. Host-side ints are known without touching the device."""

    num_tokens: int  # T: query tokens this step (may include padding rows, whose slot is -1)
    num_seqs: int  # B
    max_query_len: int
    max_seq_len: int
    # [B + 1] int32, device: sequence b's queries are rows [qsl[b], qsl[b+1])
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor  # [B] int32, device: context length including this step's tokens
    slot_mapping: torch.Tensor  # [T] int64, device: cache slot of each query token's K/V; -1 = skip
    block_table: torch.Tensor  # [B, max_blocks_per_seq] int32, device
    query_start_loc_cpu: torch.Tensor  # [B + 1] int32, host copy
    seq_lens_cpu: torch.Tensor  # [B] int32, host copy
    # [D] int32, device, D = the batch's decodes (num_seqs in a decode-only batch, max_query_len <= 1,
    # else num_decodes): a permutation of range(D) listing them by decreasing seq_len (ties: lower
    # index first), in which the Triton varlen kernel launches them, longest first, so no long
    # sequence starts last and stretches the step. Only the launch order depends on it, never the
    # result. None = batch order. Backends that do not launch per sequence ignore it.
    decode_order: torch.Tensor | None = None
    # A mixed batch (max_query_len > 1): its first num_decodes sequences have one query token each.
    # The Triton backend attends to them as a decode batch; 0 = none are marked (always correct).
    num_decodes: int = 0
    # Models with several KV cache groups (core/kv_groups.py): groups 1..'s metadata, equal but
    # for slot_mapping and block_table; a layer of group g reads and writes through groups[g - 1].
    # None given: one table for every layer (each with a KV tensor of its own).
    groups: tuple[AttentionMetadata, ...] = ()
    # A backend's per-step plans (torch_batched: one per window), kept with the batch they plan
    plans: dict[Any, Any] = field(default_factory=dict)
    # Query token i of sequence b sits at position seq_lens[b] - query_len[b] + i.
    # It sees key j iff j <= its position and (no window, or position - j < sliding_window).


class AttentionBackend(Protocol):
    def attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
        out: torch.Tensor | None = None,  # [T, num_heads, head_dim], like q; allocated when None
    ) -> torch.Tensor:  # [T, num_heads, head_dim] (out when given)
        """Attend over the keys and values in the cache; this step's k/v are already written
        (pagedlm.attention.prepare_qkv writes them at slot_mapping)."""
        ...


def get_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """`auto` picks Triton on CUDA and batched torch elsewhere; `torch_ref` is the reference."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        from pagedlm.attention.torch_batched import TorchBatchedAttentionBackend

        return TorchBatchedAttentionBackend()
    if name == "torch_ref":
        from pagedlm.attention.torch_ref import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from pagedlm.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend must be auto, torch, torch_ref or triton; got {name!r}")
