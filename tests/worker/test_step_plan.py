"""plan_step: one step's mode, graph size (None when eager, never 0), stage slot, padding and copy
range, from its layout and the graphs the runner holds (step_plan.py's module notes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.worker.batch_layout import BatchLayout, EmbedsSpan
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.step_buffers import StepBuffers
from pagedlm.worker.step_plan import StepMode, plan_step

POLICY = SizePolicy(max_num_seqs=16, max_num_tokens=64)  # decode graphs 1..16, piecewise 16, 32, 64
BUFFERS = StepBuffers(
    64, 32, 4, torch.device("cpu"), pin=False, bucket=POLICY.step_bucket, num_head_ids=48
)
ALL_GRAPHS = dict(decode_graphs=True, staged_graphs=True, piecewise_graphs=True)


def _layout(
    num_tokens: int, num_seqs: int, copies_table: bool = True, embeds: bool = False
) -> BatchLayout:
    rows = np.zeros(0, np.int32)
    return BatchLayout(
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_query_len=1 if num_tokens == num_seqs else num_tokens,
        max_seq_len=8,
        num_block_cols=1,
        num_placeholders=0,
        sampling_req_ids=[],
        sample_rows_np=rows,
        sample_epochs_np=rows.astype(np.int64),
        sample_positions_np=rows,
        sample_num_logprobs_np=rows,
        embeds_spans=[EmbedsSpan(row=0, batch_start=0, prompt_start=0, length=1)] if embeds else [],
        bucket_tokens=POLICY.step_bucket(num_tokens),
        bucket_seqs=POLICY.step_bucket(num_seqs),
        reuse_seq_sections=not copies_table,
        reuse_block_table=not copies_table,
    )


def _plan(layout: BatchLayout, **graphs: bool):
    sections = BUFFERS.sections(layout.bucket_tokens, layout.bucket_seqs)
    return plan_step(7, 1, layout, sections, sections, POLICY, **{**ALL_GRAPHS, **graphs})


@pytest.mark.parametrize(
    "layout, graphs, mode, graph_size, pads",
    [
        (_layout(3, 3, copies_table=False), {}, StepMode.STAGED_GRAPH, 4, True),
        (
            _layout(3, 3),
            {},
            StepMode.DECODE_GRAPH,
            4,
            True,
        ),  # a table copy: one copy, the plain graph
        (
            _layout(3, 3, copies_table=False),
            dict(staged_graphs=False),
            StepMode.DECODE_GRAPH,
            4,
            True,
        ),
        (
            _layout(12, 12, copies_table=False),
            {},
            StepMode.DECODE_GRAPH,
            16,
            True,
        ),  # above the staged sizes
        (_layout(3, 3, embeds=True), {}, StepMode.EAGER, None, True),  # padded for a later replay
        (_layout(20, 20), {}, StepMode.PIECEWISE, 32, False),  # a decode above the largest graph
        (_layout(20, 2), {}, StepMode.PIECEWISE, 32, False),
        (_layout(20, 2, embeds=True), {}, StepMode.EAGER, None, False),
        (_layout(20, 2), dict(piecewise_graphs=False), StepMode.EAGER, None, False),
        (
            _layout(3, 3),
            dict(decode_graphs=False, staged_graphs=False, piecewise_graphs=False),
            StepMode.EAGER,
            None,
            False,
        ),
    ],
)
def test_modes(layout, graphs, mode, graph_size, pads):
    plan = _plan(layout, **graphs)
    assert (plan.mode, plan.graph_size, plan.pads_decode) == (mode, graph_size, pads)
    assert plan.replays_decode_graph == (mode in (StepMode.DECODE_GRAPH, StepMode.STAGED_GRAPH))
    assert plan.stage_slot == (1 if mode is StepMode.STAGED_GRAPH else None)
    assert (plan.step_id, plan.slot, plan.layout) == (7, 1, layout)


def test_the_copy_covers_what_the_step_writes():
    reused, copied = _plan(_layout(3, 3, copies_table=False)), _plan(_layout(3, 3))
    sections = BUFFERS.sections(4, 4)
    assert reused.copy_end == sections.copy_end(
        False, 0
    )  # A only: the device holds B and the table
    assert copied.copy_end == sections.copy_end(True, 3)  # into the table (3 x 1 columns), B too
