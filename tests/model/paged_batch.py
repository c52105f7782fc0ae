"""Hand-built ragged batches over a NaN-poisoned paged KV cache, for model tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.config import ModelConfig


@dataclass
class PagedCache:
    kv_caches: list[torch.Tensor]  # per layer [2, num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor  # [max_num_seqs, max_blocks_per_seq] int32, shuffled block ids
    block_size: int


def make_cache(
    config: ModelConfig, max_num_seqs: int, max_seq_len: int, block_size: int
) -> PagedCache:
    """Every slot starts as NaN: attending to a slot nobody wrote makes the logits NaN."""
    blocks_per_seq = math.ceil(max_seq_len / block_size)
    num_blocks = max_num_seqs * blocks_per_seq
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
    block_table = perm.view(max_num_seqs, blocks_per_seq).to(torch.int32)
    shape = (2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    kv_caches = [
        torch.full(shape, float("nan"), dtype=config.dtype) for _ in range(config.num_layers)
    ]
    return PagedCache(kv_caches, block_table, block_size)


def make_step(
    cache: PagedCache, chunks: list[tuple[list[int], int]]
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """chunks[b] = (this step's token ids of sequence b, how many of its tokens are cached).
    Sequence b owns row b of the block table. Returns input_ids, positions, metadata."""
    input_ids, positions, slots, starts, seq_lens = [], [], [], [0], []
    for seq, (token_ids, num_computed) in enumerate(chunks):
        for pos in range(num_computed, num_computed + len(token_ids)):
            block = int(cache.block_table[seq, pos // cache.block_size])
            slots.append(block * cache.block_size + pos % cache.block_size)
            positions.append(pos)
        input_ids.extend(token_ids)
        starts.append(starts[-1] + len(token_ids))
        seq_lens.append(num_computed + len(token_ids))
    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    meta = AttentionMetadata(
        num_tokens=len(input_ids),
        num_seqs=len(chunks),
        max_query_len=max(len(ids) for ids, _ in chunks),
        max_seq_len=max(seq_lens),
        query_start_loc=query_start_loc.clone(),
        seq_lens=seq_lens_t.clone(),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_table=cache.block_table[: len(chunks)].clone(),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
    )
    return (
        torch.tensor(input_ids, dtype=torch.int64),
        torch.tensor(positions, dtype=torch.int64),
        meta,
    )
