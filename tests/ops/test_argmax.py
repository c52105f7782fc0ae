"""The greedy pick (ops/argmax.py) against torch.argmax + index_copy_: random rows, ties across
chunks and lanes, rows of -inf, several loop iterations a program (Triton under the interpreter
on CPU, bf16 on the GPU)."""

from __future__ import annotations

import pytest
import torch

from pagedlm.ops import argmax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def expected(logits: torch.Tensor, table: torch.Tensor, table_rows: torch.Tensor):
    want_table = table.clone()
    ids = logits.float().argmax(dim=-1)
    want_table.index_copy_(0, table_rows, ids)
    return ids, want_table


def run_triton(logits: torch.Tensor, table_rows: torch.Tensor, table_size: int = 20):
    table = torch.full((table_size,), -7, dtype=torch.int64, device=logits.device)
    want_ids, want_table = expected(logits, table, table_rows)
    ids = argmax.greedy_pick_triton(logits, table, table_rows)
    assert ids.tolist() == want_ids.tolist()
    assert table.tolist() == want_table.tolist()
    return ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("vocab", [1, 100, 3000])
def test_random_rows(dtype: torch.dtype, vocab: int) -> None:
    logits = torch.randn(3, vocab, device=DEVICE).to(dtype)
    run_triton(logits, torch.tensor([5, 0, 17], device=DEVICE))


@pytest.mark.parametrize("max_chunks", [2, 128])
def test_ties_pick_the_first_index(monkeypatch: pytest.MonkeyPatch, max_chunks: int) -> None:
    """The max sits at several indices in different chunks and lanes (and, with 2 chunks of 16,
    several loop iterations of one program): the first index wins, as with torch.argmax."""
    monkeypatch.setattr(argmax, "BLOCK", 16)
    monkeypatch.setattr(argmax, "MAX_CHUNKS", max_chunks)
    logits = torch.randn(5, 500, device=DEVICE)
    # row 4: 3, 35 and 67 fall to one lane of one program (2 chunks of 16: a stride of 32)
    for row, places in enumerate(([3, 40, 499], [77, 76], [480, 5, 33, 16], [0, 499], [3, 35, 67])):
        logits[row, places] = 10.0
    ids = run_triton(logits, torch.arange(5, device=DEVICE) * 2)
    assert ids.tolist() == [3, 76, 5, 0, 3]


def test_rows_of_minus_inf_pick_zero() -> None:
    logits = torch.full((2, 1100), float("-inf"), device=DEVICE)
    logits[1, 900] = -1e30
    assert run_triton(logits, torch.tensor([1, 2], device=DEVICE)).tolist() == [0, 900]


def test_nan_counts_as_the_largest_value() -> None:
    """As torch.argmax: the first NaN wins; a row of NaN (a graph's garbage padding row) picks 0,
    never an id past the vocabulary."""
    logits = torch.randn(3, 1100, device=DEVICE)
    logits[0, [700, 90]] = float("nan")
    logits[1] = float("nan")
    logits[2, 1099] = float("nan")
    assert run_triton(logits, torch.tensor([4, 5, 6], device=DEVICE)).tolist() == [90, 0, 1099]


def test_no_rows() -> None:
    logits = torch.randn(0, 50, device=DEVICE)
    assert run_triton(logits, torch.zeros(0, dtype=torch.int64, device=DEVICE)).shape == (0,)


def test_torch_path_matches() -> None:
    logits = torch.randn(3, 64)
    table = torch.zeros(8, dtype=torch.int64)
    ids = argmax.greedy_pick(logits, table, torch.tensor([7, 1, 4]))
    assert ids.tolist() == logits.argmax(-1).tolist()
    assert table[[7, 1, 4]].tolist() == ids.tolist()


def test_rejects_bad_input() -> None:
    logits, table = torch.randn(2, 10), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="table_rows must be"):
        argmax.greedy_pick(logits, table, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="table must be"):
        argmax.greedy_pick(logits, table.int(), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="logits must be"):
        argmax.greedy_pick(logits.t(), table, torch.zeros(10, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("vocab", [128256, 151936])
def test_gpu_vocab_rows(vocab: int) -> None:
    """The workloads' vocabularies at 1 and 8 rows, bf16-rounded float32 logits (many ties)."""
    for rows in (1, 8):
        logits = torch.randn(rows, vocab, device="cuda").bfloat16().float()
        run_triton(logits, torch.randperm(rows, device="cuda") + 3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_host_ids_get_the_picks(device: str) -> None:
    """host_ids (pinned on the GPU, as a staged graph's output): the first N entries are the picks, the
    rest untouched; through the Triton kernel and through the torch path."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    logits = torch.randn(3, 700, device=device)
    rows = torch.tensor([4, 1, 9], device=device)
    for pick in (argmax.greedy_pick_triton, argmax.greedy_pick):
        host_ids = torch.full((5,), -3, dtype=torch.int64, pin_memory=device == "cuda")
        table = torch.zeros(12, dtype=torch.int64, device=device)
        ids = pick(logits, table, rows, host_ids)
        if device == "cuda":
            torch.cuda.synchronize()
        assert host_ids.tolist() == [*logits.argmax(-1).tolist(), -3, -3]
        assert ids.tolist() == host_ids[:3].tolist()
    with pytest.raises(ValueError, match="host_ids must be"):
        argmax.greedy_pick(logits, table, rows, torch.zeros(2, dtype=torch.int64))
