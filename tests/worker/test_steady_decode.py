"""The host step's shortcuts for steady decodes: sections a step shares with the step before are
neither rewritten nor copied, and the device buffers still hold exactly what a full layout would
give; each step copies its inputs to the device in one range; tokens of a past step land only
where their row and position still expect them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from worker_helpers import MiniScheduler, Req, make_config, make_runner, random_prompt

from pagedlm.core.sched_output import NewRequestData, SchedulerOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.batch_layout import leading_decodes
from pagedlm.worker.input_batch import InputBatch
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.step_buffers import StepBuffers

GREEDY = SamplingParams(temperature=0.0)


class InputRecorder:
    """Wraps the model; keeps the input ids of the last forward."""

    def __init__(self, model) -> None:
        self.model = model
        self.input_ids: list[int] = []

    def __call__(self, input_ids, *args, **kwargs):
        self.input_ids = input_ids.tolist()
        return self.model(input_ids, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.model, name)


class Twin:
    """A runner that reuses sections and one that never does (its InputBatch forgets the
    previous step before each), fed the same schedules; records what each step copied: "A"
    (the per-step sections), "AB" (and the sequence sections) or "ABC" (and the block table)."""

    def __init__(self, folder) -> None:
        config = make_config(folder, max_num_seqs=4, max_num_batched_tokens=16, block_size=8)
        self.runner, self.reference = make_runner(config), make_runner(config)
        self.runner.model, self.reference.model = (
            InputRecorder(self.runner.model),
            InputRecorder(self.reference.model),
        )
        self.copied: list[str] = []
        self.decode_only: list[bool] = []
        prepare, copy_from = self.runner.input_batch.prepare, self.runner._inputs.copy_from

        def recorded_prepare(sched, buf):
            layout = prepare(sched, buf)
            self._sections = buf.sections(layout.bucket_tokens, layout.bucket_seqs)
            self.decode_only.append(layout.num_tokens == layout.num_seqs)
            return layout

        def recorded_copy_from(src: StepBuffers, end: int) -> None:
            groups = {
                self._sections.copy_end(False, 0): "A",
                self._sections.copy_end(True, 0): "AB",
            }
            self.copied.append(groups.get(end, "ABC"))
            copy_from(src, end)

        self.runner.input_batch.prepare = recorded_prepare
        self.runner._inputs.copy_from = recorded_copy_from
        reference_prepare = self.reference.input_batch.prepare

        def forgetful_prepare(sched, buf):
            self.reference.input_batch.forget_previous_step()
            return reference_prepare(sched, buf)

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
        used = {
            "positions": num_tokens,
            "slot_mapping": num_tokens,
            "query_start_loc": num_seqs + 1,
            "seq_lens": num_seqs,
            "block_table": num_seqs * num_cols,
            "logits_indices": num_samples,
            "sample_rows": num_samples,
            "decode_order": leading_decodes(
                np.fromiter(sched.num_scheduled_tokens.values(), np.int32)
            ),
        }
        got, want = _device_sections(self.runner, sched), _device_sections(self.reference, sched)
        for name, size in used.items():
            assert got[name][:size].tolist() == want[name][:size].tolist(), (name, sched.step_id)
        # the input ids the model read (input_src differs where one runner knows a token the
        # other reads from last_sampled)
        assert self.runner.model.input_ids == self.reference.model.input_ids, sched.step_id


def _device_sections(runner, sched: SchedulerOutput) -> dict[str, torch.Tensor]:
    inputs = runner._inputs
    return inputs.sections(
        inputs.bucket(sched.total_num_scheduled_tokens),
        inputs.bucket(len(sched.num_scheduled_tokens)),
    ).tensors


def _run(
    twin: Twin, sched: MiniScheduler, async_mode: bool, arrivals: dict[int, Req] | None = None
) -> None:
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
            assert (output.req_ids, output.sampled_token_ids) == (
                expected_output.req_ids,
                expected_output.sampled_token_ids,
            )
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
    assert {req_id: len(tokens) for req_id, tokens in sched.done.items()} == {
        "a": 30,
        "b": 12,
        "c": 9,
    }
    assert len(twin.copied) == len(twin.decode_only)  # one copy per step
    assert twin.copied.count("A") >= 15, twin.copied  # most decode steps reuse B and C
    decodes = [copied for copied, decode in zip(twin.copied, twin.decode_only) if decode]
    assert "ABC" in decodes  # a decode crossing a block boundary (or changing its rows)
    assert all(
        copied == "ABC" for copied, decode in zip(twin.copied, twin.decode_only) if not decode
    )  # prefills never reuse


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
    assert twin.copied[5:].count("A") >= 3


def test_same_rows_after_a_chunk_copy_the_table_again(tiny):
    """The rows and blocks of a step with a prefill chunk, then the same rows decoding: the layout
    (the section offsets) changed, so the block table is copied although it did not."""
    folder, _ = tiny
    twin = Twin(folder)
    sched = MiniScheduler(block_size=8, max_num_seqs=2, token_budget=6)
    sched.add(Req("short", random_prompt(2, 30), 8))
    sched.add(Req("long", random_prompt(7, 31), 4))  # prefill in chunks of 4 beside a decode
    _run(twin, sched, async_mode=True)
    assert len(sched.done["short"]) == 8 and len(sched.done["long"]) == 4
    transitions = [
        i for i in range(1, len(twin.copied)) if twin.decode_only[i] and not twin.decode_only[i - 1]
    ]
    assert transitions and all(twin.copied[i] == "ABC" for i in transitions)


class _CopyCounter(TorchDispatchMode):
    """Counts copy_ calls but those into `on_device`, a device buffer the runner fills from device
    tensors only (on CUDA, not a transfer: the runner's copy of the sampling rows into the LM
    head's padded buffer)."""

    def __init__(self, on_device: torch.Tensor) -> None:
        super().__init__()
        self.num_copies = 0
        self._on_device = on_device.untyped_storage().data_ptr()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "copy_":
            self.num_copies += args[0].untyped_storage().data_ptr() != self._on_device
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("async_mode", [False, True])
def test_steady_decode_step_copies_once_each_way(tiny, async_mode):
    """The eager path on the CPU issues what a CUDA step would: one copy of the staging range to
    the device and one of the sampled ids back, whatever the batch size (the copy of the sampling
    rows into the LM head's padded buffer stays on the device)."""
    folder, _ = tiny
    runner = make_runner(make_config(folder, max_num_seqs=4, max_num_batched_tokens=16))
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=16)
    for i in range(3):
        sched.add(Req(f"r{i}", random_prompt(4 + i, 40 + i), 12))
    counter, pending, copies = _CopyCounter(runner.lm_head.hidden), None, []
    for step in range(10):
        counted = step >= 3
        counter.num_copies = 0
        with counter if counted else torch.no_grad():
            output = runner.execute_model(sched.schedule())
        if counted:
            copies.append(counter.num_copies)
        if async_mode:
            output, pending = pending, output
        if output is not None:
            sched.update(output.get_output())
    assert copies == [2] * len(copies)


def _batch_with_one_request(req_id: str, num_prompt: int = 4) -> tuple[InputBatch, StepBuffers]:
    batch = InputBatch(max_num_reqs=2, max_model_len=32, block_size=8)
    buf = StepBuffers(
        max_num_tokens=16,
        max_num_reqs=2,
        max_num_blocks_per_req=4,
        device=torch.device("cpu"),
        pin=False,
        bucket=SizePolicy(2, 16).step_bucket,
        num_head_ids=2,
    )
    batch.add_request(
        NewRequestData(req_id, list(range(1, num_prompt + 1)), [], GREEDY, [0], 0), None
    )
    return batch, buf


def _prefill(batch: InputBatch, buf: StepBuffers, req_id: str, num_prompt: int = 4):
    return batch.prepare(
        SchedulerOutput([], [], {req_id: num_prompt}, num_prompt, sampling_req_ids={req_id}), buf
    )


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
