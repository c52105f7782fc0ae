"""StepBuffers: one set of per-step inputs (a pinned host staging set or the device set) in one
flat buffer, laid out so that the host->device transfer of a step is one copy of one byte range.

Why: each CUDA call costs the host 5-15 µs on the H200 machine, and a steady decode step issued
a copy per section (positions, slot_mapping, seq_lens, and input_ids in sync mode) plus the CUDA
graph's block-table copy. With this layout (and the graphs' own input gather and argmax) a steady
batch-1 graph step makes about 2 torch calls instead of 14 (benchmarks/host_step.py --graphs
--count-ops): this one copy and the copy of the sampled ids back. Capturing the copies from the
pinned staging sets inside the graphs (one graph per size and staging set) would save this copy
too, but every section would then have to be rewritten into each staging set every step (no
reuse), and the block table copied at its full width every step; not taken.

A set, in bytes (the head's end and every section 16-byte aligned: Triton specialises a kernel on
whether each pointer argument is, so a section off that alignment in one layout only would compile
another variant while serving; tests/worker/test_kernel_warmup.py caught that on the H200):

    [ head: num_head_ids int64 | A | B | C ]

- head: on the device set, the token each row sampled last (ModelRunner's last_sampled), then
  scratch entries that the padding rows of a CUDA graph write theirs to; on host sets, the header
  of a step whose graph stages its inputs in itself (ops/stage_in.py). Never copied.
- A, what every step writes: input_ids [T] (the tokens the host knows; none when every input
  token is a placeholder), positions [T], slot_mapping [T], seq_lens [S]. input_ids follows the
  head directly, so head + input_ids is one table (`ids_table`) from which `input_src` gathers each
  input token: the last sampled token of a row (a placeholder: still on the device) or a token the
  host copied.
- B, the sequence sections, which a steady decode shares with the step before: query_start_loc
  [S + 1], decode_order [S], logits_indices [S], sample_rows [S], input_src [T].
- C, the block table: [num_seqs, num_cols] compact (capacity S x max_num_blocks_per_req).

T and S are the step's token and sequence counts rounded up to a bucket (sizes.SizePolicy.step_bucket:
the kept CUDA-graph sizes, then multiples of LARGE_BUCKET), so the sections of a decode step of n
sequences lie exactly where the graph of padded size bucket(n) reads them. The offsets of A, B and C
depend on (T, S) only. A step copies the byte range from the end of the head to the end of A, of B or of C
(so a step that copies the block table copies B as well, which it then writes). Bytes the step did
not write go over too (e.g. the input_ids of an all-placeholder step): nothing reads them. Rows past
the real ones of a decode-shaped step's sequence sections are padded (pad_decode) even when the
step runs eagerly, since a later step of the same rows may replay a graph over them unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping

import numpy as np
import torch

_NUMPY = {torch.int32: np.int32, torch.int64: np.int64}
MAX_CACHED_LAYOUTS = 256  # Sections (and copy ranges) kept per set; the oldest goes past this
_LAST_OF_A, _LAST_OF_B = "seq_lens", "input_src"
SECTION_ALIGN = 16  # bytes: the head's end and every section (module notes)
Rows = np.ndarray | torch.Tensor  # a section of a host set (numpy) or of a device set (torch)


def _align(num_bytes: int) -> int:
    return -(-num_bytes // SECTION_ALIGN) * SECTION_ALIGN


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
        view = self._tensors[name][: math.prod(shape)].view(shape)
        self._last[key] = (shape, view)
        return view


def _section_specs(
    num_tokens: int, num_seqs: int, max_num_blocks_per_req: int, num_kv_groups: int
) -> list[tuple[str, int, torch.dtype]]:
    """(name, capacity, dtype) of the sections A, B, C in layout order; slot_mapping and
    block_table hold each KV cache group's in turn (worker/group_tables.py)."""
    return [
        ("input_ids", num_tokens, torch.int64),
        ("positions", num_tokens, torch.int64),
        ("slot_mapping", num_kv_groups * num_tokens, torch.int64),
        ("seq_lens", num_seqs, torch.int32),
        ("query_start_loc", num_seqs + 1, torch.int32),
        ("decode_order", num_seqs, torch.int32),
        ("logits_indices", num_seqs, torch.int64),
        ("sample_rows", num_seqs, torch.int64),
        ("input_src", num_tokens, torch.int64),
        ("block_table", num_kv_groups * num_seqs * max_num_blocks_per_req, torch.int32),
    ]


