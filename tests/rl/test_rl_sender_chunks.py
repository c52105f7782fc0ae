"""The sender's chunks at tp > 1 (pagedlm/rl/sender.py): bounded by the bytes of every worker's
slices, which is what a chunk's packed buffers hold at once, and the slices packed from views
(no compact copy of the chunk first)."""

from __future__ import annotations

import torch

from pagedlm.distributed.weight_shards import layout_slices, split
from pagedlm.rl.sender import _chunks, slices_bytes

TP = 2
# "w" sharded along dim 0 (rows 0-1 to rank 0, 2-3 to rank 1); anything else replicated
LAYOUT = {"tp_size": TP, "slices": {"w": [[0, 0, 2, 4], [0, 2, 2, 4]]}}
_, SLICES = layout_slices(LAYOUT)


def test_slices_bytes_counts_a_replicated_tensor_once_per_worker() -> None:
    sharded, replicated = torch.zeros(4, 3), torch.zeros(5, dtype=torch.float16)
    assert slices_bytes(SLICES, "w", sharded) == 4 * 3 * 4  # the halves, once each
    assert slices_bytes(SLICES, "norm", replicated) == TP * 5 * 2


def test_chunks_stay_within_the_sent_bytes() -> None:
    named = [("w", torch.zeros(4, 3)), ("norm", torch.zeros(6)), ("w", torch.zeros(4, 3))]
    # every worker's slices: 48, 48, 48 bytes; the tensors alone: 48, 24, 48
    chunks = list(_chunks(named, 80, lambda n, t: slices_bytes(SLICES, n, t)))
    assert chunks == [[named[0]], [named[1]], [named[2]]]
    assert list(_chunks(named, 80, lambda n, t: t.nbytes)) == [named[:2], named[2:]]
    (alone,) = _chunks(named[:1], 10, lambda n, t: t.nbytes)  # larger than a chunk: alone
    assert alone == named[:1]


def test_split_gives_views_unless_compact() -> None:
    tensor = torch.arange(12.0).reshape(4, 3)
    views = split([("w", tensor)], SLICES, TP, "test", compact=False)
    copies = split([("w", tensor)], SLICES, TP, "test")
    for rank in range(TP):
        (_, view), (_, copy) = views[rank][0], copies[rank][0]
        assert torch.equal(view, tensor[2 * rank : 2 * rank + 2]) and torch.equal(copy, view)
        assert view.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
        assert copy.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
