"""The engine core's bitmask fill (structured_outputs/manager.py) with a real xgrammar grammar on a
tiny byte-level tokenizer: the grammar's vocabulary is the tokenizer's (a model's padding is left
to the bitmask's width), rows are filled in place, a matcher that ended allows every token; with
speculative drafts, only the prefix the grammar accepts is verified, row j is the mask after drafts
1..j, and the matcher is left as before the fill."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import xgrammar as xgr
from tiny_hf_models import byte_level_tokenizer

from pagedlm.core.sched_output import GrammarBitmask
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams, StructuredOutputsParams
from pagedlm.structured_outputs.manager import ConstrainedRows, StructuredOutputManager


def _manager_and_requests(
    choice: list[str], num: int
) -> tuple[StructuredOutputManager, list[Request], object, int]:
    tokenizer = byte_level_tokenizer()
    num_ids = max(tokenizer.get_vocab().values()) + 1
    config = SimpleNamespace(vocab_size=num_ids + 1000, eos_token_ids={tokenizer.eos_token_id})
    manager = StructuredOutputManager(config, tokenizer)  # a padded vocabulary, above
    params = SamplingParams(structured_outputs=StructuredOutputsParams(choice=choice))
    requests = [Request(f"r{i}", [1, 2], params, max_tokens=8) for i in range(num)]
    for request in requests:
        manager.add_request(request)
        request.structured_output.future.result(timeout=60)
        assert request.structured_output.is_ready()
    assert manager.num_words == (num_ids + 31) // 32  # the tokenizer's ids, not the padding
    return manager, requests, tokenizer, num_ids


def _mask_after(request: Request, token_ids: list[int], num_ids: int) -> np.ndarray:
    """[W] a fresh matcher's bitmask after token_ids (all ones once it ended)."""
    matcher = xgr.GrammarMatcher(request.structured_output.future.result())
    for token_id in token_ids:
        assert matcher.accept_token(token_id)
    if matcher.is_terminated():
        return np.full((num_ids + 31) // 32, -1, dtype=np.int32)
    expected = xgr.allocate_token_bitmask(1, num_ids)
    matcher.fill_next_token_bitmask(expected)
    return expected.numpy()[0]


def test_fill_writes_in_place_and_an_ended_matcher_allows_everything() -> None:
    manager, (ended, fresh), tokenizer, num_ids = _manager_and_requests(["hello"], 2)
    eos = tokenizer.eos_token_id
    for token_id in tokenizer.encode("hello", add_special_tokens=False) + [eos]:
        assert ended.structured_output.matcher.accept_token(token_id)
    assert ended.structured_output.matcher.is_terminated()

    out = GrammarBitmask(
        np.full(4, -7, dtype=np.int64), np.full((4, manager.num_words), 5, dtype=np.int32)
    )  # poisoned
    states = [ended.structured_output, fresh.structured_output]
    rows = ConstrainedRows(np.array([0, 2]), states, [[], []], [0, 1])
    filled = manager.fill(rows, out)
    assert np.shares_memory(filled.bitmask, out.bitmask) and filled.bitmask.shape[0] == 2
    assert list(out.logits_rows[:2]) == [0, 2]
    assert (out.bitmask[0] == -1).all()  # its token is dropped: anything goes
    expected = xgr.allocate_token_bitmask(1, num_ids)
    xgr.GrammarMatcher(fresh.structured_output.future.result()).fill_next_token_bitmask(expected)
    np.testing.assert_array_equal(out.bitmask[1], expected.numpy()[0])
    assert (out.bitmask[2:] == 5).all()  # rows past M untouched
    manager.shutdown()


def test_drafts_verified_up_to_the_grammar_and_a_mask_row_for_each() -> None:
    """Three constrained requests of one step, in batch order with an unconstrained one: "he" of
    the drafts "hex" (x refused), all of "hi" + EOS + "x" up to the EOS (which ends the
    grammar), none. Logits rows: 3 (1 + 2 drafts), then the unconstrained one's 1, 4, 1."""
    manager, requests, tokenizer, num_ids = _manager_and_requests(["help", "hi"], 3)
    ids = {c: tokenizer.encode(c, add_special_tokens=False)[0] for c in "hexil"}
    eos = tokenizer.eos_token_id
    first, second, third = (request.structured_output for request in requests)
    for state in (first, second, third):  # every request took "h" already
        assert not state.accept_token(ids["h"])
    assert first.schedule_drafts([ids["e"], ids["x"], ids["l"]]) == 1  # e; x refused
    assert second.schedule_drafts([ids["i"], eos, ids["x"]]) == 2  # i, EOS; nothing past the end
    assert third.schedule_drafts([]) == 0
    sched = SimpleNamespace(
        num_scheduled_tokens={"r0": 2, "u": 1, "r1": 3, "r2": 1},
        sampling_req_ids={"r0", "u", "r1", "r2"},
        num_draft_tokens={"r0": 1, "r1": 2},
    )
    by_id = {request.request_id: request for request in requests}
    by_id["u"] = SimpleNamespace(structured_output=None)
    rows = manager.constrained_rows(sched, by_id)
    assert rows.logits_rows.tolist() == [0, 1, 3, 4, 5, 6]
    out = GrammarBitmask(
        np.full(8, -7, dtype=np.int64), np.full((8, manager.num_words), 5, dtype=np.int32)
    )  # poisoned
    filled = manager.fill(rows, out)
    h = [ids["h"]]
    expected = [
        _mask_after(requests[0], h, num_ids),
        _mask_after(requests[0], h + [ids["e"]], num_ids),
        _mask_after(requests[1], h, num_ids),
        _mask_after(requests[1], h + [ids["i"]], num_ids),
        _mask_after(requests[1], h + [ids["i"], eos], num_ids),  # ended: all ones
        _mask_after(requests[2], h, num_ids),
    ]
    np.testing.assert_array_equal(filled.bitmask, np.stack(expected))
    assert (expected[4] == -1).all() and not (expected[3] == -1).all()
    assert (out.bitmask[6:] == 5).all()
    # the matchers are where they were: the same fill again gives the same rows
    again = manager.fill(manager.constrained_rows(sched, by_id), out)
    np.testing.assert_array_equal(again.bitmask, np.stack(expected))
    assert not first.accept_token(ids["e"])  # and take the emitted tokens as before
    manager.shutdown()