def _offsets(
    num_head_ids: int,
    num_tokens: int,
    num_seqs: int,
    max_num_blocks_per_req: int,
    num_kv_groups: int = 1,
) -> dict[str, tuple[int, int, torch.dtype]]:
    """name -> (first byte, byte past the last, dtype) of each section of one layout."""
    offsets = {}
    start = num_head_ids * 8
    specs = _section_specs(num_tokens, num_seqs, max_num_blocks_per_req, num_kv_groups)
    for name, size, dtype in specs:
        end = start + size * dtype.itemsize
        offsets[name] = (start, end, dtype)
        start = _align(end)
    return offsets


class Sections:
    """The section views of one layout (bucketed num_tokens, num_seqs) of a StepBuffers set:
    `tensors` (full capacity), `arrays` (numpy views, host sets), `prefix(name, *shape)`."""

    def __init__(
        self,
        flat: torch.Tensor,
        flat_np: np.ndarray | None,
        offsets: dict[str, tuple[int, int, torch.dtype]],
        num_seqs: int,
    ) -> None:
        self.num_seqs = num_seqs  # S: capacity of the sequence sections
        self.tensors: dict[str, torch.Tensor] = {}
        self.arrays: dict[str, np.ndarray] = {}
        for name, (start, end, dtype) in offsets.items():
            self.tensors[name] = flat[start:end].view(dtype)
            if flat_np is not None:
                self.arrays[name] = flat_np[start:end].view(_NUMPY[dtype])
        # [num_head_ids + T]: the head and input_ids, the table input_src indexes
        self.tensors["ids_table"] = flat[: offsets["input_ids"][1]].view(torch.int64)
        self.prefix = PrefixViews(self.tensors).get
        self._end_a, self._end_b = offsets[_LAST_OF_A][1], offsets[_LAST_OF_B][1]
        self._table_start = offsets["block_table"][0]

    def copy_end(self, seq_sections: bool, num_table_elems: int) -> int:
        """The byte offset a step's copy ends at: past A; past B when the sequence sections
        are copied; past the first num_table_elems of the block table when it is (B too)."""
        if num_table_elems:
            return self._table_start + num_table_elems * 4
        return self._end_b if seq_sections else self._end_a


