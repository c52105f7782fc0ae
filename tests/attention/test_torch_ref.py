"""The torch backends (the per-sequence reference and the CPU one with batched decodes) against a
dense per-query reference written independently of both."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from pagedlm.attention import torch_batched, torch_ref
from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.torch_batched import (
    BUCKET_GROWTH,
    TorchBatchedAttentionBackend,
    bucket_bounds,
)
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
    "decodes_many_lengths": ([(3, 1), (40, 1), (100, 1), (7, 1), (250, 1), (60, 1), (0, 5)], None),
    "window_decodes": ([(30, 1), (5, 1), (70, 1), (0, 9)], 8),
}
BACKENDS = {"reference": TorchAttentionBackend, "batched": TorchBatchedAttentionBackend}


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


def _block_tables(
    seqs: list[tuple[int, int]], block_size: int, gen: torch.Generator
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
        table[seq, :count] = perm[used : used + count].to(torch.int32)
        used += count
    return table, num_blocks, spare_block


def make_case(
    seqs: list[tuple[int, int]], num_kv_heads: int, block_size: int, dtype: torch.dtype, seed: int
) -> Case:
    gen = torch.Generator().manual_seed(seed)
    table, num_blocks, spare_block = _block_tables(seqs, block_size, gen)
    kv_cache = torch.full(
        (2, num_blocks, block_size, num_kv_heads, HEAD_DIM), float("nan"), dtype=dtype
    )
    kv_flat = kv_cache.view(2, -1, num_kv_heads, HEAD_DIM)
    k_full, v_full, k_rows, v_rows, slots, starts = [], [], [], [], [], [0]
    for seq, (ctx, qlen) in enumerate(seqs):
        k_seq = torch.randn(ctx + qlen, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        v_seq = torch.randn(ctx + qlen, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        seq_slots = torch.tensor(
            [
                int(table[seq, t // block_size]) * block_size + t % block_size
                for t in range(ctx + qlen)
            ]
        )
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
        num_tokens=num_tokens,
        num_seqs=len(seqs),
        max_query_len=max(q for _, q in seqs),
        max_seq_len=int(seq_lens.max()),
        query_start_loc=query_start_loc.clone(),
        seq_lens=seq_lens.clone(),
        slot_mapping=torch.cat(slots).to(torch.int64),
        block_table=table,
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
    )
    spare = torch.arange(spare_block * block_size, (spare_block + 1) * block_size)
    return Case(q, k_full, v_full, torch.cat(k_rows), torch.cat(v_rows), kv_cache, meta, spare)


def write_and_attend(backend, case: Case, scale: float, window: int | None) -> torch.Tensor:
    """What a model layer does: this step's k/v into the cache (prepare_qkv), then attention."""
    torch_ref.write_kv_cache(case.k, case.v, case.kv_cache, case.meta.slot_mapping)
    return backend.attend(case.q, case.kv_cache, case.meta, scale, window)


def dense_reference(
    q_seq: torch.Tensor, k_seq: torch.Tensor, v_seq: torch.Tensor, window: int | None, scale: float
) -> torch.Tensor:
    """One query, one head at a time, in float64, over an explicit list of visible keys."""
    seq_len, qlen = k_seq.shape[0], q_seq.shape[0]
    group = NUM_HEADS // k_seq.shape[1]
    out = torch.empty(qlen, NUM_HEADS, HEAD_DIM, dtype=torch.float64)
    for i in range(qlen):
        pos = seq_len - qlen + i
        first = 0 if window is None else max(0, pos - window + 1)
        for head in range(NUM_HEADS):
            keys = k_seq[first : pos + 1, head // group].double()  # [num_visible, head_dim]
            values = v_seq[first : pos + 1, head // group].double()
            weights = torch.softmax(keys @ q_seq[i, head].double() * scale, dim=0)
            out[i, head] = weights @ values
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])  # GQA ratios 1, 2, 4
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_matches_dense_reference(
    backend: str, scenario: str, num_kv_heads: int, block_size: int, dtype: torch.dtype
) -> None:
    seqs, window = SCENARIOS[scenario]
    case = make_case(
        seqs,
        num_kv_heads,
        block_size,
        dtype,
        seed=list(SCENARIOS).index(scenario) * 10 + num_kv_heads,
    )
    scale = HEAD_DIM**-0.5
    out = write_and_attend(BACKENDS[backend](), case, scale, window)
    assert out.dtype == dtype and out.shape == case.q.shape
    check_against_dense(
        case, out, seqs, window, scale, tol=1e-5 if dtype == torch.float32 else 2e-3
    )


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_query_tiles_match_dense_reference(backend: str, scenario: str, monkeypatch) -> None:
    """Chunks longer than a tile (QUERY_TILE, the batched backend's PREFILL_TILE) go in tiles;
    tiles of 8 rows split every scenario's chunks (inside blocks, across the window) and must
    change nothing."""
    monkeypatch.setattr(torch_ref, "QUERY_TILE", 8)
    monkeypatch.setattr(torch_batched, "PREFILL_TILE", 8)
    seqs, window = SCENARIOS[scenario]
    case = make_case(seqs, 2, 16, torch.float32, seed=list(SCENARIOS).index(scenario) + 100)
    scale = HEAD_DIM**-0.5
    out = write_and_attend(BACKENDS[backend](), case, scale, window)
    check_against_dense(case, out, seqs, window, scale, tol=1e-5)


