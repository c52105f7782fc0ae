"""StepBuffers: the packed layout of a step's sections (bucketed counts, aligned, disjoint), the ids
table (head + input_ids), one copy of a byte range that never touches the head, and the padding of
a decode batch for a CUDA graph."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from pagedlm.worker.sizes import bucket_size
from pagedlm.worker.step_buffers import StepBuffers

NUM_REQS, NUM_HEAD_IDS = 6, 10
BUCKET = functools.partial(bucket_size, [1, 2, 4, 6])


def _buffers() -> StepBuffers:
    return StepBuffers(
        max_num_tokens=32,
        max_num_reqs=NUM_REQS,
        max_num_blocks_per_req=5,
        device=torch.device("cpu"),
        pin=False,
        bucket=BUCKET,
        num_head_ids=NUM_HEAD_IDS,
    )


def test_an_odd_head_is_padded_so_input_ids_start_16_byte_aligned():
    buf = StepBuffers(
        max_num_tokens=32,
        max_num_reqs=NUM_REQS,
        max_num_blocks_per_req=5,
        device=torch.device("cpu"),
        pin=False,
        bucket=BUCKET,
        num_head_ids=9,
    )
    assert buf.num_head_ids == 10 and buf.head.numel() == 10
    for num_tokens, num_seqs in [(1, 1), (7, 2), (32, 6)]:
        for tensor in buf.sections(num_tokens, num_seqs).tensors.values():
            assert (tensor.data_ptr() - buf.flat.data_ptr()) % 16 == 0


def test_sections_are_aligned_disjoint_and_bucketed():
    buf = _buffers()
    assert [buf.bucket(n) for n in (1, 3, 5, 6, 7, 32, 300)] == [1, 4, 6, 6, 256, 256, 512]
    for num_tokens, num_seqs in [(4, 4), (7, 2), (32, 6)]:
        sections = buf.sections(num_tokens, num_seqs)
        assert buf.sections(num_tokens, num_seqs) is sections  # cached
        spans = []
        for name, tensor in sections.tensors.items():
            if name == "ids_table":
                continue
            start = tensor.data_ptr() - buf.flat.data_ptr()
            spans.append((start, start + tensor.numel() * tensor.element_size()))
            assert start % 16 == 0 and tensor.is_contiguous(), (
                name
            )  # Triton's pointer specialisation
            assert np.shares_memory(sections.arrays[name], buf.flat.numpy()), name
        spans.sort()
        assert spans[0][0] == buf.num_head_ids * 8 and spans[-1][1] <= buf.flat.numel()
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
        capacities = {name: tensor.numel() for name, tensor in sections.tensors.items()}
        assert capacities["input_ids"] == capacities["input_src"] == num_tokens
        assert (
            capacities["query_start_loc"] == num_seqs + 1 and capacities["sample_rows"] == num_seqs
        )
        assert capacities["block_table"] == num_seqs * 5


def test_ids_table_is_the_head_then_input_ids():
    buf = _buffers()
    sections = buf.sections(4, 4)
    buf.head[:] = torch.arange(NUM_HEAD_IDS) + 100
    sections.tensors["input_ids"][:] = torch.arange(4) + 7
    assert sections.tensors["ids_table"].tolist() == list(range(100, 110)) + [7, 8, 9, 10]


def test_one_copy_of_a_range_past_the_head():
    """A: to seq_lens; B: to input_src; C: into the block table. The head is never copied."""
    src, dst = _buffers(), _buffers()
    src.flat.copy_(torch.randint(1, 255, src.flat.shape, dtype=torch.uint8))
    sections = src.sections(4, 4)
    end_a, end_b = sections.copy_end(False, 0), sections.copy_end(True, 0)
    end_c = sections.copy_end(False, 6)  # a table copy covers B too
    table = sections.tensors["block_table"]
    assert end_a < end_b < end_c == table.data_ptr() - src.flat.data_ptr() + 6 * 4
    for end in (end_a, end_b, end_c):
        dst.flat.zero_()
        dst.copy_from(src, end)
        assert (dst.flat[: NUM_HEAD_IDS * 8] == 0).all()  # last_sampled lives there
        assert dst.flat[NUM_HEAD_IDS * 8 : end].equal(src.flat[NUM_HEAD_IDS * 8 : end])
        assert (dst.flat[end:] == 0).all()


def test_pad_decode():
    """Rows [2, 4) of a decode batch of 2 sequences (1 sampling) padded for a graph of 4."""
    buf = _buffers()
    sections = buf.sections(4, 4)
    for array in sections.arrays.values():
        array[:] = 99
    buf.pad_decode(sections, num_seqs=2, num_samples=1, seq_sections=False)
    arrays = sections.arrays
    assert arrays["input_ids"][2:].tolist() == arrays["positions"][2:].tolist() == [0, 0]
    assert arrays["slot_mapping"][2:].tolist() == [-1, -1]
    assert arrays["seq_lens"][2:].tolist() == [0, 0]
    assert arrays["input_src"].tolist() == [99] * 4  # B: the device holds it
    buf.pad_decode(sections, num_seqs=2, num_samples=1, seq_sections=True)
    assert arrays["query_start_loc"].tolist() == [
        99,
        99,
        2,
        2,
        2,
    ]  # [2]: the real rows' end, as written
    assert arrays["decode_order"].tolist() == [99, 99, 2, 3]
    assert arrays["input_src"].tolist() == [99, 99, NUM_HEAD_IDS + 2, NUM_HEAD_IDS + 3]
    assert arrays["sample_rows"].tolist() == [99, NUM_REQS + 1, NUM_REQS + 2, NUM_REQS + 3]
    assert arrays["input_ids"][:2].tolist() == [99, 99]  # real rows untouched


@pytest.mark.gpu
def test_a_device_set_pads_as_a_host_set():
    """The graph capture and timing pad the device set (torch) with the method a step pads its host
    staging set with (numpy): the same bytes, every row padding."""
    host = _buffers()
    device = StepBuffers(
        max_num_tokens=32,
        max_num_reqs=NUM_REQS,
        max_num_blocks_per_req=5,
        device=torch.device("cuda"),
        pin=False,
        bucket=BUCKET,
        num_head_ids=NUM_HEAD_IDS,
    )
    for buf in (host, device):
        buf.flat.fill_(99)
        buf.pad_decode(buf.sections(6, 6), num_seqs=0, num_samples=0, seq_sections=True)
    assert device.flat.cpu().equal(host.flat)
    arrays = host.sections(6, 6).arrays
    assert (
        arrays["query_start_loc"].tolist() == [0] * 7
        and arrays["slot_mapping"].tolist() == [-1] * 6
    )
    assert arrays["input_src"].tolist() == [NUM_HEAD_IDS + i for i in range(6)]
    assert arrays["sample_rows"].tolist() == [NUM_REQS + i for i in range(6)]
