"""TorchAttentionBackend against a dense per-query reference written independently of it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.torch_ref import TorchAttentionBackend

NUM_HEADS = 4
HEAD_DIM = 16
NUM_PADDING_ROWS = 2

# (cached context length, query length) per sequence
SCENARIOS = {
    "decode": ([(10, 1), (33, 1), (0, 1), (64, 1)], None),
    "prefill": ([(0, 7), (0, 20), (0, 33)], None),
    "mixed": ([(15, 1), (0, 12), (40, 1), (5, 9)], None),
    "chunk_mid_block": ([(20, 13), (37, 30)], None),
    "window_mixed": ([(15, 1), (0, 12), (40, 3), (5, 9)], 5),
    "window_long_chunk": ([(30, 20)], 8),
}


@dataclass
class Case:
    q: torch.Tensor  # [T, num_heads, head_dim]
    k_full: list[torch.Tensor]  # per sequence [seq_len, num_kv_heads, head_dim]
    v_full: list[torch.Tensor]
    k: torch.Tensor  # [T, num_kv_heads, head_dim]: this step's rows (padding rows included)
    v: torch.Tensor
    kv_cache: torch.Tensor
    meta: AttentionMetadata
    spare_slots: torch.Tensor  # slots nobody owns: must stay NaN


def _block_tables(seqs: list[tuple[int, int]], block_size: int, gen: torch.Generator
                  ) -> tuple[torch.Tensor, int, int]:
    """Random disjoint block ids per sequence; unused entries point at a poisoned spare block,
    the last one, which is also where a slot of -1 would land if it were not skipped."""
    needed = [math.ceil((ctx + qlen) / block_size) for ctx, qlen in seqs]
    num_blocks = sum(needed) + 2
    spare_block = num_blocks - 1
    perm = torch.randperm(spare_block, generator=gen)
    table = torch.full((len(seqs), max(needed) + 1), spare_block, dtype=torch.int32)
    used = 0
    for seq, count in enumerate(needed):
        table[seq, :count] = perm[used:used + count].to(torch.int32)
        used += count
    return table, num_blocks, spare_block


def make_case(seqs: list[tuple[int, int]], num_kv_heads: int, block_size: int,
              dtype: torch.dtype, seed: int) -> Case:
    gen = torch.Generator().manual_seed(seed)
    table, num_blocks, spare_block = _block_tables(seqs, block_size, gen)
    kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, HEAD_DIM), float("nan"), dtype=dtype)
    kv_flat = kv_cache.view(2, -1, num_kv_heads, HEAD_DIM)
    k_full, v_full, k_rows, v_rows, slots, starts = [], [], [], [], [], [0]
    for seq, (ctx, qlen) in enumerate(seqs):
        k_seq = torch.randn(ctx + qlen, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        v_seq = torch.randn(ctx + qlen, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        seq_slots = torch.tensor([int(table[seq, t // block_size]) * block_size + t % block_size
                                  for t in range(ctx + qlen)])
        kv_flat[0, seq_slots[:ctx]] = k_seq[:ctx]  # earlier steps already cached these
        kv_flat[1, seq_slots[:ctx]] = v_seq[:ctx]
        k_full.append(k_seq)
        v_full.append(v_seq)
        k_rows.append(k_seq[ctx:])
        v_rows.append(v_seq[ctx:])
        slots.append(seq_slots[ctx:])
        starts.append(starts[-1] + qlen)
    pad_shape = (NUM_PADDING_ROWS, num_kv_heads, HEAD_DIM)
    k_rows.append(torch.randn(pad_shape, generator=gen).to(dtype))
    v_rows.append(torch.randn(pad_shape, generator=gen).to(dtype))
    slots.append(torch.full((NUM_PADDING_ROWS,), -1))
    num_tokens = starts[-1] + NUM_PADDING_ROWS
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
    seq_lens = torch.tensor([ctx + qlen for ctx, qlen in seqs], dtype=torch.int32)
    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    meta = AttentionMetadata(
        num_tokens=num_tokens, num_seqs=len(seqs), max_query_len=max(q for _, q in seqs),
        max_seq_len=int(seq_lens.max()), query_start_loc=query_start_loc.clone(),
        seq_lens=seq_lens.clone(), slot_mapping=torch.cat(slots).to(torch.int64), block_table=table,
        query_start_loc_cpu=query_start_loc, seq_lens_cpu=seq_lens)
    spare = torch.arange(spare_block * block_size, (spare_block + 1) * block_size)
    return Case(q, k_full, v_full, torch.cat(k_rows), torch.cat(v_rows), kv_cache, meta, spare)


def dense_reference(q_seq: torch.Tensor, k_seq: torch.Tensor, v_seq: torch.Tensor,
                    window: int | None, scale: float) -> torch.Tensor:
    """One query, one head at a time, in float64, over an explicit list of visible keys."""
    seq_len, qlen = k_seq.shape[0], q_seq.shape[0]
    group = NUM_HEADS // k_seq.shape[1]
    out = torch.empty(qlen, NUM_HEADS, HEAD_DIM, dtype=torch.float64)
    for i in range(qlen):
        pos = seq_len - qlen + i
        first = 0 if window is None else max(0, pos - window + 1)
        for head in range(NUM_HEADS):
            keys = k_seq[first:pos + 1, head // group].double()  # [num_visible, head_dim]
            values = v_seq[first:pos + 1, head // group].double()
            weights = torch.softmax(keys @ q_seq[i, head].double() * scale, dim=0)
            out[i, head] = weights @ values
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])  # GQA ratios 1, 2, 4
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_matches_dense_reference(scenario: str, num_kv_heads: int, block_size: int,
                                 dtype: torch.dtype) -> None:
    seqs, window = SCENARIOS[scenario]
    case = make_case(seqs, num_kv_heads, block_size, dtype, seed=list(SCENARIOS).index(scenario) * 10 + num_kv_heads)
    scale = HEAD_DIM ** -0.5
    out = TorchAttentionBackend().forward(case.q, case.k, case.v, case.kv_cache, case.meta, scale,
                                          window)
    assert out.dtype == dtype and out.shape == case.q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    starts = case.meta.query_start_loc_cpu.tolist()
    for seq in range(len(seqs)):
        got = out[starts[seq]:starts[seq + 1]]
        want = dense_reference(case.q[starts[seq]:starts[seq + 1]], case.k_full[seq], case.v_full[seq],
                               window, scale)
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    assert torch.all(out[starts[-1]:] == 0), "padding rows must not be attended"


@pytest.mark.parametrize("block_size", [16, 32])
def test_cache_write_skips_padding(block_size: int) -> None:
    case = make_case(SCENARIOS["mixed"][0], 2, block_size, torch.float32, seed=7)
    TorchAttentionBackend().forward(case.q, case.k, case.v, case.kv_cache, case.meta, 0.25, None)
    kv_flat = case.kv_cache.view(2, -1, 2, HEAD_DIM)
    slots = case.meta.slot_mapping
    real = slots >= 0
    torch.testing.assert_close(kv_flat[0, slots[real]], case.k[real], rtol=0, atol=0)
    torch.testing.assert_close(kv_flat[1, slots[real]], case.v[real], rtol=0, atol=0)
    assert torch.isnan(kv_flat[:, case.spare_slots]).all(), "a padding row wrote into the cache"


def test_rejects_bad_gqa_ratio() -> None:
    case = make_case([(0, 3)], 3, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="num_kv_heads"):
        TorchAttentionBackend().forward(case.q, case.k, case.v, case.kv_cache, case.meta, 0.25, None)
