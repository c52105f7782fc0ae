"""The split decode of a large batch (issue 31): only the longest split_seqs sequences in
decode_order split, the others take one program each; a sequence with one live split writes its
output directly. Under TRITON_INTERPRET=1 on CPU against test_triton_paged's float64 reference, on
NaN-poisoned outputs and workspace (tests/conftest.py's nan_poisoned_empty), with fresh random
inputs and KV blocks shuffled in the pool (the block tables' tails point at NaN-filled spare blocks).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_triton_paged import DEVICE, check_output, lpt_order, make_batch, random_order, write_cache
from test_window_skipping import DECODES, WINDOW, batch_for, null_block_entry, poison_skipped

from pagedlm.attention import triton_backend
from pagedlm.attention.triton_backend import TritonAttentionBackend, decode_kind, decode_split
from pagedlm.attention.triton_decode import (
    SPLIT_BLOCK_N,
    choose_split_seqs,
    split_decode_attention,
)
from pagedlm.ops.counters import zeroed_counters

pytestmark = pytest.mark.usefixtures("nan_poisoned_empty")

# one long context among short ones, a medium one, padding sequences (no query, seq_len 0) last
SKEWED_CTX = [9, 700, 3, 0, 40, 130, 0, 17, 0, 0]
SKEWED_QUERY = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
# (num_heads, num_kv_heads, head_dim, block_size, sliding_window, dtype, num_splits, split_seqs)
CASES = {
    "gqa4_tier2": (8, 2, 64, 16, None, torch.float32, 4, 2),
    "gqa2_window_tier3": (4, 2, 32, 16, 300, torch.float16, 5, 3),
    "mha_bs32_tier1": (2, 2, 32, 32, None, torch.float16, 8, 1),
}


def skewed_batch(case: str):
    num_heads, num_kv_heads, head_dim, block_size, window, dtype, num_splits, split_seqs = CASES[
        case
    ]
    batch = make_batch(
        SKEWED_CTX,
        SKEWED_QUERY,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        num_pad_tokens=2,
    )
    write_cache(batch)
    return batch, window, num_splits, split_seqs


def attend(batch, meta, window, num_splits: int, split_seqs: int | None) -> torch.Tensor:
    out = split_decode_attention(
        batch.q,
        batch.kv_cache,
        meta,
        0.3,
        window,
        num_splits,
        out=torch.full_like(batch.q, math.nan),
        split_seqs=split_seqs,
    )
    check_output(out, batch, 0.3, window)
    assert not zeroed_counters(batch.q.device, 0).any(), "every counter must be reset to 0"
    return out


@pytest.mark.parametrize(
    "case, order_kind",
    [(case, "lpt") for case in CASES] + [("gqa2_window_tier3", "random"), ("gqa4_tier2", "none")],
)
def test_longest_sequences_split_the_rest_write_directly(case: str, order_kind: str) -> None:
    """Against the reference in any launch order; with LPT order exactly the longest split_seqs
    sequences change bits against the unsplit launch (their partials merged), the others (one live
    split: written directly, the same arithmetic) are bit-identical to it."""
    batch, window, num_splits, split_seqs = skewed_batch(case)
    orders = {
        "lpt": lpt_order(batch.meta.seq_lens_cpu),
        "random": random_order(batch.meta.num_seqs),
        "none": None,
    }
    order = orders[order_kind]
    meta = dataclasses.replace(batch.meta, decode_order=None if order is None else order.to(DEVICE))
    tiered = attend(batch, meta, window, num_splits, split_seqs)
    unsplit = attend(batch, meta, window, 1, None)
    ranks = list(range(meta.num_seqs)) if order is None else order.tolist()
    split_seqs_ids = set(ranks[:split_seqs])
    seq_lens = batch.meta.seq_lens_cpu.tolist()
    next_visible = max(min(seq_lens[ranks[split_seqs]], window or seq_lens[ranks[split_seqs]]), 1)
    qsl = batch.meta.query_start_loc_cpu.tolist()
    for seq, seq_len in enumerate(seq_lens):
        rows = slice(qsl[seq], qsl[seq + 1])
        visible = min(seq_len, window or seq_len)
        # balanced_splits: the visible keys over the longest unsplit sequence's, rounded
        splits = min(max((2 * visible + next_visible) // (2 * next_visible), 1), num_splits)
        chunk = math.ceil(math.ceil(visible / splits) / SPLIT_BLOCK_N) * SPLIT_BLOCK_N
        if seq not in split_seqs_ids or visible <= chunk:  # one live split
            assert torch.equal(tiered[rows], unsplit[rows]), (seq, seq_len)
        elif batch.q.dtype == torch.float32:  # fp16 / bf16 outputs round most differences away
            assert not torch.equal(tiered[rows], unsplit[rows]), (seq, seq_len)
    if order_kind == "lpt":  # the 701-key sequence splits in every case
        assert 1 in split_seqs_ids


def test_sequences_of_like_lengths_do_not_split() -> None:
    """A large batch whose split sequences are no longer than the rest (T2's shape) splits none of
    them: every output bit-identical to the unsplit launch's (fp32, where a merge changes bits), and
    a sequence twice as long as the longest unsplit one splits in two."""
    ctx = [300, 290, 310, 295, 305, 620, 0]
    batch = make_batch(
        ctx,
        [1] * 6 + [0],
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        num_pad_tokens=1,
    )
    write_cache(batch)
    meta = dataclasses.replace(
        batch.meta, decode_order=lpt_order(batch.meta.seq_lens_cpu).to(DEVICE)
    )
    tiered = attend(batch, meta, None, 4, 2)  # ranks 0, 1: the 621- and 311-key sequences
    unsplit = attend(batch, meta, None, 1, None)
    assert torch.equal(tiered[:5], unsplit[:5])  # 311 keys over the next one's 306: one split
    assert not torch.equal(tiered[5], unsplit[5])  # 621 over 306: two


def test_every_sequence_split_and_none_split() -> None:
    """split_seqs at its bounds: num_seqs (the small-batch path) and 0 (one program each)."""
    batch, window, num_splits, _ = skewed_batch("gqa4_tier2")
    meta = dataclasses.replace(
        batch.meta, decode_order=lpt_order(batch.meta.seq_lens_cpu).to(DEVICE)
    )
    for split_seqs in (meta.num_seqs, 0):
        attend(batch, meta, window, num_splits, split_seqs)
    with pytest.raises(ValueError, match="split_seqs"):
        split_decode_attention(
            batch.q, batch.kv_cache, meta, 0.3, None, 2, split_seqs=meta.num_seqs + 1
        )


def test_choose_split_seqs() -> None:
    assert choose_split_seqs(num_seqs=16, num_kv_heads=8, num_sms=132) == 16  # small: all split
    assert choose_split_seqs(num_seqs=17, num_kv_heads=8, num_sms=132) == 3  # large: an eighth
    assert choose_split_seqs(num_seqs=512, num_kv_heads=8, num_sms=132) == 64


def test_decode_kinds_tell_small_and_large_batches_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA graph sizes give way only within one kind: a small batch's split count may equal a large
    one's, but not its kind; no split at all is one kind however large the batch."""
    kv_cache = torch.empty(2, 1, 16, 4, 64)  # 4 KV heads
    monkeypatch.setattr(triton_backend, "num_sms", lambda device, default: 132)
    monkeypatch.setattr(triton_backend, "SPLIT_LARGE_BATCHES", True)
    assert decode_split(9, kv_cache, 8192) == (8, 9)  # 36 programs: 2 waves of 132 SMs
    assert decode_split(33, kv_cache, 8192) == (4, 5)  # 132 programs: the longest eighth split
    assert decode_kind(9, kv_cache, 8192) == (8, False)
    assert decode_kind(33, kv_cache, 8192) == (4, True)
    assert decode_kind(33, kv_cache, 1024) == decode_kind(40, kv_cache, 600) == (1, False)


def test_large_batches_take_the_varlen_kernel_when_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PAGEDLM_SPLIT_LARGE_DECODE=0 (read at import into SPLIT_LARGE_BATCHES): a large batch's decode
    is the varlen kernel's; a small batch still splits."""
    kv_cache = torch.empty(2, 1, 16, 4, 64)  # 4 KV heads
    monkeypatch.setattr(triton_backend, "num_sms", lambda device, default: 132)
    monkeypatch.setattr(triton_backend, "SPLIT_LARGE_BATCHES", False)
    assert decode_split(33, kv_cache, 8192) == (1, 33)
    assert decode_kind(33, kv_cache, 8192) == (1, False)
    assert decode_split(9, kv_cache, 8192) == (8, 9)


def test_backend_splits_a_large_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode batch with as many (sequence, KV head) pairs as SMs takes the tiered split decode,
    its split count from max_seq_len (a CUDA graph's is max_model_len)."""
    calls = []
    monkeypatch.setattr(triton_backend, "num_sms", lambda device, default: 16)
    monkeypatch.setattr(triton_backend, "SPLIT_LARGE_BATCHES", True)
    monkeypatch.setattr(
        triton_backend,
        "split_decode_attention",
        lambda *args, **kwargs: (
            calls.append((args[-1], kwargs["split_seqs"]))
            or split_decode_attention(*args, **kwargs)
        ),
    )
    batch, window, _, _ = skewed_batch("gqa4_tier2")  # 10 sequences x 2 KV heads >= 16 SMs
    meta = dataclasses.replace(
        batch.meta, max_seq_len=4000, decode_order=lpt_order(batch.meta.seq_lens_cpu).to(DEVICE)
    )
    out = TritonAttentionBackend().attend(batch.q, batch.kv_cache, meta, 0.3, window)
    check_output(out, batch, 0.3, window)
    assert calls == [(4, 2)]


def test_tiered_split_skips_freed_blocks() -> None:
    """Blocks below the window freed (NaN, the table naming a NaN null block): the split and the
    unsplit sequences of a tiered launch read none of them (test_window_skipping's set-up)."""
    torch.manual_seed(11)
    batch = batch_for(DECODES, 16, torch.float32)
    write_cache(batch)
    assert poison_skipped(batch, 16, null_block_entry(batch)) > 0
    order = lpt_order(batch.meta.seq_lens_cpu).to(DEVICE)
    meta = dataclasses.replace(batch.meta, decode_order=order)
    out = split_decode_attention(
        batch.q,
        batch.kv_cache,
        meta,
        0.3,
        WINDOW,
        3,
        out=torch.full_like(batch.q, math.nan),
        split_seqs=2,
    )
    check_output(out, batch, 0.3, WINDOW)
