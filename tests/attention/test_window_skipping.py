"""Sliding windows: every backend skips the blocks below a sequence's window instead of masking them.

The scheduler frees the blocks wholly below num_computed_tokens - W + 1 (core/sliding_window.py);
another request may then take and overwrite them. Here those blocks are poisoned the way the
engine can leave them: their contents NaN (overwritten by another request) with the block table
still naming them, or the table pointing them to a NaN null block. The torch backends get an
out-of-range block id there too, so a gather that merely touches one raises. Outputs must match a
dense reference over the visible keys. Triton runs under TRITON_INTERPRET=1 (tests/conftest.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_triton_paged import PagedBatch, check_output, make_batch, write_cache

from pagedlm.attention.torch_batched import TorchBatchedAttentionBackend
from pagedlm.attention.torch_ref import TorchAttentionBackend
from pagedlm.attention.triton_decode import split_decode_attention
from pagedlm.attention.triton_paged import varlen_attention
from pagedlm.core.sliding_window import num_skipped_blocks

pytestmark = pytest.mark.usefixtures("nan_poisoned_empty")  # tests/conftest.py

WINDOW = 20
# (cached context, query length) per sequence: decodes and chunks several windows long, a chunk
# longer than the window from position 0 (nothing skipped), a context inside the window
MIXED = [(100, 1), (37, 1), (63, 1), (50, 30), (0, 70), (9, 5)]
DECODES = [(100, 1), (37, 1), (64, 1), (5, 1), (130, 1)]
OUT_OF_RANGE = 10**6


def skipped_blocks(batch: PagedBatch, block_size: int) -> list[int]:
    """Per sequence, the leading blocks the scheduler frees before this step."""
    first_pos = (batch.meta.seq_lens_cpu - batch.meta.query_start_loc_cpu.diff()).tolist()
    return [num_skipped_blocks(p, WINDOW, block_size) for p in first_pos]


def poison_skipped(batch: PagedBatch, block_size: int, table_entry: int | None) -> int:
    """NaN into every skipped block; with table_entry, the table names that block there instead.
    Returns the number of skipped blocks (so a test knows it tested something)."""
    table = batch.meta.block_table
    skipped = skipped_blocks(batch, block_size)
    for seq, num_skipped in enumerate(skipped):
        batch.kv_cache[:, table[seq, :num_skipped].long()] = math.nan
        if table_entry is not None:
            table[seq, :num_skipped] = table_entry
    return sum(skipped)


def null_block_entry(batch: PagedBatch) -> int:
    """A block no sequence owns (make_batch's spare blocks stay NaN): stands for the null block."""
    block_size = batch.kv_cache.shape[2]
    owned = set()
    for seq, keys in enumerate(batch.keys):
        owned.update(batch.meta.block_table[seq, : math.ceil(len(keys) / block_size)].tolist())
    return min(set(range(batch.kv_cache.shape[1])) - owned)


def batch_for(seqs: list[tuple[int, int]], block_size: int, dtype: torch.dtype) -> PagedBatch:
    return make_batch(
        [ctx for ctx, _ in seqs],
        [n for _, n in seqs],
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=block_size,
        dtype=dtype,
        num_pad_tokens=2,
    )


@pytest.mark.parametrize("seqs", [MIXED, DECODES], ids=["mixed", "decodes"])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("backend", [TorchAttentionBackend, TorchBatchedAttentionBackend])
def test_torch_backends_never_gather_skipped_blocks(
    backend, block_size: int, seqs: list[tuple[int, int]]
) -> None:
    torch.manual_seed(block_size + len(seqs))
    batch = batch_for(seqs, block_size, torch.float32)
    write_cache(batch)
    assert poison_skipped(batch, block_size, OUT_OF_RANGE) > 0
    out = backend().attend(batch.q, batch.kv_cache, batch.meta, 0.3, WINDOW)
    num_real = int(batch.meta.query_start_loc_cpu[-1])
    out[num_real:] = math.nan  # the torch backends zero padding rows; check_output wants NaN
    check_output(out, batch, 0.3, WINDOW)


@pytest.mark.parametrize("null_table", [False, True], ids=["stale_entries", "null_entries"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_varlen_skips_freed_blocks(dtype: torch.dtype, null_table: bool) -> None:
    torch.manual_seed(3 + null_table)
    batch = batch_for(MIXED, 16, dtype)
    write_cache(batch)
    entry = null_block_entry(batch) if null_table else None
    assert poison_skipped(batch, 16, entry) > 0
    out = varlen_attention(
        batch.q, batch.kv_cache, batch.meta, 0.3, WINDOW, out=torch.full_like(batch.q, math.nan)
    )
    check_output(out, batch, 0.3, WINDOW)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_triton_split_decode_skips_freed_blocks(num_splits: int) -> None:
    torch.manual_seed(7 + num_splits)
    batch = batch_for(DECODES, 16, torch.float32)
    write_cache(batch)
    assert poison_skipped(batch, 16, null_block_entry(batch)) > 0
    out = split_decode_attention(
        batch.q,
        batch.kv_cache,
        batch.meta,
        0.3,
        WINDOW,
        num_splits,
        out=torch.full_like(batch.q, math.nan),
    )
    check_output(out, batch, 0.3, WINDOW)


def test_poisoning_is_seen_by_a_kernel_that_reads_the_whole_context() -> None:
    """The check can fail: without the window, the same poisoned batch is no longer finite."""
    batch = batch_for(DECODES, 16, torch.float32)
    write_cache(batch)
    poison_skipped(batch, 16, None)
    out = TorchAttentionBackend().attend(batch.q, batch.kv_cache, batch.meta, 0.3, None)
    assert out.isnan().any()
