"""The transfer's wire on its own: packing round trips, and what update_info may hold."""

from __future__ import annotations

import pytest
import torch

from pagedlm.rl.transport import ALIGN_BYTES, ChunkInfo, pack, unpack


def test_pack_unpack_round_trip_mixed_dtypes() -> None:
    gen = torch.Generator().manual_seed(0)
    named = [
        ("a", torch.randn(3, 5, generator=gen).to(torch.bfloat16)),  # 30 bytes: the next is padded
        ("b", torch.randn(7, generator=gen)),
        ("c", torch.randn(2, 3, generator=gen).to(torch.float16).t()),  # not contiguous
        ("d", torch.randn(0, 4, generator=gen)),
        ("e", torch.randn(1, generator=gen).double()),
    ]
    info = ChunkInfo.from_dict(ChunkInfo.of(named).to_dict())
    offsets, total = info.offsets()
    assert all(offset % ALIGN_BYTES == 0 for offset in offsets)
    assert total == offsets[-1] + 8
    received = torch.full((total,), 0xAB, dtype=torch.uint8)  # poisoned
    received.copy_(pack(named, torch.device("cpu")))
    for (name, sent), (got_name, got) in zip(named, unpack(info, received), strict=True):
        assert got_name == name and got.dtype == sent.dtype
        torch.testing.assert_close(got, sent, rtol=0, atol=0)


@pytest.mark.parametrize(
    "update_info, message",
    [
        ({"names": ["x"]}, "must be a dict of names"),
        ({"names": ["x"], "dtype_names": ["int32"], "shapes": [[1]]}, "not a floating-point"),
        ({"names": ["x"], "dtype_names": ["bogus"], "shapes": [[1]]}, "not a floating-point"),
        ({"names": ["x", "y"], "dtype_names": ["float32"], "shapes": [[1]]}, "differ in length"),
        ({"names": ["x"], "dtype_names": ["float32"], "shapes": [[-1]]}, "list of sizes"),
        ({"names": [3], "dtype_names": ["float32"], "shapes": [[1]]}, "must be strings"),
        ({"names": "x", "dtype_names": ["float32"], "shapes": [[1]]}, "must be lists"),
    ],
)
def test_bad_update_info(update_info, message) -> None:
    with pytest.raises(ValueError, match=message):
        ChunkInfo.from_dict(update_info)
