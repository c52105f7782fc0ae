"""The stage-in kernel (ops/stage_in.py) against slicing: random words, the output poisoned, word counts
at and around the block size (several loop iterations with a small block); Triton under the interpreter
on CPU. On the GPU the source and header are pinned host memory, as in the engine, and a rewrite of that
memory between two launches must show in the second (no stale cached line)."""

from __future__ import annotations

import pytest
import torch

from pagedlm.ops import stage_in as stage_in_module
from pagedlm.ops.stage_in import stage_in

CAPACITY = 100  # words past the head
POISON = -7


def _buffers(device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    pin = device == "cuda"
    words = torch.randint(-(2**31), 2**31 - 1, (CAPACITY,), dtype=torch.int32, generator=generator)
    return dict(
        header=torch.zeros(2, dtype=torch.int64, pin_memory=pin),
        src=words.pin_memory() if pin else words,
        dst=torch.full((CAPACITY,), POISON, dtype=torch.int32, device=device),
    )


def _run_and_check(
    bufs: dict[str, torch.Tensor], num_words: int, block: int = stage_in_module.BLOCK
) -> None:
    bufs["header"][0] = num_words
    bufs["dst"].fill_(POISON)
    stage_in(bufs["header"], bufs["src"], bufs["dst"], block)
    dst = bufs["dst"].cpu()
    assert dst[:num_words].equal(bufs["src"][:num_words])
    assert (dst[num_words:] == POISON).all()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [16, stage_in_module.BLOCK])
def test_copies_the_header_s_words(device: str, block: int) -> None:
    """block 16: word counts below, at and past one block, and several loop iterations (100 words: 7
    blocks); none."""
    bufs = _buffers(device, torch.Generator().manual_seed(block))
    for num_words in (0, 5, 16, 17, 40, CAPACITY):
        _run_and_check(bufs, num_words, block)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_sees_the_host_rewrite_between_launches() -> None:
    """The engine rewrites a staging set every other step: the second launch over the same pinned
    memory must read the new words and header, not lines cached from the first."""
    bufs = _buffers("cuda", torch.Generator().manual_seed(0))
    _run_and_check(bufs, 60)
    torch.cuda.synchronize()
    bufs["src"].copy_(torch.randint(0, 1000, (CAPACITY,), dtype=torch.int32))
    _run_and_check(bufs, 70)


def test_rejects_bad_input() -> None:
    words = torch.zeros(8, dtype=torch.int32)
    with pytest.raises(ValueError, match="header must be int64"):
        stage_in(torch.zeros(1, dtype=torch.int32), words, words.clone())
    with pytest.raises(ValueError, match="int32 of one size"):
        stage_in(torch.zeros(1, dtype=torch.int64), words.long(), words.long())
    with pytest.raises(ValueError, match="int32 of one size"):
        stage_in(torch.zeros(1, dtype=torch.int64), words, words[:4])