def check_against_dense(
    case: Case,
    out: torch.Tensor,
    seqs: list[tuple[int, int]],
    window: int | None,
    scale: float,
    tol: float,
) -> None:
    starts = case.meta.query_start_loc_cpu.tolist()
    for seq in range(len(seqs)):
        got = out[starts[seq] : starts[seq + 1]]
        want = dense_reference(
            case.q[starts[seq] : starts[seq + 1]], case.k_full[seq], case.v_full[seq], window, scale
        )
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    assert torch.all(out[starts[-1] :] == 0), "padding rows must not be attended"


@pytest.mark.parametrize("block_size", [16, 32])
def test_cache_write_skips_padding(block_size: int) -> None:
    case = make_case(SCENARIOS["mixed"][0], 2, block_size, torch.float32, seed=7)
    torch_ref.write_kv_cache(case.k, case.v, case.kv_cache, case.meta.slot_mapping)
    kv_flat = case.kv_cache.view(2, -1, 2, HEAD_DIM)
    slots = case.meta.slot_mapping
    real = slots >= 0
    torch.testing.assert_close(kv_flat[0, slots[real]], case.k[real], rtol=0, atol=0)
    torch.testing.assert_close(kv_flat[1, slots[real]], case.v[real], rtol=0, atol=0)
    assert torch.isnan(kv_flat[:, case.spare_slots]).all(), "a padding row wrote into the cache"


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_rejects_bad_gqa_ratio(backend: str) -> None:
    case = make_case([(0, 3)], 3, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="num_kv_heads"):
        write_and_attend(BACKENDS[backend](), case, 0.25, None)


@pytest.mark.parametrize("seed", range(5))
def test_decode_buckets_bound_padding(seed: int) -> None:
    """Runs cover the sorted list in order; each run's last ≤ BUCKET_GROWTH × its first, and
    the element after a run would break that bound (runs are as long as allowed)."""
    gen = torch.Generator().manual_seed(seed)
    counts = sorted(torch.randint(1, 60, (30,), generator=gen).tolist())
    bounds = bucket_bounds(counts)
    assert [lo for lo, _ in bounds] == [0] + [hi for _, hi in bounds[:-1]] and bounds[-1][1] == 30
    for lo, hi in bounds:
        assert counts[hi - 1] <= BUCKET_GROWTH * counts[lo]
        assert hi == 30 or counts[hi] > BUCKET_GROWTH * counts[lo]
    assert bucket_bounds([]) == []


def test_batched_plan_is_reused_within_a_step_only() -> None:
    """Every layer of one step with the same window shares the plan (a sliding layer of a mixed
    model gets its own); a new step, or another KV cache group (a new meta), gets new ones."""
    backend = TorchBatchedAttentionBackend()
    case = make_case(SCENARIOS["decodes_many_lengths"][0], 2, 16, torch.float32, seed=3)
    write_and_attend(backend, case, 0.25, None)
    first = case.meta.plans[None]
    write_and_attend(backend, case, 0.25, None)
    assert case.meta.plans[None] is first
    write_and_attend(backend, case, 0.25, 8)
    assert case.meta.plans[None] is first and case.meta.plans[8] is not first
    other = make_case(SCENARIOS["decode"][0], 2, 16, torch.float32, seed=4)
    write_and_attend(backend, other, 0.25, None)
    assert other.meta.plans[None] is not first and len(other.meta.plans[None].buckets) >= 1
    assert 8 not in other.meta.plans
