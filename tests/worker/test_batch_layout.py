"""The ragged batch the runner builds for a hand-made SchedulerOutput: a decode, a prefill chunk
that ends inside a block, and a prefix-cache hit, checked field by field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from worker_helpers import VOCAB, make_config, make_runner, save_tiny_llama

from pagedlm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.batch_layout import leading_decodes

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    save_tiny_llama(path)
    return path


class Recorder:
    """Wraps the model; keeps copies of what each forward and compute_logits saw."""

    def __init__(self, model) -> None:
        self.model = model
        self.forwards: list[dict] = []
        self.logits_inputs: list[torch.Tensor] = []

    def __call__(self, input_ids, positions, kv_caches, meta, inputs_embeds=None):
        hidden = self.model(input_ids, positions, kv_caches, meta, inputs_embeds=inputs_embeds)
        self.forwards.append(
            dict(
                input_ids=input_ids.tolist(),
                positions=positions.tolist(),
                meta=meta,
                query_start_loc=meta.query_start_loc.tolist(),
                seq_lens=meta.seq_lens.tolist(),
                slot_mapping=meta.slot_mapping.tolist(),
                block_table=meta.block_table.tolist(),
                query_start_loc_cpu=meta.query_start_loc_cpu.tolist(),
                seq_lens_cpu=meta.seq_lens_cpu.tolist(),
                hidden=hidden.clone(),
                decode_order=None if meta.decode_order is None else meta.decode_order.tolist(),
                staging_ptr=meta.query_start_loc_cpu.data_ptr(),
            )
        )
        return hidden

    def compute_logits(self, hidden):
        self.logits_inputs.append(hidden.clone())
        logits = self.model.compute_logits(hidden)
        assert torch.isfinite(logits).all(), "attended to a KV slot nobody wrote"
        return logits

    def embed_tokens(self, input_ids):
        return self.model.embed_tokens(input_ids)


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(
        0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


@pytest.mark.parametrize("async_mode", [False, True])
def test_mixed_batch_layout(folder, async_mode):
    runner = make_runner(
        make_config(folder, max_num_seqs=4, max_num_batched_tokens=32, block_size=8, num_blocks=16)
    )
    for kv_cache in runner.kv_caches:
        kv_cache[:, 11] = 0.0  # C's prefix-cache hit: a block some earlier request wrote
    recorder = Recorder(runner.model)
    runner.model = recorder
    prompt_a, prompt_b, prompt_c = _prompt(20, 1), _prompt(11, 2), _prompt(13, 3)
    step1 = SchedulerOutput(
        new_reqs=[NewRequestData("B", prompt_b, [], GREEDY, [5, 9], 0)],
        cached_reqs=[],
        num_scheduled_tokens={"B": 11},
        total_num_scheduled_tokens=11,
        sampling_req_ids={"B"},
    )
    step2 = SchedulerOutput(
        new_reqs=[
            NewRequestData("A", prompt_a, [], GREEDY, [7, 3, 8], 0),
            NewRequestData("C", prompt_c, [], GREEDY, [11, 2], 8),
        ],
        cached_reqs=[CachedRequestData("B", [], 11)],
        num_scheduled_tokens={"B": 1, "A": 10, "C": 5},
        total_num_scheduled_tokens=16,
        sampling_req_ids={"B", "C"},
    )
    pending1 = runner.execute_model(step1)
    if not async_mode:
        pending1.get_output()
    pending2 = runner.execute_model(step2)
    num_tokens_before = runner.input_batch.num_tokens_np.tolist()
    out1, out2 = pending1.get_output(), pending2.get_output()
    assert runner.input_batch.num_tokens_np.tolist() == num_tokens_before  # reading writes no state
    token_b = out1.sampled_token_ids[0][0]

    assert runner.input_batch.req_id_to_row == {"B": 0, "A": 1, "C": 2}
    got = recorder.forwards[1]
    assert got["input_ids"] == [token_b] + prompt_a[:10] + prompt_c[8:13]
    assert got["positions"] == [11] + list(range(10)) + list(range(8, 13))
    assert got["query_start_loc"] == got["query_start_loc_cpu"] == [0, 1, 11, 16]
    assert got["seq_lens"] == got["seq_lens_cpu"] == [12, 10, 13]
    # B: block 9 offset 3; A: block 7 then block 3 (the chunk ends inside it); C: block 2
    assert got["slot_mapping"] == [75] + list(range(56, 64)) + [24, 25] + list(range(16, 21))
    assert got["block_table"] == [[5, 9], [7, 3], [11, 2]]  # only the columns this step needs
    meta = got["meta"]
    assert (meta.num_tokens, meta.num_seqs, meta.max_query_len, meta.max_seq_len) == (16, 3, 10, 13)
    assert meta.num_decodes == 1 and got["decode_order"] == [0]  # B decodes ahead of the chunks
    # logits only for the last token of B and of C (A's chunk does not sample)
    torch.testing.assert_close(recorder.logits_inputs[1], got["hidden"][[0, 15]], rtol=0, atol=0)
    assert out1.req_ids == ["B"] and out2.req_ids == ["B", "C"]
    assert recorder.forwards[0]["staging_ptr"] != got["staging_ptr"]  # staging sets alternate
    runner.execute_model(
        SchedulerOutput([], [], {}, 0)
    )  # first records the outputs read, in step order
    assert runner.input_batch.token_ids_np[0, 11] == token_b
    assert runner.input_batch.num_tokens_np.tolist()[:3] == [13, 20, 14]


def test_leading_decodes():
    counts = [([1, 1, 5, 1], 2), ([3, 1], 0), ([1, 1, 1], 3), ([7], 0), ([], 0)]
    for num_scheduled, want in counts:
        assert leading_decodes(np.array(num_scheduled, np.int32)) == want, num_scheduled


def test_decode_order_is_longest_first(folder):
    """A decode-only step carries its sequences by decreasing length, ties in batch order; a
    step of prefill chunks only carries none; a mixed step its leading decodes' order."""
    runner = make_runner(
        make_config(folder, max_num_seqs=5, max_num_batched_tokens=48, block_size=8, num_blocks=16)
    )
    recorder = Recorder(runner.model)
    runner.model = recorder
    prompts = {"A": _prompt(5, 11), "B": _prompt(12, 12), "C": _prompt(9, 13), "D": _prompt(12, 14)}
    blocks = {"A": [0], "B": [1, 2], "C": [3, 4], "D": [5, 6]}
    new_reqs = [NewRequestData(r, prompts[r], [], GREEDY, blocks[r], 0) for r in prompts]
    prefill = SchedulerOutput(
        new_reqs=new_reqs,
        cached_reqs=[],
        num_scheduled_tokens={r: len(p) for r, p in prompts.items()},
        total_num_scheduled_tokens=38,
        sampling_req_ids=set(prompts),
    )
    runner.execute_model(prefill).get_output()
    order = ["C", "A", "D", "B"]  # batch order differs from row order
    decode = SchedulerOutput(
        new_reqs=[],
        cached_reqs=[CachedRequestData(r, [], len(prompts[r])) for r in order],
        num_scheduled_tokens=dict.fromkeys(order, 1),
        total_num_scheduled_tokens=4,
        sampling_req_ids=set(order),
    )
    runner.execute_model(decode).get_output()
    assert recorder.forwards[0]["decode_order"] is None
    got = recorder.forwards[1]
    assert got["seq_lens"] == [10, 6, 13, 13]
    assert got["decode_order"] == [2, 3, 0, 1]  # D before B: the tie keeps batch order
    mixed_order = ["A", "C", "B", "D"]
    mixed = SchedulerOutput(
        new_reqs=[NewRequestData("E", _prompt(5, 15), [], GREEDY, [7], 0)],
        cached_reqs=[CachedRequestData(r, [], len(prompts[r]) + 1) for r in mixed_order],
        num_scheduled_tokens={**dict.fromkeys(mixed_order, 1), "E": 5},
        total_num_scheduled_tokens=9,
        sampling_req_ids=set(mixed_order) | {"E"},
    )
    runner.execute_model(mixed).get_output()
    got = recorder.forwards[2]
    assert got["seq_lens"] == [7, 11, 14, 14, 5] and got["meta"].num_decodes == 4
    assert got["decode_order"] == [2, 3, 1, 0]  # B, D (tied), C, A; E is no decode


