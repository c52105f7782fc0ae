"""StepBuffers: one set of per-step input tensors (host staging or device), sized for the largest
step. The batch builder writes the host sets through numpy views made once; the device set is
what the model and the CUDA graphs read, as slices of fixed buffers."""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import numpy as np
import torch

# name -> dtype; sized by tokens (T), sequences (S, S + 1) or the flat block table.
_TOKEN_SECTIONS = {"input_ids": torch.int64, "positions": torch.int64, "slot_mapping": torch.int64}
_SEQ_SECTIONS = {"seq_lens": torch.int32, "logits_indices": torch.int64,
                 "sample_rows": torch.int64, "placeholder_idx": torch.int64,
                 "placeholder_rows": torch.int64, "decode_order": torch.int32}


class PrefixViews:
    """Views of the leading elements of fixed 1-D buffers. The last view of each (buffer, rank)
    is kept: a steady decode step asks for the shapes of the step before, and making a view is
    a torch call."""

    def __init__(self, tensors: dict[Hashable, torch.Tensor]) -> None:
        self._tensors = tensors
        self._last: dict[tuple[Hashable, int], tuple[tuple[int, ...], torch.Tensor]] = {}

    def get(self, name: Hashable, *shape: int) -> torch.Tensor:
        """The first prod(shape) elements of buffer `name`, viewed as `shape`."""
        key = (name, len(shape))
        last = self._last.get(key)
        if last is not None and last[0] == shape:
            return last[1]
        view = self._tensors[name][:math.prod(shape)].view(shape)
        self._last[key] = (shape, view)
        return view


class StepBuffers:
    """Host sets are pinned when CUDA is present. Sections:
    input_ids, positions, slot_mapping [max_num_tokens]; query_start_loc [max_num_reqs + 1];
    seq_lens [max_num_reqs]; block_table [max_num_reqs * max_num_blocks_per_req] (flat: a
    step's table is the contiguous prefix viewed as [num_seqs, num_cols]); logits_indices,
    sample_rows (rows that sample), placeholder_idx (batch index of each placeholder input),
    placeholder_rows (its row), decode_order (a decode-only batch's sequences by decreasing
    seq_len: AttentionMetadata.decode_order) [max_num_reqs]."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    logits_indices: torch.Tensor
    sample_rows: torch.Tensor
    placeholder_idx: torch.Tensor
    placeholder_rows: torch.Tensor
    decode_order: torch.Tensor
    prefix: Callable[..., torch.Tensor]  # prefix(name, *shape): PrefixViews.get

    def __init__(self, max_num_tokens: int, max_num_reqs: int, max_num_blocks_per_req: int,
                 device: torch.device, pin: bool) -> None:
        sizes = {name: (max_num_tokens, dtype) for name, dtype in _TOKEN_SECTIONS.items()}
        sizes.update((name, (max_num_reqs, dtype)) for name, dtype in _SEQ_SECTIONS.items())
        sizes["query_start_loc"] = (max_num_reqs + 1, torch.int32)
        sizes["block_table"] = (max_num_reqs * max_num_blocks_per_req, torch.int32)
        self.tensors: dict[str, torch.Tensor] = {}
        self.arrays: dict[str, np.ndarray] = {}  # numpy views of a host set (share memory)
        for name, (size, dtype) in sizes.items():
            tensor = torch.zeros(size, dtype=dtype, device=device, pin_memory=pin)
            setattr(self, name, tensor)
            self.tensors[name] = tensor
            if tensor.device.type == "cpu":
                self.arrays[name] = tensor.numpy()  # sync-ok: a host tensor, at start-up
        self.prefix = PrefixViews(self.tensors).get
        self._arange_np = np.arange(max_num_reqs, dtype=np.int32)

    def pad_decode(self, num_seqs: int, num_padded: int) -> None:
        """Rows [num_seqs, num_padded) of a decode batch (one token per sequence) as padding,
        for a CUDA graph of num_padded sequences: token 0 at position 0, slot -1 (no KV write),
        seq_len 0 and no query (query_start_loc stays at num_seqs): the attention kernels skip
        such a sequence; last in decode_order, as the shortest. (A step whose input ids all come
        from the device copies none: its padding rows keep the valid ids the device buffer
        holds; their outputs are unread.)"""
        pad = slice(num_seqs, num_padded)
        arrays = self.arrays
        arrays["input_ids"][pad] = 0
        arrays["positions"][pad] = 0
        arrays["slot_mapping"][pad] = -1
        arrays["seq_lens"][pad] = 0
        arrays["query_start_loc"][num_seqs + 1:num_padded + 1] = num_seqs
        arrays["decode_order"][pad] = self._arange_np[pad]

    def copy_from(self, src: StepBuffers, sizes: dict[str, int]) -> None:
        """Non-blocking copy of the first `size` elements of each named section of src."""
        for name, size in sizes.items():
            if size:
                self.prefix(name, size).copy_(src.prefix(name, size), non_blocking=True)
