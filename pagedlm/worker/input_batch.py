"""Persistent per-request state (one row per request) and the host half of each step's ragged batch.

Rows: a request owns a row from its NewRequestData until it is named in finished_req_ids.
Invariant: token_ids_np[row, :num_tokens_np[row]] are the token values the host knows
(prompt + outputs received so far); a scheduled position at or past num_tokens_np[row] is a
placeholder for the token the previous step sampled on the device (async scheduling).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch

from pagedlm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedlm.worker.prompt_logprobs import PromptLogprobsPlan, plan_prompt_logprobs


def cdiv(a: int | np.ndarray, b: int) -> int | np.ndarray:
    return -(-a // b)


class StepBuffers:
    """One set of per-step input tensors, sized for the largest step. Host sets are pinned when
    CUDA is present (their numpy views are written by the batch builder); the device set is
    what the model reads, as slices."""

    def __init__(self, max_num_tokens: int, max_num_reqs: int, max_num_blocks_per_req: int,
                 device: torch.device, pin: bool) -> None:
        def make(size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device, pin_memory=pin)

        self.input_ids = make(max_num_tokens, torch.int64)  # [max_num_tokens]
        self.positions = make(max_num_tokens, torch.int64)  # [max_num_tokens]
        self.slot_mapping = make(max_num_tokens, torch.int64)  # [max_num_tokens]
        self.query_start_loc = make(max_num_reqs + 1, torch.int32)  # [max_num_reqs + 1]
        self.seq_lens = make(max_num_reqs, torch.int32)  # [max_num_reqs]
        # Flat: a step's block table is the contiguous prefix viewed as [num_seqs, num_cols].
        self.block_table = make(max_num_reqs * max_num_blocks_per_req, torch.int32)
        self.logits_indices = make(max_num_reqs, torch.int64)  # [max_num_reqs]
        self.sample_rows = make(max_num_reqs, torch.int64)  # [max_num_reqs]: rows that sample
        self.placeholder_idx = make(max_num_reqs, torch.int64)  # batch index of each placeholder
        self.placeholder_rows = make(max_num_reqs, torch.int64)  # its row

    def np(self, name: str) -> np.ndarray:
        """The numpy view of a host buffer (shares memory)."""
        return getattr(self, name).numpy()

    def pad_decode(self, num_seqs: int, num_padded: int) -> None:
        """Rows [num_seqs, num_padded) of a decode batch (one token per sequence) as padding,
        for a CUDA graph of num_padded sequences: token 0 at position 0, slot -1 (no KV write),
        seq_len 0 and no query (query_start_loc stays at num_seqs): the attention kernels skip
        such a sequence."""
        pad = slice(num_seqs, num_padded)
        self.np("input_ids")[pad] = 0
        self.np("positions")[pad] = 0
        self.np("slot_mapping")[pad] = -1
        self.np("seq_lens")[pad] = 0
        self.np("query_start_loc")[num_seqs + 1:num_padded + 1] = num_seqs

    def copy_from(self, src: StepBuffers, layout: BatchLayout, num_padded: int = 0) -> None:
        """Non-blocking copy of the used prefix of every buffer of src into self; num_padded:
        the token and sequence buffers of a decode batch padded (pad_decode) to that size."""
        num_tokens = max(layout.num_tokens, num_padded)
        num_seqs = max(layout.num_seqs, num_padded)
        sizes = {
            "input_ids": num_tokens, "positions": num_tokens, "slot_mapping": num_tokens,
            "query_start_loc": num_seqs + 1, "seq_lens": num_seqs,
            "block_table": layout.num_seqs * layout.num_block_cols,
            "logits_indices": layout.num_samples, "sample_rows": layout.num_samples,
            "placeholder_idx": layout.num_placeholders, "placeholder_rows": layout.num_placeholders,
        }
        for name, size in sizes.items():
            if size:
                getattr(self, name)[:size].copy_(getattr(src, name)[:size], non_blocking=True)


@dataclass(slots=True)
class EmbedsSpan:
    """Batch rows [batch_start, batch_start + length) take prompt_embeds rows from prompt_start."""

    row: int
    batch_start: int
    prompt_start: int
    length: int


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

    @property
    def num_samples(self) -> int:
        return len(self.sampling_req_ids)


class InputBatch:
    """Persistent rows of the requests on the worker (host numpy; see the module invariant)."""

    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_num_blocks_per_req = cdiv(max_model_len, block_size)
        num_rows, num_cols = max_num_reqs, self.max_num_blocks_per_req
        self.token_ids_np = np.zeros((num_rows, max_model_len), np.int32)
        self.num_tokens_np = np.zeros(num_rows, np.int32)
        self.num_prompt_tokens_np = np.zeros(num_rows, np.int32)
        self.num_computed_tokens_np = np.zeros(num_rows, np.int32)
        self.block_table_np = np.zeros((num_rows, num_cols), np.int32)
        self.num_blocks_np = np.zeros(num_rows, np.int32)
        self.num_logprobs_np = np.full(num_rows, -1, np.int32)
        self.num_prompt_logprobs_np = np.full(num_rows, -1, np.int32)
        self.pending_position_np = np.full(num_rows, -1, np.int32)  # sampled, value not yet seen
        self.epochs_np = np.zeros(num_rows, np.int64)  # bumped each time a row changes owner
        self.has_embeds_np = np.zeros(num_rows, bool)
        self.prompt_embeds: list[torch.Tensor | None] = [None] * num_rows  # [P, hidden], device
        self.req_ids: list[str | None] = [None] * num_rows
        self.req_id_to_row: dict[str, int] = {}
        self._free_rows = list(range(num_rows))  # a heap: the lowest free row goes first
        self._next_epoch = 1
        self.num_kv_blocks: int | None = None  # block ids must lie in [0, num_kv_blocks)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_row)

    def add_request(self, new: NewRequestData, prompt_embeds: torch.Tensor | None) -> int:
        """Give the request the lowest free row and fill it."""
        token_ids = new.prompt_token_ids + new.output_token_ids
        self._check_new(new, len(token_ids))
        row = heapq.heappop(self._free_rows)
        self.req_ids[row] = new.req_id
        self.req_id_to_row[new.req_id] = row
        self.token_ids_np[row, :len(token_ids)] = token_ids
        self.num_tokens_np[row] = len(token_ids)
        self.num_prompt_tokens_np[row] = len(new.prompt_token_ids)
        self.num_computed_tokens_np[row] = new.num_computed_tokens
        self.block_table_np[row] = 0
        self.num_blocks_np[row] = 0
        self._append_blocks(row, new.block_ids)
        logprobs = new.sampling_params.logprobs
        self.num_logprobs_np[row] = -1 if logprobs is None else logprobs
        prompt_logprobs = new.sampling_params.prompt_logprobs
        self.num_prompt_logprobs_np[row] = -1 if prompt_logprobs is None else prompt_logprobs
        self.pending_position_np[row] = -1
        self.epochs_np[row] = self._next_epoch
        self._next_epoch += 1
        self.prompt_embeds[row] = prompt_embeds
        self.has_embeds_np[row] = prompt_embeds is not None
        return row

    def _check_new(self, new: NewRequestData, num_tokens: int) -> None:
        if new.req_id in self.req_id_to_row:
            raise ValueError(f"new_reqs: request {new.req_id} is already on the worker")
        if num_tokens > self.max_model_len:
            raise ValueError(f"request {new.req_id}: {num_tokens} tokens exceed "
                             f"max_model_len={self.max_model_len}")
        if not self._free_rows:
            raise ValueError(f"request {new.req_id}: all max_num_seqs={self.max_num_reqs} rows "
                             "are taken")
        if new.num_computed_tokens > num_tokens:
            raise ValueError(f"request {new.req_id}: num_computed_tokens={new.num_computed_tokens} "
                             f"exceeds its {num_tokens} tokens")
        self._check_blocks(new.req_id, 0, new.block_ids)

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's row; None when it has none."""
        row = self.req_id_to_row.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        self.prompt_embeds[row] = None
        self.has_embeds_np[row] = False
        self.epochs_np[row] = 0
        heapq.heappush(self._free_rows, row)
        return row

    def update_request(self, cached: CachedRequestData) -> None:
        row = self.req_id_to_row.get(cached.req_id)
        if row is None:
            raise ValueError(f"cached_reqs: request {cached.req_id} is not on the worker")
        self._append_blocks(row, cached.new_block_ids)
        self.num_computed_tokens_np[row] = cached.num_computed_tokens

    def _append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks_np[row])
        self._check_blocks(self.req_ids[row], start, block_ids)
        self.block_table_np[row, start:start + len(block_ids)] = block_ids
        self.num_blocks_np[row] = start + len(block_ids)

    def _check_blocks(self, req_id: str | None, num_blocks: int, block_ids: list[int]) -> None:
        if num_blocks + len(block_ids) > self.max_num_blocks_per_req:
            raise ValueError(f"request {req_id}: {num_blocks + len(block_ids)} blocks exceed "
                             f"max_model_len / block_size = {self.max_num_blocks_per_req}")
        limit = self.num_kv_blocks
        if block_ids and limit is not None and not 0 <= min(block_ids) <= max(block_ids) < limit:
            raise ValueError(f"request {req_id}: block ids {block_ids[:8]} must lie in "
                             f"[0, num_blocks={limit})")

    def record_sampled(self, rows_np: np.ndarray, epochs_np: np.ndarray,
                       positions_np: np.ndarray, token_ids: list[int]) -> None:
        """Store tokens sampled by a past step, where their row still has the same owner and
        the token is the next one the host does not know yet."""
        for row, epoch, position, token_id in zip(rows_np.tolist(), epochs_np.tolist(),
                                                  positions_np.tolist(), token_ids):
            if self.epochs_np[row] != epoch or position != self.num_tokens_np[row]:
                continue
            if self.pending_position_np[row] == position:
                self.pending_position_np[row] = -1
            if position < self.max_model_len:
                self.token_ids_np[row, position] = token_id
                self.num_tokens_np[row] = position + 1

    def prepare(self, sched: SchedulerOutput, buf: StepBuffers) -> BatchLayout:
        """Lay the scheduled tokens out as one ragged batch in the host buffers of buf."""
        req_ids = list(sched.num_scheduled_tokens)
        rows = self._rows_of(req_ids)  # [B]
        num_scheduled = np.fromiter(sched.num_scheduled_tokens.values(), np.int32, len(req_ids))
        num_computed = self.num_computed_tokens_np[rows]  # [B]
        seq_lens = num_computed + num_scheduled  # [B]
        self._check_step(sched, req_ids, rows, num_scheduled, seq_lens)
        query_start_loc = np.zeros(len(req_ids) + 1, np.int32)
        np.cumsum(num_scheduled, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        token_req = np.repeat(np.arange(len(req_ids)), num_scheduled)  # [T]
        positions = num_computed[token_req] + np.arange(num_tokens) - query_start_loc[token_req]
        token_rows = rows[token_req]  # [T]
        self._fill_tokens(buf, token_rows, positions)
        num_block_cols = self._fill_seqs(buf, rows, query_start_loc, seq_lens)
        num_placeholders = self._fill_placeholders(buf, token_rows, positions)
        sample_idx = np.fromiter((b for b, r in enumerate(req_ids) if r in sched.sampling_req_ids),
                                 np.int64)  # [num_samples]: batch index of each sampling request
        sample_rows = rows[sample_idx]
        self._fill_sampling(buf, sample_rows, query_start_loc[sample_idx + 1] - 1)
        self.pending_position_np[sample_rows] = seq_lens[sample_idx]
        layout = BatchLayout(
            num_tokens=num_tokens, num_seqs=len(req_ids), max_query_len=int(num_scheduled.max()),
            max_seq_len=int(seq_lens.max()), num_block_cols=num_block_cols,
            num_placeholders=num_placeholders,
            sampling_req_ids=[req_ids[b] for b in sample_idx.tolist()],
            sample_rows_np=sample_rows, sample_epochs_np=self.epochs_np[sample_rows],
            sample_positions_np=seq_lens[sample_idx],
            sample_num_logprobs_np=self.num_logprobs_np[sample_rows],
            embeds_spans=self._embeds_spans(rows, query_start_loc, num_computed, num_scheduled),
            prompt_logprobs=plan_prompt_logprobs(
                req_ids, rows, self.num_prompt_logprobs_np[rows], self.num_prompt_tokens_np[rows],
                num_computed, num_scheduled, query_start_loc, self.token_ids_np))
        self.num_computed_tokens_np[rows] = seq_lens
        return layout

    def _rows_of(self, req_ids: list[str]) -> np.ndarray:
        missing = [r for r in req_ids if r not in self.req_id_to_row]
        if missing:
            raise ValueError(f"num_scheduled_tokens: requests {missing[:5]} are not on the worker")
        return np.fromiter((self.req_id_to_row[r] for r in req_ids), np.int32, len(req_ids))

    def _check_step(self, sched: SchedulerOutput, req_ids: list[str], rows: np.ndarray,
                    num_scheduled: np.ndarray, seq_lens: np.ndarray) -> None:
        if int(num_scheduled.sum()) != sched.total_num_scheduled_tokens:
            raise ValueError(f"total_num_scheduled_tokens={sched.total_num_scheduled_tokens} "
                             f"differs from the sum of num_scheduled_tokens ({num_scheduled.sum()})")
        if (num_scheduled < 1).any():
            raise ValueError("num_scheduled_tokens: every scheduled request needs at least 1 token")
        too_long = np.flatnonzero(seq_lens > self.max_model_len)
        if too_long.size:
            raise ValueError(f"request {req_ids[too_long[0]]}: sequence length "
                             f"{seq_lens[too_long[0]]} exceeds max_model_len={self.max_model_len}")
        short = np.flatnonzero(cdiv(seq_lens, self.block_size) > self.num_blocks_np[rows])
        if short.size:
            b = short[0]
            raise ValueError(f"request {req_ids[b]}: {self.num_blocks_np[rows[b]]} blocks hold "
                             f"fewer than its {seq_lens[b]} tokens (block_size={self.block_size})")

    def _fill_tokens(self, buf: StepBuffers, token_rows: np.ndarray, positions: np.ndarray) -> None:
        num_tokens = len(positions)
        block_ids = self.block_table_np[token_rows, positions // self.block_size]  # [T]
        buf.np("input_ids")[:num_tokens] = self.token_ids_np[token_rows, positions]
        buf.np("positions")[:num_tokens] = positions
        slots = buf.np("slot_mapping")[:num_tokens]
        np.multiply(block_ids, self.block_size, out=slots)
        slots += positions % self.block_size

    def _fill_seqs(self, buf: StepBuffers, rows: np.ndarray, query_start_loc: np.ndarray,
                   seq_lens: np.ndarray) -> int:
        """query_start_loc, seq_lens and the block table; returns its number of columns."""
        num_seqs = len(rows)
        num_cols = int(cdiv(seq_lens, self.block_size).max())
        buf.np("query_start_loc")[:num_seqs + 1] = query_start_loc
        buf.np("seq_lens")[:num_seqs] = seq_lens
        table = buf.np("block_table")[:num_seqs * num_cols].reshape(num_seqs, num_cols)
        table[:] = self.block_table_np[rows, :num_cols]
        return num_cols

    def _fill_placeholders(self, buf: StepBuffers, token_rows: np.ndarray,
                           positions: np.ndarray) -> int:
        """Input tokens whose value is still on the device: the last token sampled in the row."""
        idx = np.flatnonzero(positions >= self.num_tokens_np[token_rows])  # [num_placeholders]
        ph_rows = token_rows[idx]
        bad = np.flatnonzero(positions[idx] != self.pending_position_np[ph_rows])
        if bad.size:
            row, position = ph_rows[bad[0]], positions[idx[bad[0]]]
            raise ValueError(f"request {self.req_ids[row]}: position {position} is scheduled but "
                             "its token is neither known nor being sampled by the previous step")
        buf.np("placeholder_idx")[:len(idx)] = idx
        buf.np("placeholder_rows")[:len(idx)] = ph_rows
        return len(idx)

    @staticmethod
    def _fill_sampling(buf: StepBuffers, sample_rows: np.ndarray, logits_indices: np.ndarray) -> None:
        """Logits rows (the last token of each sampling request) and the rows they sample for."""
        buf.np("logits_indices")[:len(sample_rows)] = logits_indices
        buf.np("sample_rows")[:len(sample_rows)] = sample_rows

    def _embeds_spans(self, rows: np.ndarray, query_start_loc: np.ndarray,
                      num_computed: np.ndarray, num_scheduled: np.ndarray) -> list[EmbedsSpan]:
        """Scheduled prompt positions of requests that came with prompt_embeds."""
        num_prompt = self.num_prompt_tokens_np[rows]
        batch_idx = np.flatnonzero(self.has_embeds_np[rows] & (num_computed < num_prompt))
        return [EmbedsSpan(row=int(rows[b]), batch_start=int(query_start_loc[b]),
                           prompt_start=int(num_computed[b]),
                           length=int(min(num_scheduled[b], num_prompt[b] - num_computed[b])))
                for b in batch_idx.tolist()]