def test_layout_is_the_same_in_sync_and_async(folder):
    """The async run's placeholder is filled on the device with the token the sync run knew."""
    tokens = {}
    for async_mode in (False, True):
        runner = make_runner(make_config(folder, block_size=8))
        new = NewRequestData("R", _prompt(9, 4), [], GREEDY, [0, 1], 0)
        outputs, pending = [], None
        for step in range(4):
            sched = SchedulerOutput(
                new_reqs=[new] if step == 0 else [],
                cached_reqs=[] if step == 0 else [CachedRequestData("R", [], 8 + step)],
                num_scheduled_tokens={"R": 9 if step == 0 else 1},
                total_num_scheduled_tokens=9 if step == 0 else 1,
                sampling_req_ids={"R"},
            )
            output = runner.execute_model(sched)
            if async_mode:
                output, pending = pending, output
            if output is not None:
                outputs += output.get_output().sampled_token_ids[0]
        outputs += pending.get_output().sampled_token_ids[0] if async_mode else []
        tokens[async_mode] = outputs
    assert len(tokens[True]) == 4 and tokens[True] == tokens[False]


def test_bad_schedules_raise(folder):
    runner = make_runner(make_config(folder, block_size=8, num_blocks=16))
    unknown = SchedulerOutput([], [], {"X": 1}, 1)
    with pytest.raises(ValueError, match="not on the worker"):
        runner.execute_model(unknown)
    short = SchedulerOutput(
        [NewRequestData("S", _prompt(12, 5), [], GREEDY, [0], 0)], [], {"S": 12}, 12
    )
    with pytest.raises(ValueError, match="blocks hold fewer"):
        runner.execute_model(short)
    out_of_range = SchedulerOutput(
        [NewRequestData("O", _prompt(4, 6), [], GREEDY, [16], 0)], [], {"O": 4}, 4
    )
    with pytest.raises(ValueError, match=r"num_blocks=16"):
        runner.execute_model(out_of_range)
    # the sampler refuses the parameters (an empty bad word): the request must not keep its row
    num_reqs = runner.input_batch.num_reqs
    bad_params = NewRequestData(
        "V", _prompt(4, 9), [], SamplingParams(bad_words_token_ids=[[]]), [3], 0
    )
    with pytest.raises(ValueError, match="bad_words_token_ids"):
        runner.execute_model(SchedulerOutput([bad_params], [], {"V": 4}, 4))
    assert runner.input_batch.num_reqs == num_reqs and "V" not in runner.input_batch.req_id_to_row
    # a position past the known tokens that no earlier step is sampling
    ok = SchedulerOutput([NewRequestData("P", _prompt(4, 8), [], GREEDY, [2], 0)], [], {"P": 4}, 4)
    runner.execute_model(ok).get_output()
    beyond = SchedulerOutput([], [CachedRequestData("P", [], 5)], {"P": 1}, 1)
    with pytest.raises(ValueError, match="neither known nor being sampled"):
        runner.execute_model(beyond)
