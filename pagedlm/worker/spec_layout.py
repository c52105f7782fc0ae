"""The host half of a step that verifies drafts (SchedulerOutput.num_draft_tokens): where the
drafts sit in the batch, where they come from in the DraftStore and which hidden rows give logits.

A request with n drafts was scheduled 1 + n positions: its last known token, then the n draft
positions, whose input ids the device fills from the DraftStore (row * k + j). Every sampling
request has 1 + n logits rows (n = 0: the one row of a plain sample), in batch order: the rows
of the rejection sampler (spec_decode/rejection_sampler.py), whose request r emits its tokens at
sequence positions first_positions[r] + j.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class SpecLayout:
    num_drafts_np: np.ndarray  # [N] int64: drafts of each sampling request (batch order)
    logits_start_np: np.ndarray  # [N] int64: its first logits row
    num_logits_rows: int  # T_l = N + D
    num_draft_tokens: int  # D
    # [D | D | T_l | N | N] int64, one upload: the drafts' batch token indices, their DraftStore
    # indices, the hidden rows of the logits, the cumulative draft counts, logits_start
    packed_np: np.ndarray


def draft_token_mask(
    num_drafts_b: np.ndarray, seq_lens: np.ndarray, num_scheduled: np.ndarray, positions: np.ndarray
) -> np.ndarray:
    """[T] bool: the batch tokens that are drafts (the last num_drafts_b [B] of each query)."""
    first_draft = np.repeat(seq_lens - num_drafts_b, num_scheduled)  # [T]
    return positions >= first_draft


def spec_layout(
    num_drafts_b: np.ndarray,
    query_start_loc: np.ndarray,
    sample_batch_idx: np.ndarray,
    rows: np.ndarray,
    k: int,
) -> SpecLayout:
    """num_drafts_b [B] (0 for requests without drafts), query_start_loc [B + 1], the sampling
    requests' batch indices [N], rows [B] persistent rows; k: the DraftStore's width."""
    query_ends = query_start_loc[1:].astype(np.int64)  # [B]
    num_drafts = num_drafts_b[sample_batch_idx].astype(np.int64)  # [N]
    num_logits = num_drafts + 1  # [N]
    logits_start = np.zeros(num_drafts.size, np.int64)
    np.cumsum(num_logits[:-1], out=logits_start[1:])
    num_logits_rows = int(num_logits.sum())
    # each logits row t: its request's batch index and its offset j in 0..n
    request_of_row = np.repeat(np.arange(num_drafts.size), num_logits)  # [T_l]
    offset = np.arange(num_logits_rows) - logits_start[request_of_row]  # [T_l]
    batch_of_row = sample_batch_idx[request_of_row]
    logits_idx = query_ends[batch_of_row] - 1 - num_drafts[request_of_row] + offset  # [T_l]
    is_draft_row = offset < num_drafts[request_of_row]  # a draft row reads draft j = offset
    draft_batch = batch_of_row[is_draft_row]  # [D]
    draft_offset = offset[is_draft_row]
    draft_token_idx = query_ends[draft_batch] - num_drafts_b[draft_batch] + draft_offset  # [D]
    draft_src = rows[draft_batch].astype(np.int64) * k + draft_offset  # [D]
    packed = np.concatenate(
        [draft_token_idx, draft_src, logits_idx, np.cumsum(num_drafts), logits_start]
    )
    return SpecLayout(
        num_drafts_np=num_drafts,
        logits_start_np=logits_start,
        num_logits_rows=num_logits_rows,
        num_draft_tokens=int(num_drafts.sum()),
        packed_np=packed.astype(np.int64),
    )


def drafts_before_index(num_drafts_np: np.ndarray, offsets_np: np.ndarray, k: int) -> np.ndarray:
    """[T_l, k] int64: per logits row (its request r, its offset j in 0..n_r: offsets_np
    [T_l]), the indices in the D drafts of r's drafts before j, then D (no draft);
    num_drafts_np [N] as SpecLayout's."""
    first_draft = np.cumsum(num_drafts_np) - num_drafts_np  # [N]
    first_draft = np.repeat(first_draft, num_drafts_np + 1)  # [T_l]
    columns = np.arange(k)[None, :]  # [1, k]
    index = first_draft[:, None] + columns  # [T_l, k]
    return np.where(columns < offsets_np[:, None], index, int(num_drafts_np.sum())).astype(np.int64)
