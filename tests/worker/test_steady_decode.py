"""The host step's shortcuts for steady decodes: sections a step shares with the step before are
neither rewritten nor copied, and the device buffers still hold exactly what a full layout would
give; tokens of a past step land only where their row and position still expect them."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from worker_helpers import MiniScheduler, Req, make_config, make_runner, random_prompt

from pagedlm.core.sched_output import NewRequestData, SchedulerOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.input_batch import InputBatch
from pagedlm.worker.step_buffers import StepBuffers

GREEDY = SamplingParams(temperature=0.0)
_STEP_SECTIONS = {"positions", "slot_mapping", "seq_lens"}
_SEQ_SECTIONS = {"query_start_loc", "logits_indices", "sample_rows"}


class Twin:
    """A runner that reuses sections and one that never does (its InputBatch forgets the
    previous step before each), fed the same schedules; records each step's copied sections."""

    def __init__(self, folder) -> None:
        config = make_config(folder, max_num_seqs=4, max_num_batched_tokens=16, block_size=8)
        self.runner, self.reference = make_runner(config), make_runner(config)
        self.copied: list[set[str]] = []
        copy_from = self.runner._inputs.copy_from

        def recorded_copy_from(src: StepBuffers, sizes: dict[str, int]) -> None:
            self.copied.append({name for name, size in sizes.items() if size})
            copy_from(src, sizes)

        self.runner._inputs.copy_from = recorded_copy_from
        prepare = self.reference.input_batch.prepare

        def forgetful_prepare(sched, buf):
            self.reference.input_batch.forget_previous_step()
            return prepare(sched, buf)

        self.reference.input_batch.prepare = forgetful_prepare

    def step(self, sched: SchedulerOutput):
        """Both runners launch the step; their device inputs must agree on what it uses."""
        pending = self.runner.execute_model(sched)
        expected = self.reference.execute_model(sched)
        if not sched.is_empty:
            self._assert_same_inputs(sched)
        return pending, expected

    def _assert_same_inputs(self, sched: SchedulerOutput) -> None:
        num_seqs = len(sched.num_scheduled_tokens)
        num_tokens = sched.total_num_scheduled_tokens
        num_cols = self.reference.input_batch._previous.num_block_cols
        num_samples = len(sched.sampling_req_ids)
        used = {"input_ids": num_tokens, "positions": num_tokens, "slot_mapping": num_tokens,
                "query_start_loc": num_seqs + 1, "seq_lens": num_seqs,
                "block_table": num_seqs * num_cols, "logits_indices": num_samples,
                "sample_rows": num_samples,
                "decode_order": num_seqs if num_tokens == num_seqs else 0}
        for name, size in used.items():
            got = self.runner._inputs.tensors[name][:size].tolist()
            want = self.reference._inputs.tensors[name][:size].tolist()
            assert got == want, (name, sched.step_id, got, want)


def _run(twin: Twin, sched: MiniScheduler, async_mode: bool,
         arrivals: dict[int, Req] | None = None) -> None:
    """The engine loop over both runners (async: one step in flight while the next is
    launched); `arrivals`: requests added before the step of that number."""
    in_flight: list = []
    num_steps = 0
    while sched.has_work() or in_flight:
        if arrivals and num_steps in arrivals:
            sched.add(arrivals[num_steps])
        if sched.has_work():
            in_flight.append(twin.step(sched.schedule()))
            num_steps += 1
        if in_flight and (not async_mode or len(in_flight) == 2 or not sched.has_work()):
            pending, expected = in_flight.pop(0)
            output, expected_output = pending.get_output(), expected.get_output()
            assert (output.req_ids, output.sampled_token_ids) == \
                (expected_output.req_ids, expected_output.sampled_token_ids)
            sched.update(output)


@pytest.mark.parametrize("async_mode", [False, True])
def test_reused_sections_equal_a_full_layout(tiny, async_mode):
    """Decodes crossing block boundaries, a request joining (prefill beside decodes), one
    finishing early: every step's device inputs equal the no-reuse runner's."""
    folder, _ = tiny
    twin = Twin(folder)
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=16)
    sched.add(Req("a", random_prompt(5, 1), 30))
    sched.add(Req("b", random_prompt(3, 2), 12))
    _run(twin, sched, async_mode, arrivals={6: Req("c", random_prompt(13, 3), 9)})
    assert {req_id: len(tokens) for req_id, tokens in sched.done.items()} == \
        {"a": 30, "b": 12, "c": 9}
    steady = [copied for copied in twin.copied if not copied & _SEQ_SECTIONS]
    assert len(steady) >= 15, twin.copied  # most decode steps reuse the sequence sections
    assert any("block_table" not in copied for copied in steady)  # and the block table
    assert any("block_table" in copied for copied in steady)  # until a block is added
    # async: every input id is a token still on the device, none is copied
    assert all(("input_ids" in copied) != async_mode for copied in steady)
    assert all(copied - {"input_ids", "block_table"} == _STEP_SECTIONS for copied in steady)
    assert any("decode_order" in copied for copied in twin.copied)  # decodes that do not reuse


def test_reuse_survives_preemption(tiny):
    folder, _ = tiny
    twin = Twin(folder)
    sched = MiniScheduler(block_size=8, max_num_seqs=2, token_budget=16)
    sched.add(Req("p", random_prompt(10, 20), 14))
    sched.add(Req("q", random_prompt(4, 21), 14))
    for _ in range(5):
        pending, _expected = twin.step(sched.schedule())
        sched.update(pending.get_output())
    sched.preempt("q")  # q leaves the worker; p decodes alone; q comes back with its outputs
    _run(twin, sched, async_mode=False)
    assert len(sched.done["p"]) == 14 and len(sched.done["q"]) == 14
    assert sum(copied == _STEP_SECTIONS | {"input_ids"} for copied in twin.copied) >= 3


def _batch_with_one_request(req_id: str, num_prompt: int = 4) -> tuple[InputBatch, StepBuffers]:
    batch = InputBatch(max_num_reqs=2, max_model_len=32, block_size=8)
    buf = StepBuffers(max_num_tokens=16, max_num_reqs=2, max_num_blocks_per_req=4,
                      device=torch.device("cpu"), pin=False)
    batch.add_request(NewRequestData(req_id, list(range(1, num_prompt + 1)), [], GREEDY, [0], 0),
                      None)
    return batch, buf


def _prefill(batch: InputBatch, buf: StepBuffers, req_id: str, num_prompt: int = 4):
    return batch.prepare(SchedulerOutput([], [], {req_id: num_prompt}, num_prompt,
                                         sampling_req_ids={req_id}), buf)


def test_tokens_of_a_row_with_a_new_owner_are_dropped():
    batch, buf = _batch_with_one_request("old")
    layout = _prefill(batch, buf, "old")  # samples position 4 of "old", row 0
    batch.remove_request("old")
    batch.add_request(NewRequestData("new", [7, 8, 9, 10], [], GREEDY, [1], 0), None)  # row 0
    batch.record_sampled(layout, np.array([55]))
    assert batch.num_tokens_np[0] == 4 and batch.token_ids_np[0, :5].tolist() == [7, 8, 9, 10, 0]


def test_tokens_are_recorded_once_at_the_next_position():
    batch, buf = _batch_with_one_request("r")
    layout = _prefill(batch, buf, "r")
    batch.record_sampled(layout, np.array([42]))
    batch.record_sampled(layout, np.array([43]))  # the same step again: already known
    assert batch.num_tokens_np[0] == 5 and batch.token_ids_np[0, :6].tolist() == [1, 2, 3, 4, 42, 0]
