"""The host-side description of one step's ragged batch (what InputBatch.prepare returns) and
the token layout it is built from."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedlm.worker.prompt_logprobs import PromptLogprobsPlan


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
    # Sections equal to the previous step's, left unwritten in the staging set (query_start_loc
    # excepted: the host metadata reads it) and not copied: the device buffers hold them.
    # The sequence sections: query_start_loc, logits_indices, sample_rows, placeholder_*, decode_order.
    reuse_seq_sections: bool = False
    reuse_block_table: bool = False

    @property
    def num_samples(self) -> int:
        return len(self.sampling_req_ids)

    @property
    def decode_only(self) -> bool:
        """At most one query token per sequence: the attention kernels' decode path, launched in
        decode_order."""
        return self.max_query_len <= 1

    @property
    def samples_every_token(self) -> bool:
        """One token per request and every request samples: logits rows are 0..num_tokens-1."""
        return len(self.sampling_req_ids) == self.num_tokens

    def copy_sizes(self, num_padded: int = 0) -> dict[str, int]:
        """The sections the device needs from this step's staging set, with their used lengths;
        num_padded: a decode batch padded (pad_decode) to that many sequences."""
        num_tokens = max(self.num_tokens, num_padded)
        num_seqs = max(self.num_seqs, num_padded)
        sizes = {"positions": num_tokens, "slot_mapping": num_tokens, "seq_lens": num_seqs}
        if self.num_placeholders < self.num_tokens:  # else every input id comes from the device
            sizes["input_ids"] = num_tokens
        if not self.reuse_seq_sections:
            sizes.update(query_start_loc=num_seqs + 1, logits_indices=self.num_samples,
                         sample_rows=self.num_samples, placeholder_idx=self.num_placeholders,
                         placeholder_rows=self.num_placeholders,
                         decode_order=num_seqs if self.decode_only else 0)
        if not self.reuse_block_table:
            sizes["block_table"] = self.num_seqs * self.num_block_cols
        return sizes


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

    def reuses_seq_sections(self, previous: StepKey | None) -> bool:
        """Same rows in the same order (the previous step's rows array itself), both steady,
        the same placeholders."""
        return (previous is not None and previous.rows_np is self.rows_np and self.steady
                and previous.steady and previous.num_placeholders == self.num_placeholders)

    def reuses_block_table(self, previous: StepKey | None) -> bool:
        """Same rows in the same order, no block added since, as many columns."""
        return (previous is not None and previous.rows_np is self.rows_np
                and previous.blocks_version == self.blocks_version
                and previous.num_block_cols == self.num_block_cols)
