"""Sampling at tp > 1, from each rank's vocabulary shard of the logits [N, R] (R rows of the LM
head a rank holds, sharding.vocab_shard_rows).

- Default: rank 0 gathers the shards and samples every row; it broadcasts the ids, which every
  rank needs (the next step's inputs read them on the device). Only rank 0's sampler runs, so only
  its sampling state (per-request counts, penalties) moves; only it returns outputs.
- Batch-sharded (`enable_batch_sharded_sampling`, vLLM's design): a request's row r belongs to rank
  r % P for its whole life (so each rank's sampling state of its rows stays whole); an all-to-all
  along the batch gives each rank the full-vocabulary logits of its rows, it samples them, and the
  ids are all-gathered (the logprobs gathered to rank 0). Peak logits memory per rank N x R, not N x V.
Structured-output bitmasks apply to the shards before either exchange (R is a multiple of 32, so a
shard's bitmask words are whole). Seeded and unseeded draws hash each request's seed and its count
of sampled tokens (sample/gumbel.py), so both modes draw what tp = 1 draws from the same logits.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from pagedlm.distributed import collectives
from pagedlm.distributed.parallel_state import TPGroup
from pagedlm.sample.grammar_mask import apply_grammar_bitmask
from pagedlm.sample.sampler import SamplerOutput
from pagedlm.sample.state import SamplingState
from pagedlm.worker.grammar_inputs import GrammarRows


class TPSampler:
    def __init__(
        self,
        sampler: SamplingState,
        group: TPGroup,
        vocab_size: int,
        shard_rows: int,
        batch_sharded: bool,
        max_num_reqs: int,
        device: torch.device,
        num_slots: int,
    ) -> None:
        self.sampler = sampler
        self.group = group
        self.vocab_size = vocab_size
        self.shard_rows = shard_rows
        self.batch_sharded = batch_sharded
        self.device = device
        self._ids = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)  # broadcast target
        # per staging slot: the batch-sharded step's two row orders, host side (pinned on CUDA):
        # written two steps after the copy that read them, as the runner's staging sets
        pin = device.type == "cuda"
        self._orders = [
            torch.zeros(2, max_num_reqs, dtype=torch.int64, pin_memory=pin)
            for _ in range(num_slots)
        ]

    def sample(
        self,
        local_logits: torch.Tensor,
        rows_np: np.ndarray,
        num_logprobs_np: np.ndarray,
        grammar: GrammarRows | None,
        slot: int,
    ) -> SamplerOutput:
        """local_logits [N, R] float32 (this rank's shard), rows_np [N] persistent rows,
        num_logprobs_np [N] (-1: none asked) -> the N ids on every rank (logprobs on rank 0)."""
        if grammar is not None:
            self._mask_shard(local_logits, grammar)
        if self.batch_sharded:
            return self._sample_sharded(local_logits, rows_np, num_logprobs_np, slot)
        return self._sample_on_first(local_logits, rows_np)

    def _mask_shard(self, local_logits: torch.Tensor, grammar: GrammarRows) -> None:
        indices, bitmask = grammar  # [M], [M, W] over the whole vocabulary
        words = self.shard_rows // 32
        first = self.group.rank * words
        shard = torch.zeros(bitmask.shape[0], words, dtype=bitmask.dtype, device=bitmask.device)
        have = max(0, min(words, bitmask.shape[1] - first))  # the last shard's words may run out
        shard[:, :have] = bitmask[:, first : first + have]  # missing words: banned (padding ids)
        apply_grammar_bitmask(local_logits, indices, shard)

    def _sample_on_first(self, local_logits: torch.Tensor, rows_np: np.ndarray) -> SamplerOutput:
        full = collectives.gather_last_dim_to_first(local_logits, self.group)  # [N, P * R] | None
        num_rows = rows_np.shape[0]
        if full is not None:
            output = self.sampler.sample(full[:, : self.vocab_size].contiguous(), rows_np)
            ids = output.sampled_token_ids
        else:
            ids = self._ids[:num_rows]
            output = SamplerOutput(ids)
        collectives.broadcast_from_first(ids, self.group)
        return output

    def _sample_sharded(
        self,
        local_logits: torch.Tensor,
        rows_np: np.ndarray,
        num_logprobs_np: np.ndarray,
        slot: int,
    ) -> SamplerOutput:
        size, rank = self.group.size, self.group.rank
        plan = ShardPlan(rows_np, size)
        n_mine, n_max = int(plan.counts[rank]), int(plan.counts.max())
        by_owner, back = self._device_orders(plan, slot)
        recv = torch.empty(
            size * n_mine,
            local_logits.shape[1],
            dtype=local_logits.dtype,
            device=local_logits.device,
        )  # [P * n_mine, R]: rank j's shard of my rows
        dist.all_to_all_single(
            recv,
            local_logits.index_select(0, by_owner),
            output_split_sizes=[n_mine] * size,
            input_split_sizes=plan.counts.tolist(),  # sync-ok: numpy
            group=self.group.device_group,
        )
        width = local_logits.shape[1]
        mine = recv.view(size, n_mine, width).permute(1, 0, 2).reshape(n_mine, size * width)
        mine = mine[:, : self.vocab_size].contiguous()  # [n_mine, V]
        mine_rows_np = plan.rows_of(rank)
        output = self.sampler.sample(mine, mine_rows_np) if n_mine else None
        ids = torch.zeros(n_max, dtype=torch.int64, device=self.device)
        if output is not None:
            ids[:n_mine] = output.sampled_token_ids
        all_ids = collectives.all_gather_rows(ids, self.group).reshape(-1)  # [P * n_max]
        sampled = all_ids.index_select(0, back)  # [N], batch order
        logprobs = None
        asked = num_logprobs_np[num_logprobs_np >= 0]
        if asked.size:
            logprobs = self._gather_logprobs(output, n_max, int(asked.max()), back)
        return SamplerOutput(sampled, logprobs)

    def _device_orders(self, plan: ShardPlan, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[N] the batch rows grouped by owner (the all-to-all's send order), [N] each batch row's
        place in the all-gathered [P * n_max] ids."""
        num = plan.by_owner.shape[0]
        host = self._orders[slot]
        host[0, :num].numpy()[:] = plan.by_owner
        host[1, :num].numpy()[:] = plan.back
        if self.device.type == "cpu":
            return host[0, :num], host[1, :num]
        orders = host[:, :num].to(self.device, non_blocking=True)
        return orders[0], orders[1]

    def _gather_logprobs(
        self, output: SamplerOutput | None, n_max: int, max_asked: int, back: torch.Tensor
    ):
        """Each rank's (ids [n, 1+K], logprobs [n, 1+K], ranks [n]) padded to n_max rows and the
        step's widest K, packed as float64 (ids and ranks below 2^53: exact), gathered to rank 0."""
        width = 1 + min(max_asked, self.vocab_size)
        packed = torch.zeros(n_max, 2 * width + 1, dtype=torch.float64, device=self.device)
        if output is not None and output.logprobs is not None:
            token_ids, logprobs, ranks = output.logprobs
            n, k = token_ids.shape
            packed[:n, :k] = token_ids
            packed[:n, width : width + k] = logprobs
            packed[:n, -1] = ranks
        parts = (
            [torch.empty_like(packed) for _ in range(self.group.size)]
            if self.group.is_first
            else None
        )
        dist.gather(packed, parts, dst=0, group=self.group.device_group)
        if parts is None:
            return None
        rows = torch.cat(parts).index_select(0, back)  # [N, 2 * width + 1], batch order
        return (
            rows[:, :width].to(torch.int64),
            rows[:, width : 2 * width].to(torch.float32),
            rows[:, -1].to(torch.int64),
        )


class ShardPlan:
    """Which rank samples which batch row (owner = persistent row % P), from host data alone."""

    def __init__(self, rows_np: np.ndarray, size: int) -> None:
        owners = rows_np % size
        self.by_owner = np.argsort(owners, kind="stable")  # [N]
        self.counts = np.bincount(owners, minlength=size)  # [P]
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1]))  # [P]
        self.rows_np = rows_np
        n_max = int(self.counts.max()) if rows_np.size else 0
        place = np.empty_like(self.by_owner)
        place[self.by_owner] = np.arange(rows_np.size)  # batch row -> place in by_owner
        self.back = owners * n_max + (place - self.starts[owners])  # [N]

    def rows_of(self, rank: int) -> np.ndarray:
        start = self.starts[rank]
        return self.rows_np[self.by_owner[start : start + self.counts[rank]]]