class StepBuffers:
    """One flat buffer (pinned on the host when CUDA is present) and its Sections per layout.
    bucket: the capacity a token or sequence count rounds up to (SizePolicy.step_bucket); it may
    change later (the graph timing) but never beyond what it gives for the largest counts now."""

    def __init__(
        self,
        max_num_tokens: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        device: torch.device,
        pin: bool,
        bucket: Callable[[int], int],
        num_head_ids: int = 0,
        num_kv_groups: int = 1,
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self._num_kv_groups = num_kv_groups
        self.num_head_ids = num_head_ids = _align(num_head_ids * 8) // 8  # input_ids starts aligned
        self._max_num_blocks_per_req = max_num_blocks_per_req
        self.bucket = bucket  # few layouts: each new one costs ~0.1 ms of host per set to lay out
        largest = _offsets(
            num_head_ids,
            bucket(max_num_tokens),
            bucket(max_num_reqs),
            max_num_blocks_per_req,
            num_kv_groups,
        )
        self.flat = torch.zeros(
            largest["block_table"][1], dtype=torch.uint8, device=device, pin_memory=pin
        )
        on_host = self.flat.device.type == "cpu"
        self._flat_np = (
            self.flat.numpy() if on_host else None
        )  # sync-ok: a host tensor, at start-up
        self.head = self.flat[: num_head_ids * 8].view(torch.int64)  # [num_head_ids]
        self._head_np = self._flat_np[: num_head_ids * 8].view(np.int64) if on_host else None
        self.words = self.flat[num_head_ids * 8 :].view(
            torch.int32
        )  # what copy_from and stage-in copy
        self._sections: dict[tuple[int, int], Sections] = {}
        self._ranges: dict[int, torch.Tensor] = {}  # end -> bytes [end of the head, end)
        num_rows = max(bucket(max_num_tokens), bucket(max_num_reqs))
        # [largest T or S] int64: numpy on a host set, else a tensor on the set's device
        self.arange: Rows = (
            np.arange(num_rows, dtype=np.int64)
            if on_host
            else torch.arange(num_rows, device=self.flat.device)
        )

    def sections(self, num_tokens: int, num_seqs: int) -> Sections:
        """The layout for a step of these (already bucketed) counts."""
        key = (num_tokens, num_seqs)
        sections = self._sections.get(key)
        if sections is None:
            if len(self._sections) >= MAX_CACHED_LAYOUTS:  # the oldest layout goes
                del self._sections[next(iter(self._sections))]
            offsets = _offsets(
                self.num_head_ids,
                num_tokens,
                num_seqs,
                self._max_num_blocks_per_req,
                self._num_kv_groups,
            )
            sections = Sections(self.flat, self._flat_np, offsets, num_seqs)
            self._sections[key] = sections
        return sections

    def copy_from(self, src: StepBuffers, end: int) -> None:
        """Non-blocking copy of src's bytes [end of the head, end) (one CUDA call)."""
        self._range(end).copy_(src._range(end), non_blocking=True)

    def write_stage_header(self, end: int) -> None:
        """Host set: the header of ops/stage_in.py in the head, for the copy copy_from(self, end) would make."""
        self._head_np[0] = self.num_words(end)

    def num_words(self, end: int) -> int:
        """The int32 words (`words`) of bytes [end of the head, end): what copy_from(self, end) copies."""
        return (end - self.num_head_ids * 8) // 4

    def _range(self, end: int) -> torch.Tensor:
        view = self._ranges.get(end)
        if view is None:
            if len(self._ranges) >= MAX_CACHED_LAYOUTS:
                del self._ranges[next(iter(self._ranges))]
            view = self._ranges[end] = self.flat[self.num_head_ids * 8 : end]
        return view

    def pad_decode(
        self,
        sections: Sections,
        num_seqs: int,
        num_samples: int,
        seq_sections: bool,
        query_len: int = 1,
    ) -> None:
        """Rows [num_seqs, S) of a decode batch (query_len tokens per sequence: 1, or 1 + n for a
        uniform speculative step, spec_graphs.py) as padding, for a CUDA graph of S =
        sections.num_seqs sequences (its tokens [num_seqs x query_len, S x query_len)): token 0
        (input_src points at its input_ids entry) at
        position 0, slot -1 in every KV cache group (no KV write), seq_len 0 and no query (query_start_loc stays at the
        real tokens' end): the attention kernels skip such a sequence; last in decode_order, as the
        shortest. Sampling entries past num_samples name the head's scratch entries
        (max_num_reqs + i), where a graph's in-graph write of its argmax ids leaves the padding
        rows' ids. seq_sections: B is written too (else the device holds it). The host's step
        (numpy) and the graph capture and timing (all rows padding, num_seqs 0, on the device set)
        write padding through this one method."""
        pad, size = slice(num_seqs, sections.num_seqs), sections.num_seqs
        pad_tokens = slice(num_seqs * query_len, size * query_len)
        rows: Mapping[str, Rows] = sections.arrays or sections.tensors
        arange = self.arange
        rows["input_ids"][pad_tokens] = 0
        rows["positions"][pad_tokens] = 0
        groups_slots = rows["slot_mapping"].reshape(self._num_kv_groups, -1)  # [G, P]
        groups_slots[:, pad_tokens] = -1
        rows["seq_lens"][pad] = 0
        if not seq_sections:
            return
        # the real rows' end
        rows["query_start_loc"][num_seqs : size + 1] = num_seqs * query_len
        rows["decode_order"][pad] = arange[pad]
        rows["input_src"][pad_tokens] = arange[pad_tokens] + self.num_head_ids
        rows["sample_rows"][num_samples:size] = arange[num_samples:size] + self.max_num_reqs
