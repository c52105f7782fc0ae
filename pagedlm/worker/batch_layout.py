"""The host-side description of one step's ragged batch (what InputBatch.prepare returns) and
the token layout it is built from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedlm.worker.prompt_logprobs import PromptLogprobsPlan
from pagedlm.worker.spec_layout import SpecLayout


@dataclass(slots=True)
class EmbedsSpan:
    """Batch rows [batch_start, batch_start + length) take prompt_embeds rows from prompt_start."""

    row: int
    batch_start: int
    prompt_start: int
    length: int


@dataclass(slots=True)
class Ragged:
    """The token layout of one step: B requests, T tokens."""

    rows: np.ndarray  # [B] int32
    query_start_loc: np.ndarray  # [B + 1] int32
    num_computed: np.ndarray  # [B] int32: tokens before this step
    num_scheduled: np.ndarray  # [B] int32
    seq_lens: np.ndarray  # [B] int32
    token_rows: np.ndarray  # [T] int32: the row of each token
    positions: np.ndarray  # [T]


def leading_decodes(num_scheduled: np.ndarray) -> int:
    """How many sequences at the front of the batch ([B] query tokens each) have one query token."""
    not_one = num_scheduled != 1
    return int(not_one.argmax()) if not_one.any() else num_scheduled.size


@dataclass(slots=True)
class Samples:
    """The requests that sample this step, in batch order."""

    req_ids: list[str]
    batch_idx: np.ndarray | None  # [N] batch index of each; None: every request samples
    rows_np: np.ndarray  # [N] int32
    positions_np: np.ndarray  # [N] int32: where each sampled token lands (its seq_len)


@dataclass(slots=True)
class BatchLayout:
    """Host-side facts about one step's ragged batch (no device access needed)."""

    num_tokens: int
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    num_block_cols: int
    num_placeholders: int
    sampling_req_ids: list[str]  # in batch order
    sample_rows_np: np.ndarray  # [num_samples] int32
    sample_epochs_np: np.ndarray  # [num_samples] int64: row owner at sampling time
    sample_positions_np: np.ndarray  # [num_samples] int32: where each sampled token lands
    sample_num_logprobs_np: np.ndarray  # [num_samples] int32: -1 = not asked
    embeds_spans: list[EmbedsSpan]
    prompt_logprobs: PromptLogprobsPlan | None = None  # None: no request asks this step
    rows_version: int = 0  # InputBatch.rows_version when laid out
    # The section capacities of the step's layout (StepBuffers): the counts rounded up to a
    # bucket (for a decode step within the CUDA-graph sizes: the graph's padded size).
    bucket_tokens: int = 0
    bucket_seqs: int = 0
    # Sections equal to the previous step's, left unwritten in the staging set (query_start_loc
    # excepted: the host metadata reads it) and not copied: the device buffers hold them.
    # The sequence sections (query_start_loc, decode_order, logits_indices, sample_rows,
    # input_src) are reused only with the block table: a copy of the table covers them.
    reuse_seq_sections: bool = False
    reuse_block_table: bool = False
    # The leading sequences with one query token each (all of them in a decode-only batch): the
    # attention kernels' decode path, launched in decode_order.
    num_decodes: int = 0
    spec: SpecLayout | None = None  # the drafts this step verifies (None: no drafts)
    # 1 + n when every request is scheduled 1 + n positions, n >= 1 of them drafts, and samples
    # (a uniform speculative step, laid out for spec_graphs.py); else 0
    uniform_query_len: int = 0
    sample_batch_idx_np: np.ndarray | None = None  # [num_samples]; None: every request samples
    num_kv_groups: int = 1  # block tables per request (worker/group_tables.py)

    @property
    def num_samples(self) -> int:
        return len(self.sampling_req_ids)

    @property
    def samples_every_token(self) -> bool:
        """One token per request and every request samples: logits rows are 0..num_tokens-1."""
        return len(self.sampling_req_ids) == self.num_tokens

    @property
    def num_table_elems_to_copy(self) -> int:
        """Block-table entries the step copies: 0 when it reuses the device's."""
        if self.reuse_block_table:
            return 0
        return self.num_kv_groups * self.num_seqs * self.num_block_cols


@dataclass(slots=True)
class StepKey:
    """What a step's reusable sections depend on."""

    rows_version: int  # InputBatch.rows_version at the step
    req_ids: list[str]  # batch order
    rows_np: np.ndarray  # [B] int32: the previous step's own array when its rows are the same
    steady: bool  # decode, every request samples, placeholders all or none
    num_placeholders: int
    blocks_version: int
    num_block_cols: int
    bucket_tokens: int  # the layout's token capacity (the sections' offsets depend on it)

    def reuses_seq_sections(self, previous: StepKey | None) -> bool:
        """Same rows in the same order (the previous step's rows array itself), both steady,
        the same placeholders."""
        return (
            previous is not None
            and previous.rows_np is self.rows_np
            and self.steady
            and previous.steady
            and previous.num_placeholders == self.num_placeholders
        )

    def reuses_block_table(self, previous: StepKey | None) -> bool:
        """Same rows in the same order (so as many sequences), the same layout, no block added
        since, as many columns."""
        return (
            previous is not None
            and previous.rows_np is self.rows_np
            and previous.bucket_tokens == self.bucket_tokens
            and previous.blocks_version == self.blocks_version
            and previous.num_block_cols == self.num_block_cols
        )
