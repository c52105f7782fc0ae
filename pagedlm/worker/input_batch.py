"""Persistent per-request state (one row per request) and the host half of each step's ragged batch.

Rows: a request owns a row from its NewRequestData until it is named in finished_req_ids.
Invariant: token_ids_np[row, :num_tokens_np[row]] are the token values the host knows
(prompt + outputs received so far); a scheduled position at or past num_tokens_np[row] is a
placeholder for the token the previous step sampled on the device (async scheduling).

Steady decode: a step that schedules one token for each of the same requests, in the same
order and rows, as the step before has the same query_start_loc, logits rows, sampling rows,
input sources and decode order (every length grew by one) as that step, and the same block
table while no block was added; prepare() marks those sections reused, and the device buffers,
which still hold them, are not rewritten (the sequence sections only with the block table:
step_buffers.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import torch

from pagedlm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedlm.worker.batch_layout import (
    BatchLayout,
    EmbedsSpan,
    Ragged,
    Samples,
    StepKey,
    leading_decodes,
)
from pagedlm.worker.group_tables import GroupBlockTables
from pagedlm.worker.prompt_logprobs import PromptLogprobsPlan, plan_prompt_logprobs
from pagedlm.worker.spec_layout import SpecLayout, draft_token_mask, spec_layout
from pagedlm.worker.step_buffers import StepBuffers


def cdiv(a: int | np.ndarray, b: int) -> int | np.ndarray:
    return -(-a // b)


def uniform_query_len(
    num_drafts_b: np.ndarray | None, num_tokens: int, every_request_samples: bool
) -> int:
    """1 + n when each of the B requests ([B] num_drafts_b) verifies n >= 1 drafts, is scheduled
    1 + n positions (num_tokens = B x (1 + n)) and samples; else 0."""
    if num_drafts_b is None or not every_request_samples:
        return 0
    n = int(num_drafts_b[0])
    uniform = n > 0 and num_tokens == num_drafts_b.size * (1 + n)
    return 1 + n if uniform and (num_drafts_b == n).all() else 0


class InputBatch:
    """Persistent rows of the requests on the worker (host numpy; see the module invariant)."""

    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        block_size: int,
        spec_k: int = 0,
        uniform_bucket: Callable[[int, int], int] | None = None,
        num_kv_groups: int = 1,
    ) -> None:
        """spec_k: the drafts a request may verify in a step (the DraftStore's width);
        uniform_bucket(graph_seqs, query_len): the token capacity of a uniform speculative step
        (SizePolicy.uniform_tokens_bucket; None: such steps bucket as any other); num_kv_groups:
        block tables a request has (core/kv_groups.py; groups 1.. in group_tables)."""
        self.max_num_reqs = max_num_reqs
        self.spec_k = spec_k
        self._uniform_bucket = uniform_bucket
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
        # leading entries pointed to the null block (out of a sliding window), cached_reqs' count
        self.num_null_blocks_np = np.zeros(num_rows, np.int32)
        self.group_tables = (
            GroupBlockTables(num_kv_groups - 1, num_rows, num_cols) if num_kv_groups > 1 else None
        )
        self.num_logprobs_np = np.full(num_rows, -1, np.int32)
        self.num_prompt_logprobs_np = np.full(num_rows, -1, np.int32)
        # the position a step in flight samples into (valid while >= num_tokens_np[row])
        self.pending_position_np = np.full(num_rows, -1, np.int32)
        self.epochs_np = np.zeros(num_rows, np.int64)  # bumped each time a row changes owner
        self.has_embeds_np = np.zeros(num_rows, bool)
        self.prompt_embeds: list[torch.Tensor | None] = [None] * num_rows  # [P, hidden], device
        self.req_ids: list[str | None] = [None] * num_rows
        self.req_id_to_row: dict[str, int] = {}
        self._free_rows = list(range(num_rows))  # a heap: the lowest free row goes first
        self._next_epoch = 1
        self.num_kv_blocks: int | None = None  # block ids must lie in [0, num_kv_blocks)
        self._arange_np = np.arange(max_num_reqs + 1, dtype=np.int32)
        self._ones_np = np.ones(max_num_reqs, dtype=np.int32)
        self._num_rows_with_embeds = 0
        self._num_rows_with_prompt_logprobs = 0
        self.rows_version = 0  # bumped when a row changes owner
        self._blocks_version = 0  # bumped when a row's blocks change
        self._previous: StepKey | None = None  # the last prepared step

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_row)

    def forget_previous_step(self) -> None:
        """The device buffers were written outside the steps (graph capture), or a step that failed
        may not have written them (a staged graph copies its own inputs): the next step reuses nothing."""
        self._previous = None

    def add_request(self, new: NewRequestData, prompt_embeds: torch.Tensor | None) -> int:
        """Give the request the lowest free row and fill it."""
        token_ids = new.prompt_token_ids + new.output_token_ids
        self._check_new(new, len(token_ids))
        row = heapq.heappop(self._free_rows)
        self.req_ids[row] = new.req_id
        self.req_id_to_row[new.req_id] = row
        self.token_ids_np[row, : len(token_ids)] = token_ids
        self.num_tokens_np[row] = len(token_ids)
        self.num_prompt_tokens_np[row] = len(new.prompt_token_ids)
        self.num_computed_tokens_np[row] = new.num_computed_tokens
        self.block_table_np[row] = 0
        self.num_blocks_np[row] = 0
        self.num_null_blocks_np[row] = 0
        self._append_blocks(row, new.block_ids)
        if self.group_tables is not None:
            for block_ids in new.group_block_ids:
                self._check_blocks(new.req_id, 0, block_ids)
            self.group_tables.add(row, new.group_block_ids)
        logprobs = new.sampling_params.logprobs
        self.num_logprobs_np[row] = -1 if logprobs is None else logprobs
        prompt_logprobs = new.sampling_params.prompt_logprobs
        self.num_prompt_logprobs_np[row] = -1 if prompt_logprobs is None else prompt_logprobs
        self._num_rows_with_prompt_logprobs += prompt_logprobs is not None
        self.pending_position_np[row] = -1
        self.epochs_np[row] = self._next_epoch
        self._next_epoch += 1
        self.prompt_embeds[row] = prompt_embeds
        self.has_embeds_np[row] = prompt_embeds is not None
        self._num_rows_with_embeds += prompt_embeds is not None
        self.rows_version += 1
        return row

    def _check_new(self, new: NewRequestData, num_tokens: int) -> None:
        if new.req_id in self.req_id_to_row:
            raise ValueError(f"new_reqs: request {new.req_id} is already on the worker")
        assert num_tokens <= self.max_model_len, (
            f"request {new.req_id}: {num_tokens} tokens exceed max_model_len={self.max_model_len} "
            "(checked at the engine boundary: llm_engine.fit_context)"
        )
        if not self._free_rows:
            raise ValueError(
                f"request {new.req_id}: all max_num_seqs={self.max_num_reqs} rows are taken"
            )
        if new.num_computed_tokens > num_tokens:
            raise ValueError(
                f"request {new.req_id}: num_computed_tokens={new.num_computed_tokens} "
                f"exceeds its {num_tokens} tokens"
            )
        self._check_blocks(new.req_id, 0, new.block_ids)

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's row; None when it has none."""
        row = self.req_id_to_row.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        self.prompt_embeds[row] = None
        self._num_rows_with_embeds -= bool(self.has_embeds_np[row])
        self._num_rows_with_prompt_logprobs -= bool(self.num_prompt_logprobs_np[row] >= 0)
        self.has_embeds_np[row] = False
        self.num_prompt_logprobs_np[row] = -1
        self.epochs_np[row] = 0
        heapq.heappush(self._free_rows, row)
        self.rows_version += 1
        return row

    def update_request(self, cached: CachedRequestData) -> None:
        row = self.req_id_to_row.get(cached.req_id)
        if row is None:
            raise ValueError(f"cached_reqs: request {cached.req_id} is not on the worker")
        if cached.num_null_blocks > self.num_null_blocks_np[row]:
            self._null_blocks(row, cached.num_null_blocks)
        if cached.num_blocks is not None:
            self._trim_blocks(row, cached.num_blocks - len(cached.new_block_ids))
        if cached.new_block_ids:
            self._append_blocks(row, cached.new_block_ids)
        if self.group_tables is not None and cached.groups:  # () changes nothing
            for update in cached.groups:
                self._check_blocks(cached.req_id, update.num_blocks, [])
                self._check_blocks(cached.req_id, 0, update.new_block_ids)
            self._blocks_version += self.group_tables.update(row, cached.groups)
        self.num_computed_tokens_np[row] = cached.num_computed_tokens

    def _null_blocks(self, row: int, num_null: int) -> None:
        """The row's first num_null blocks went back to the pool: point them to the null block."""
        if num_null > self.num_blocks_np[row]:
            raise ValueError(
                f"request {self.req_ids[row]}: num_null_blocks={num_null} exceeds its "
                f"{self.num_blocks_np[row]} blocks"
            )
        self.block_table_np[row, self.num_null_blocks_np[row] : num_null] = 0
        self.num_null_blocks_np[row] = num_null
        self._blocks_version += 1

    def _trim_blocks(self, row: int, num_blocks: int) -> None:
        """The row keeps its first num_blocks blocks (the planner freed the rest)."""
        if num_blocks < self.num_blocks_np[row]:
            if num_blocks < self.num_null_blocks_np[row]:
                raise ValueError(
                    f"request {self.req_ids[row]}: num_blocks={num_blocks} is below its "
                    f"{self.num_null_blocks_np[row]} null blocks"
                )
            self.num_blocks_np[row] = num_blocks
            self._blocks_version += 1

    def _append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks_np[row])
        self._check_blocks(self.req_ids[row], start, block_ids)
        self.block_table_np[row, start : start + len(block_ids)] = block_ids
        self.num_blocks_np[row] = start + len(block_ids)
        self._blocks_version += 1

    def _check_blocks(self, req_id: str | None, num_blocks: int, block_ids: list[int]) -> None:
        if num_blocks + len(block_ids) > self.max_num_blocks_per_req:
            raise ValueError(
                f"request {req_id}: {num_blocks + len(block_ids)} blocks exceed "
                f"max_model_len / block_size = {self.max_num_blocks_per_req}"
            )
        limit = self.num_kv_blocks
        if block_ids and limit is not None and not 0 <= min(block_ids) <= max(block_ids) < limit:
            raise ValueError(
                f"request {req_id}: block ids {block_ids[:8]} must lie in [0, num_blocks={limit})"
            )

    def record_sampled(
        self,
        layout: BatchLayout,
        token_ids_np: np.ndarray,
        num_emitted_np: np.ndarray | None = None,
    ) -> None:
        """Store the tokens [N] a past step sampled, where their row still has the same owner
        and the token is the next one the host does not know yet (and fits in the row). A row's
        pending position needs no reset: it now lies below num_tokens_np[row]. With
        num_emitted_np [N] (speculative decoding), token_ids_np is [N, K + 1]: request i emitted
        its first num_emitted_np[i] tokens."""
        if num_emitted_np is not None:
            self._record_emitted(layout, token_ids_np, num_emitted_np)
            return
        rows_np, positions_np = layout.sample_rows_np, layout.sample_positions_np  # [N] each
        stored = positions_np == self.num_tokens_np.take(rows_np)  # [N]
        if layout.rows_version != self.rows_version:  # a row may have changed owner since
            stored &= self.epochs_np.take(rows_np) == layout.sample_epochs_np
        if layout.max_seq_len >= self.max_model_len:  # a full row keeps its last token unstored
            stored &= positions_np < self.max_model_len
        if np.count_nonzero(stored) < stored.size:
            rows_np, positions_np, token_ids_np = (
                rows_np[stored],
                positions_np[stored],
                token_ids_np[stored],
            )
        self.token_ids_np[rows_np, positions_np] = token_ids_np
        self.num_tokens_np[rows_np] = positions_np + 1

    def _record_emitted(
        self, layout: BatchLayout, token_ids_np: np.ndarray, num_emitted_np: np.ndarray
    ) -> None:
        """record_sampled's speculative case: where the first token would be stored, each
        emitted token j at sample position + j, within the row."""
        rows_np, first_np = layout.sample_rows_np, layout.sample_positions_np  # [N] each
        stored = first_np == self.num_tokens_np.take(rows_np)
        stored &= self.epochs_np.take(rows_np) == layout.sample_epochs_np
        idx = np.flatnonzero(stored)
        rows_np, first_np = rows_np[idx], first_np[idx]  # [M]
        num_np = np.minimum(num_emitted_np[idx], self.max_model_len - first_np)  # [M]
        offsets = np.arange(token_ids_np.shape[1])  # [K + 1]
        emitted = offsets[None, :] < num_np[:, None]  # [M, K + 1]
        positions = first_np[:, None] + offsets[None, :]
        at_rows = np.broadcast_to(rows_np[:, None], positions.shape)
        self.token_ids_np[at_rows[emitted], positions[emitted]] = token_ids_np[idx][emitted]
        self.num_tokens_np[rows_np] = first_np + num_np

    def prepare(self, sched: SchedulerOutput, buf: StepBuffers) -> BatchLayout:
        """Lay the scheduled tokens out as one ragged batch in the host buffers of buf."""
        previous, self._previous = self._previous, None  # kept only once this step is laid out
        req_ids = list(sched.num_scheduled_tokens)
        num_seqs = len(req_ids)
        num_tokens = self._check_counts(sched, num_seqs)
        if (
            previous is not None
            and previous.rows_version == self.rows_version
            and previous.req_ids == req_ids
        ):
            rows = previous.rows_np  # [B]: the same array marks the same rows
        else:
            rows = self._rows_of(req_ids)
        ragged = self._ragged(sched, rows, num_tokens)
        max_seq_len = self._check_lengths(req_ids, rows, ragged.seq_lens)
        num_drafts_b = self._num_drafts_b(sched, req_ids)  # [B]; None: no drafts this step
        placeholder_idx = self._placeholders(ragged, num_drafts_b)  # [num_placeholders]
        num_placeholders = placeholder_idx.size
        samples = self._samples(sched, req_ids, rows, ragged.seq_lens)
        spec = None if num_drafts_b is None else self._spec_layout(num_drafts_b, ragged, samples)
        query_len = uniform_query_len(num_drafts_b, num_tokens, samples.batch_idx is None)
        uniform_tokens = 0  # a uniform step's layout is its graph's (spec_graphs.py)
        if query_len and self._uniform_bucket is not None:
            uniform_tokens = self._uniform_bucket(buf.bucket(num_seqs), query_len)
        bucket_tokens = uniform_tokens or buf.bucket(num_tokens)
        key = StepKey(
            self.rows_version,
            req_ids,
            rows,
            steady=(
                num_tokens == num_seqs == len(samples.req_ids)
                and num_placeholders in (0, num_tokens)
            ),
            num_placeholders=num_placeholders,
            blocks_version=self._blocks_version,
            num_block_cols=int(cdiv(max_seq_len, self.block_size)),
            bucket_tokens=bucket_tokens,
        )
        reuse_block_table = key.reuses_block_table(previous)
        layout = BatchLayout(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_query_len=1 if num_tokens == num_seqs else int(ragged.num_scheduled.max()),
            max_seq_len=max_seq_len,
            num_block_cols=key.num_block_cols,
            num_placeholders=num_placeholders,
            sampling_req_ids=samples.req_ids,
            sample_rows_np=samples.rows_np,
            sample_epochs_np=self.epochs_np.take(samples.rows_np),
            sample_positions_np=samples.positions_np,
            sample_num_logprobs_np=self.num_logprobs_np.take(samples.rows_np),
            embeds_spans=self._embeds_spans(rows, ragged),
            prompt_logprobs=self._plan_prompt_logprobs(req_ids, rows, ragged),
            rows_version=self.rows_version,
            bucket_tokens=bucket_tokens,
            bucket_seqs=buf.bucket(num_seqs),
            reuse_seq_sections=reuse_block_table and key.reuses_seq_sections(previous),
            reuse_block_table=reuse_block_table,
            num_decodes=num_seqs
            if num_tokens == num_seqs
            else leading_decodes(ragged.num_scheduled),
            spec=spec,
            sample_batch_idx_np=samples.batch_idx,
            uniform_query_len=query_len,
            num_kv_groups=1 if self.group_tables is None else 1 + self.group_tables.num_groups,
        )
        self._fill(buf, layout, ragged, samples, placeholder_idx)
        self.pending_position_np[samples.rows_np] = samples.positions_np
        self.num_computed_tokens_np[rows] = ragged.seq_lens
        self._previous = key
        return layout

    def _check_counts(self, sched: SchedulerOutput, num_seqs: int) -> int:
        """The step's number of tokens, after checking the per-request counts."""
        counts = sched.num_scheduled_tokens.values()
        num_tokens = sched.total_num_scheduled_tokens
        if num_seqs and min(counts) < 1:
            raise ValueError("num_scheduled_tokens: every scheduled request needs at least 1 token")
        if sum(counts) != num_tokens:
            raise ValueError(
                f"total_num_scheduled_tokens={num_tokens} differs from the sum of "
                f"num_scheduled_tokens ({sum(counts)})"
            )
        if not sched.sampling_req_ids <= sched.num_scheduled_tokens.keys():
            extra = sorted(sched.sampling_req_ids - sched.num_scheduled_tokens.keys())
            raise ValueError(f"sampling_req_ids: requests {extra[:5]} are not scheduled")
        return num_tokens

    def _rows_of(self, req_ids: list[str]) -> np.ndarray:
        try:
            return np.fromiter((self.req_id_to_row[r] for r in req_ids), np.int32, len(req_ids))
        except KeyError:
            missing = [r for r in req_ids if r not in self.req_id_to_row]
            raise ValueError(
                f"num_scheduled_tokens: requests {missing[:5]} are not on the worker"
            ) from None

    def _ragged(self, sched: SchedulerOutput, rows: np.ndarray, num_tokens: int) -> Ragged:
        num_seqs = len(rows)
        num_computed = self.num_computed_tokens_np.take(rows)  # [B]
        if num_tokens == num_seqs:  # one token per request (decodes)
            return Ragged(
                rows,
                self._arange_np[: num_seqs + 1],
                num_computed,
                self._ones_np[:num_seqs],
                num_computed + 1,
                rows,
                num_computed,
            )
        num_scheduled = np.fromiter(sched.num_scheduled_tokens.values(), np.int32, num_seqs)
        query_start_loc = np.zeros(num_seqs + 1, np.int32)
        np.cumsum(num_scheduled, out=query_start_loc[1:])
        token_req = np.repeat(np.arange(num_seqs), num_scheduled)  # [T]
        positions = num_computed[token_req] + np.arange(num_tokens) - query_start_loc[token_req]
        return Ragged(
            rows,
            query_start_loc,
            num_computed,
            num_scheduled,
            num_computed + num_scheduled,
            rows[token_req],
            positions,
        )

    def _check_lengths(self, req_ids: list[str], rows: np.ndarray, seq_lens: np.ndarray) -> int:
        """The longest sequence, after checking every one fits its blocks (and max_model_len, which
        llm_engine.fit_context ensures at the engine boundary)."""
        max_seq_len = int(seq_lens.max())
        assert max_seq_len <= self.max_model_len, (
            f"sequence length {max_seq_len} exceeds max_model_len={self.max_model_len} "
            "(checked at the engine boundary: llm_engine.fit_context)"
        )
        short = seq_lens > self.num_blocks_np.take(rows) * self.block_size  # [B]
        if np.count_nonzero(short):
            b = int(np.argmax(short))
            raise ValueError(
                f"request {req_ids[b]}: {self.num_blocks_np[rows[b]]} blocks hold "
                f"fewer than its {seq_lens[b]} tokens (block_size={self.block_size})"
            )
        return max_seq_len

    def _num_drafts_b(self, sched: SchedulerOutput, req_ids: list[str]) -> np.ndarray | None:
        """[B] int64: the drafts each scheduled request verifies; None when none does."""
        drafts = sched.num_draft_tokens
        if not drafts:
            return None
        if not drafts.keys() <= sched.sampling_req_ids or max(drafts.values()) > self.spec_k:
            raise ValueError(
                f"num_draft_tokens: {drafts} must name sampling requests, at most "
                f"{self.spec_k} drafts each"
            )
        return np.fromiter((drafts.get(r, 0) for r in req_ids), np.int64, len(req_ids))

    def _spec_layout(
        self, num_drafts_b: np.ndarray, ragged: Ragged, samples: Samples
    ) -> SpecLayout:
        """The drafts' layout; a drafting request's tokens land from its first draft position."""
        batch_idx = samples.batch_idx
        if batch_idx is None:
            batch_idx = np.arange(len(samples.req_ids))
        samples.positions_np = samples.positions_np - num_drafts_b[batch_idx]
        return spec_layout(
            num_drafts_b, ragged.query_start_loc, batch_idx, ragged.rows, self.spec_k
        )

    def _placeholders(self, ragged: Ragged, num_drafts_b: np.ndarray | None) -> np.ndarray:
        """[num_placeholders] batch indices of the input tokens whose value is still on the
        device (the last token sampled in the row); draft positions are not placeholders."""
        token_rows, positions = ragged.token_rows, ragged.positions
        unknown = positions >= self.num_tokens_np.take(token_rows)
        if num_drafts_b is not None:
            unknown &= ~draft_token_mask(
                num_drafts_b, ragged.seq_lens, ragged.num_scheduled, positions
            )
        idx = unknown.nonzero()[0]  # sync-ok: numpy
        if idx.size:
            bad = positions.take(idx) != self.pending_position_np.take(token_rows.take(idx))
            if np.count_nonzero(bad):
                i = idx[np.argmax(bad)]
                raise ValueError(
                    f"request {self.req_ids[token_rows[i]]}: position {positions[i]} "
                    "is scheduled but its token is neither known nor being sampled "
                    "by the previous step"
                )
        return idx

    @staticmethod
    def _samples(
        sched: SchedulerOutput, req_ids: list[str], rows: np.ndarray, seq_lens: np.ndarray
    ) -> Samples:
        if len(sched.sampling_req_ids) == len(req_ids):  # every request samples
            return Samples(list(req_ids), None, rows, seq_lens)  # the step key keeps req_ids
        sampling = sched.sampling_req_ids
        batch_idx = np.fromiter((b for b, r in enumerate(req_ids) if r in sampling), np.int64)
        return Samples(
            [req_ids[b] for b in batch_idx.tolist()],  # sync-ok: numpy, host only
            batch_idx,
            rows[batch_idx],
            seq_lens[batch_idx],
        )

    def _fill(
        self,
        buf: StepBuffers,
        layout: BatchLayout,
        ragged: Ragged,
        samples: Samples,
        placeholder_idx: np.ndarray,
    ) -> None:
        """Writes the step into the staging set, but for the sections it reuses."""
        arrays = buf.sections(layout.bucket_tokens, layout.bucket_seqs).arrays
        num_seqs, num_tokens = layout.num_seqs, layout.num_tokens
        token_rows, positions = ragged.token_rows, ragged.positions  # [T] each
        if layout.num_placeholders < num_tokens:
            arrays["input_ids"][:num_tokens] = self.token_ids_np[token_rows, positions]
        arrays["positions"][:num_tokens] = positions
        block_size = self.block_size
        arrays["slot_mapping"][:num_tokens] = (
            self.block_table_np[token_rows, positions // block_size] * block_size
            + positions % block_size
        )
        groups = self.group_tables
        if groups is not None:
            groups.fill_slots(arrays["slot_mapping"], token_rows, positions, block_size)
        arrays["query_start_loc"][: num_seqs + 1] = ragged.query_start_loc
        arrays["seq_lens"][:num_seqs] = ragged.seq_lens
        if not layout.reuse_block_table:
            num_cols = layout.num_block_cols
            table = arrays["block_table"][: num_seqs * num_cols].reshape(num_seqs, num_cols)
            table[:] = self.block_table_np[ragged.rows, :num_cols]
            if groups is not None:
                groups.fill_tables(arrays["block_table"], ragged.rows, num_cols)
        if not layout.reuse_seq_sections:
            self._fill_seq_sections(buf, arrays, ragged, samples, placeholder_idx)
            if layout.num_decodes:
                self._fill_decode_order(arrays, ragged.seq_lens[: layout.num_decodes])

    @staticmethod
    def _fill_seq_sections(
        buf: StepBuffers,
        arrays: dict[str, np.ndarray],
        ragged: Ragged,
        samples: Samples,
        placeholder_idx: np.ndarray,
    ) -> None:
        """Logits rows (the last token of each sampling request), the rows they sample for, and
        where each input token comes from in the device's ids table (StepBuffers): its row's
        last sampled token for a placeholder, else its own input_ids entry."""
        num_samples, num_tokens = len(samples.req_ids), ragged.positions.size
        query_ends = ragged.query_start_loc[1:]  # [B]
        ends = query_ends if samples.batch_idx is None else query_ends[samples.batch_idx]
        np.subtract(ends, 1, out=arrays["logits_indices"][:num_samples])
        arrays["sample_rows"][:num_samples] = samples.rows_np
        input_src = arrays["input_src"][:num_tokens]
        if placeholder_idx.size == num_tokens:
            input_src[:] = ragged.token_rows
            return
        np.add(buf.arange[:num_tokens], buf.num_head_ids, out=input_src)
        input_src[placeholder_idx] = ragged.token_rows[placeholder_idx]

    @staticmethod
    def _fill_decode_order(arrays: dict[str, np.ndarray], seq_lens: np.ndarray) -> None:
        """The decodes' ([D] seq_lens) order by decreasing seq_len, ties in batch order (the
        Triton decode kernel launches the longest first). A steady decode, which reuses the
        sequence sections, keeps the previous step's order: every length grew by one."""
        num_seqs = seq_lens.size
        arrays["decode_order"][:num_seqs] = np.argsort(-seq_lens, kind="stable")

    def _embeds_spans(self, rows: np.ndarray, ragged: Ragged) -> list[EmbedsSpan]:
        """Scheduled prompt positions of requests that came with prompt_embeds."""
        if not self._num_rows_with_embeds:
            return []
        num_computed, num_scheduled = ragged.num_computed, ragged.num_scheduled
        num_prompt = self.num_prompt_tokens_np[rows]
        batch_idx = np.flatnonzero(self.has_embeds_np[rows] & (num_computed < num_prompt))
        return [
            EmbedsSpan(
                row=int(rows[b]),
                batch_start=int(ragged.query_start_loc[b]),
                prompt_start=int(num_computed[b]),
                length=int(min(num_scheduled[b], num_prompt[b] - num_computed[b])),
            )
            for b in batch_idx.tolist()
        ]  # sync-ok: numpy

    def _plan_prompt_logprobs(
        self, req_ids: list[str], rows: np.ndarray, ragged: Ragged
    ) -> PromptLogprobsPlan | None:
        if not self._num_rows_with_prompt_logprobs:
            return None
        return plan_prompt_logprobs(
            req_ids,
            rows,
            self.num_prompt_logprobs_np[rows],
            self.num_prompt_tokens_np[rows],
            ragged.num_computed,
            ragged.num_scheduled,
            ragged.query_start_loc,
            self.token_ids_np,
        )
