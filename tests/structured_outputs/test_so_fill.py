"""The engine core's bitmask fill (structured_outputs/manager.py) with a real xgrammar grammar on a
tiny byte-level tokenizer: the grammar's vocabulary is the tokenizer's (a model's padding is left
to the bitmask's width), rows are filled in place, a matcher that ended allows every token."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import xgrammar as xgr
from tiny_hf_models import byte_level_tokenizer

from pagedlm.core.sched_output import GrammarBitmask
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams, StructuredOutputsParams
from pagedlm.structured_outputs.manager import ConstrainedRows, StructuredOutputManager


def test_fill_writes_in_place_and_an_ended_matcher_allows_everything() -> None:
    tokenizer = byte_level_tokenizer()
    num_ids = max(tokenizer.get_vocab().values()) + 1
    eos = tokenizer.eos_token_id
    config = SimpleNamespace(vocab_size=num_ids + 1000, eos_token_ids={eos})  # padded
    manager = StructuredOutputManager(config, tokenizer)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(choice=["hello"]))
    ended, fresh = (Request(f"r{i}", [1, 2], params, max_tokens=8) for i in range(2))
    for request in (ended, fresh):
        manager.add_request(request)
        request.structured_output.future.result(timeout=60)
        assert request.structured_output.is_ready()
    assert manager.num_words == (num_ids + 31) // 32  # the tokenizer's ids, not the padding
    for token_id in tokenizer.encode("hello", add_special_tokens=False) + [eos]:
        assert ended.structured_output.matcher.accept_token(token_id)
    assert ended.structured_output.matcher.is_terminated()

    out = GrammarBitmask(
        np.full(4, -7, dtype=np.int64), np.full((4, manager.num_words), 5, dtype=np.int32)
    )  # poisoned
    rows = ConstrainedRows(np.array([0, 2]), [ended.structured_output, fresh.structured_output])
    filled = manager.fill(rows, out)
    assert np.shares_memory(filled.bitmask, out.bitmask) and filled.bitmask.shape[0] == 2
    assert list(out.sample_indices[:2]) == [0, 2]
    assert (out.bitmask[0] == -1).all()  # its token is dropped: anything goes
    expected = xgr.allocate_token_bitmask(1, num_ids)
    xgr.GrammarMatcher(fresh.structured_output.future.result()).fill_next_token_bitmask(expected)
    np.testing.assert_array_equal(out.bitmask[1], expected.numpy()[0])
    assert (out.bitmask[2:] == 5).all()  # rows past M untouched
    manager.shutdown()
