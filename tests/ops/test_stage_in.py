"""The stage-in kernel (ops/stage_in.py) against slicing: random words and tables, outputs poisoned, word
counts at and around the block size (several loop iterations with a small BLOCK), tables of several
shapes into a wider fixed-width table; Triton under the interpreter on CPU. On the GPU the sources are
pinned host memory, as in the engine, and a rewrite of that memory between two launches must show in
the second (no stale cached line)."""
from __future__ import annotations

import pytest
import torch

from pagedlm.ops import stage_in as stage_in_module
from pagedlm.ops.stage_in import stage_in

CAPACITY = 100  # words past the head
POISON = -7


def _buffers(device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    pin = device == "cuda"
    words = torch.randint(-2**31, 2**31 - 1, (CAPACITY,), dtype=torch.int32, generator=generator)
    table = torch.randint(0, 10_000, (CAPACITY,), dtype=torch.int32, generator=generator)
    return dict(header=torch.zeros(4, dtype=torch.int64, pin_memory=pin), src=words.pin_memory() if pin else words,
                table_src=table.pin_memory() if pin else table,
                dst=torch.full((CAPACITY,), POISON, dtype=torch.int32, device=device),
                table_dst=torch.full((6, 24), POISON, dtype=torch.int32, device=device))


def _run_and_check(bufs: dict[str, torch.Tensor], num_words: int, rows: int, cols: int,
                   block: int = stage_in_module.BLOCK) -> None:
    bufs["header"][:3] = torch.tensor([num_words, rows, cols])
    bufs["dst"].fill_(POISON)
    bufs["table_dst"].fill_(POISON)
    stage_in(bufs["header"], bufs["src"], bufs["dst"], bufs["table_src"], bufs["table_dst"], block)
    dst, table_dst = bufs["dst"].cpu(), bufs["table_dst"].cpu()
    assert dst[:num_words].equal(bufs["src"][:num_words])
    assert (dst[num_words:] == POISON).all()
    want_table = torch.full((6, 24), POISON, dtype=torch.int32)
    want_table[:rows, :cols] = bufs["table_src"][:rows * cols].view(rows, cols)
    assert table_dst.equal(want_table)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [16, stage_in_module.BLOCK])
def test_copies_the_header_s_words_and_table(device: str, block: int) -> None:
    """block 16: word counts below, at and past one block, and several loop iterations (100 words: 7
    blocks); tables of one row, several rows, a row wider than a block; none (0 columns)."""
    bufs = _buffers(device, torch.Generator().manual_seed(block))
    for num_words, rows, cols in [(0, 0, 0), (5, 1, 3), (16, 0, 0), (17, 4, 5), (40, 1, 24), (CAPACITY, 6, 16)]:
        _run_and_check(bufs, num_words, rows, cols, block)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_sees_the_host_rewrite_between_launches() -> None:
    """The engine rewrites a staging set every other step: the second launch over the same pinned
    memory must read the new words and header, not lines cached from the first."""
    bufs = _buffers("cuda", torch.Generator().manual_seed(0))
    _run_and_check(bufs, 60, 2, 7)
    torch.cuda.synchronize()
    bufs["src"].copy_(torch.randint(0, 1000, (CAPACITY,), dtype=torch.int32))
    bufs["table_src"].copy_(torch.randint(0, 1000, (CAPACITY,), dtype=torch.int32))
    _run_and_check(bufs, 60, 3, 7)


def test_rejects_bad_input() -> None:
    words = torch.zeros(8, dtype=torch.int32)
    table = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="header must be int64"):
        stage_in(torch.zeros(2, dtype=torch.int64), words, words.clone(), words, table)
    with pytest.raises(ValueError, match="must be int32"):
        stage_in(torch.zeros(3, dtype=torch.int64), words.long(), words.long(), words, table)
    with pytest.raises(ValueError, match="one size"):
        stage_in(torch.zeros(3, dtype=torch.int64), words, words[:4], words, table)
