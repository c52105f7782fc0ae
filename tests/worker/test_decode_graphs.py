"""The pure-decode CUDA-graph path without CUDA: capture sizes, when graphs are on, and what a graph
replays (the input-id gather, the batch padded in the static buffers, fixed host ints, the
fixed-width block table, the small graphs' logits, argmax and write into last_sampled), run
eagerly through the Triton kernels in the interpreter; greedy tokens must equal transformers';
a greedy batch takes the graph's ids, any other is sampled as without graphs.
Capture and replay themselves need CUDA: tests/gpu/test_cuda_graphs.py."""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch
from worker_helpers import (
    VOCAB,
    MiniScheduler,
    Req,
    hf_greedy,
    make_config,
    make_runner,
    run_requests,
    save_tiny_llama,
)

from pagedlm.sampling_params import SamplingParams
from pagedlm.worker import cuda_graphs
from pagedlm.worker.cuda_graphs import DecodeGraphs, graphs_enabled
from pagedlm.worker.sizes import (
    MAX_LOGITS_ROWS,
    MIN_SAVING_MS,
    SPEED_MARGIN,
    capture_sizes,
    fastest_sizes,
)


class EagerGraphs(DecodeGraphs):
    """capture() without CUDA: each graph (a size's plain one and its staged ones) runs the function a
    CUDA graph would hold."""

    def capture(self, stream: None = None) -> None:
        for size in self.sizes:
            slots = range(len(self._staging)) if self.is_staged(size) else ()
            for slot in (None, *slots):
                self._graphs[size, slot] = SimpleNamespace(
                    replay=functools.partial(self._run, size, slot)
                )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    return path, save_tiny_llama(path)


def _prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def test_capture_sizes():
    sizes = capture_sizes(max_num_seqs=1024, max_num_tokens=16384)
    assert (
        len(sizes) == 67 and sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-1] == 1024
    )  # max_num_seqs
    assert sizes[sizes.index(256) + 1] == 272 and sizes[sizes.index(512) + 1] == 544
    assert sizes == sorted(set(sizes))
    assert capture_sizes(2048, 16384)[-1] == 1024  # the largest graph
    assert capture_sizes(6, 8192) == [1, 2, 4, 6]  # capped at max_num_seqs, the cap included
    assert capture_sizes(256, 100) == [1, 2, 4, *range(8, 97, 8), 100]  # and at the token budget
    assert capture_sizes(1, 1) == [1]


def _kept(times: dict[int, float], kinds: dict[int, int] | None = None) -> list[int]:
    return fastest_sizes(
        times, kinds or {size: 1 for size in times}
    )  # default: one attention kernel


def test_a_size_gives_way_only_to_a_markedly_faster_larger_one():
    assert _kept({16: 1.0, 24: 3.0, 32: 2.0}) == [16, 32]  # 24 replays slower than 32
    assert _kept({16: 10.0, 24: 10.0 * (1 - SPEED_MARGIN / 2)}) == [
        16,
        24,
    ]  # saves 0.5 ms, within the margin
    assert _kept({16: 2 * MIN_SAVING_MS, 24: MIN_SAVING_MS / 2}) == [24]  # both margins met
    assert _kept({16: MIN_SAVING_MS, 24: MIN_SAVING_MS / 4}) == [16, 24]  # saves too little time
    assert _kept({16: 1.12, 24: 1.11, 32: 1.0}) == [
        16,
        24,
        32,
    ]  # 16 against 24, which it would replay
    assert _kept({16: 1.12, 24: 1.25, 32: 1.0}) == [
        32
    ]  # 24 gives way, then 16 to the next kept: 32
    assert _kept({16: 5.0, 24: 1.0}, kinds={16: 2, 24: 1}) == [16, 24]  # another attention kernel
    assert _kept({16: 9.0}) == [16] and _kept({}) == []


def test_graphs_only_on_cuda_with_triton_unless_eager(tiny):
    config = make_config(tiny[0])  # CPU
    cuda = dataclasses.replace(
        config, device=torch.device("cuda"), enforce_eager=False, attention_backend="auto"
    )
    assert not graphs_enabled(config)
    assert graphs_enabled(cuda)
    assert graphs_enabled(dataclasses.replace(cuda, attention_backend="triton"))
    assert not graphs_enabled(dataclasses.replace(cuda, enforce_eager=True))
    assert not graphs_enabled(dataclasses.replace(cuda, attention_backend="torch"))


def _graphed_runner(
    folder,
    max_num_seqs: int = 8,
    max_model_len: int = 64,
    max_num_batched_tokens: int = 16,
    graph_size_timing: bool = True,
):
    """A Triton-backend runner (interpreter) whose decode steps replay EagerGraphs."""
    runner = make_runner(
        make_config(
            folder,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            attention_backend="triton",
            graph_size_timing=graph_size_timing,
        )
    )
    graphs = EagerGraphs(
        runner.config,
        runner.model,
        runner.kv_caches,
        runner._inputs,
        runner.input_batch.max_num_blocks_per_req,
        runner._staging,
        runner._sampled_cpu,
        sizes=runner.sizes,
    )
    graphs.capture()
    runner.graphs = graphs
    return runner, graphs


# max_model_len 64: the varlen kernel; 512: split decode (the captured max_seq_len is
# max_model_len, so 2 splits, the second empty for these short sequences)
@pytest.mark.parametrize("max_model_len, async_mode", [(64, False), (512, True)])
def test_padded_decode_greedy_equals_transformers(tiny, max_model_len, async_mode):
    folder, hf_model = tiny
    runner, graphs = _graphed_runner(folder, max_model_len=max_model_len)
    assert graphs.sizes == [1, 2, 4, 8] and runner.sizes.decode_graph_size(5) == 8
    assert runner.sizes.decode_graph_size(9) is None
    replays: list[tuple[int, int]] = []  # (sequences in the batch, replayed size)
    replay, prepare = graphs.replay, runner.input_batch.prepare
    num_seqs = 0

    def recorded_prepare(sched, buf):
        nonlocal num_seqs
        num_seqs = len(sched.num_scheduled_tokens)
        return prepare(sched, buf)

    def counted_replay(size: int, slot: int | None = None) -> torch.Tensor:
        replays.append((num_seqs, size))
        slots.append(slot)
        if slot is not None:  # what the graph does first: then its inputs are in place
            graphs.stage_in(size, slot)
        inputs = runner._inputs.sections(size, size).tensors
        expected = torch.argsort(-inputs["seq_lens"].long(), stable=True)  # padding rows: 0, last
        assert inputs["decode_order"].tolist() == expected.tolist()
        key = runner.input_batch._previous  # the step's rows and table width
        table = runner.input_batch.block_table_np[key.rows_np, : key.num_block_cols]
        assert graphs.block_table[:num_seqs, : key.num_block_cols].tolist() == table.tolist()
        if (
            slot is not None
        ):  # the graph must stage its inputs in again: poison what the check staged
            assert num_copies == copies_before_step  # and the step copied nothing itself
            expected_inputs = runner._inputs.words.clone()
            runner._inputs.words[
                : int(runner._staging[slot].head[0])
            ] = -1  # what the header says to copy
            hidden = replay(size, slot)
            assert runner._inputs.words.equal(expected_inputs)
            return hidden
        return replay(size, slot)

    num_loads = num_copies = copies_before_step = 0
    load_block_table, copy_from, execute = (
        graphs.load_block_table,
        runner._inputs.copy_from,
        runner.execute_model,
    )
    slots: list[int | None] = []

    def counted_load(block_table: torch.Tensor, version: int) -> None:
        nonlocal num_loads
        num_loads += 1
        load_block_table(block_table, version)

    def counted_copy(src, end: int) -> None:
        nonlocal num_copies
        num_copies += 1
        copy_from(src, end)

    def marked_execute(sched):
        nonlocal copies_before_step
        copies_before_step = num_copies
        return execute(sched)

    runner.input_batch.prepare, graphs.replay = recorded_prepare, counted_replay
    graphs.load_block_table, runner._inputs.copy_from, runner.execute_model = (
        counted_load,
        counted_copy,
        marked_execute,
    )
    # r0 lives longest: its first block (slot 0) is read by every step that pads
    specs = [(11, 9), (3, 4), (6, 6), (17, 5), (1, 8), (9, 7), (5, 3)]  # (prompt len, max tokens)
    sched = MiniScheduler(block_size=8, max_num_seqs=8, token_budget=16)
    for i, (num_prompt, max_tokens) in enumerate(specs):
        sched.add(Req(f"r{i}", _prompt(num_prompt, i), max_tokens))
    done = run_requests(runner, sched, async_mode)
    for i, (num_prompt, max_tokens) in enumerate(specs):
        assert done[f"r{i}"] == hf_greedy(hf_model, max_tokens, _prompt(num_prompt, i)), i
    assert len(replays) >= 5 and any(num_seqs < size for num_seqs, size in replays)
    assert all(size == runner.sizes.decode_graph_size(num_seqs) for num_seqs, size in replays)
    assert 0 < num_loads <= len(replays)
    # the plain graph where a step copies a block table (here, with rows finishing, most steps; in
    # async mode every one), else staged, from both sets
    assert None in slots and (async_mode or {0, 1} <= set(slots)), slots


def test_batches_of_a_slow_size_replay_the_larger_graph(tiny):
    """max_num_seqs 24: sizes 1, 2, 4, 8 (untimed: they hold the LM head), 16 and 24, whose replay
    times (faked: EagerGraphs runs eagerly) make 16 lose to 24: batches of 9 to 16 sequences are laid
    out and replayed at 24, in every staging set; tokens equal transformers'."""
    folder, hf_model = tiny
    runner, graphs = _graphed_runner(folder, max_num_seqs=24, max_num_batched_tokens=32)
    timed: list[list[int]] = []

    def fake_times(sizes: list[int]) -> dict[int, float]:
        timed.append(sizes)
        return {16: 3.0, 24: 2.0}

    graphs.replay_times = fake_times
    runner._keep_fastest_graph_sizes()
    assert timed == [[16, 24]] and graphs.sizes == [1, 2, 4, 8, 24]
    assert runner.sizes.decode_graph_size(9) == 24
    assert {buffers.bucket(9) for buffers in (*runner._staging, runner._inputs)} == {24}
    assert not any(key[0] == 16 for key in graphs._graphs)
    assert runner.lm_head.bucket(9) == 16  # the LM head keeps every row count
    replays: list[tuple[int, int]] = []  # (sequences in the batch, replayed size)
    replay = graphs.replay

    def recorded_replay(size: int, slot: int | None = None) -> torch.Tensor:
        replays.append((len(runner.input_batch._previous.req_ids), size))
        return replay(size, slot)

    graphs.replay = recorded_replay
    specs = [
        (3 + i % 4, 2 + i) for i in range(12)
    ]  # (prompt len, max tokens): 12 sequences, then fewer
    sched = MiniScheduler(block_size=8, max_num_seqs=24, token_budget=32)
    for i, (num_prompt, max_tokens) in enumerate(specs):
        sched.add(Req(f"r{i}", _prompt(num_prompt, 40 + i), max_tokens))
    done = run_requests(runner, sched, async_mode=True)
    for i, (num_prompt, max_tokens) in enumerate(specs):
        assert done[f"r{i}"] == hf_greedy(hf_model, max_tokens, _prompt(num_prompt, 40 + i)), i
    assert {size for num_seqs, size in replays if num_seqs > 8} == {24}, replays
    assert {size for num_seqs, size in replays if num_seqs <= 8} <= {1, 2, 4, 8}, replays
    assert {num_seqs for num_seqs, _ in replays} >= {9, 10, 11}, replays


def test_a_size_gives_way_only_within_its_number_of_decode_splits(tiny, monkeypatch):
    """Each timed size's kind is the split decode its capture chose (decode_kind of that size and
    max_model_len): 16 splitting, 24 not, so 16 stays though 24 replays faster."""
    runner, graphs = _graphed_runner(tiny[0], max_num_seqs=24, max_num_batched_tokens=32)
    asked: list[tuple[int, int]] = []

    def kind(num_seqs: int, kv_cache: torch.Tensor, max_seq_len: int) -> tuple[int, bool]:
        asked.append((num_seqs, max_seq_len))
        return (2, False) if num_seqs <= 16 else (2, True)

    monkeypatch.setattr(cuda_graphs, "decode_kind", kind)
    graphs.replay_times = lambda sizes: {16: 3.0, 24: 2.0}
    runner._keep_fastest_graph_sizes()
    assert sorted(asked) == [(16, 64), (24, 64)] and graphs.sizes == [1, 2, 4, 8, 16, 24]


def test_size_timing_off_keeps_every_size(tiny, caplog):
    """graph_size_timing off (--no-graph-size-timing): neither the decode graphs nor the piecewise
    graphs are timed, every size stays (restarts replay the same), and the log says why."""
    runner, graphs = _graphed_runner(
        tiny[0], max_num_seqs=24, max_num_batched_tokens=32, graph_size_timing=False
    )
    graphs.replay_times = lambda sizes: pytest.fail(
        "decode graphs timed with graph_size_timing off"
    )
    runner.piecewise = SimpleNamespace(
        keep_fastest=lambda: pytest.fail("pieces timed with graph_size_timing off")
    )
    with caplog.at_level("INFO", logger="pagedlm"):
        runner._keep_fastest_graph_sizes()
    assert graphs.sizes == [1, 2, 4, 8, 16, 24] and runner._inputs.bucket(9) == 16
    assert "CUDA graphs: every size kept (--no-graph-size-timing)" in caplog.text


@pytest.mark.parametrize("async_mode", [False, True])
def test_steady_single_decode_stages_all_but_the_block_steps(tiny, async_mode):
    """L2's shape: one request decoding alone. Every decode step replays a staged graph (no input copy of
    its own) but the first and those that add a block (every block_size tokens), which copy the table
    and replay the plain graph; tokens equal transformers'."""
    folder, hf_model = tiny
    runner, graphs = _graphed_runner(folder, max_model_len=512)
    slots: list[int | None] = []
    replay = graphs.replay

    def recorded_replay(size: int, slot: int | None = None) -> torch.Tensor:
        slots.append(slot)
        return replay(size, slot)

    graphs.replay = recorded_replay
    sched = MiniScheduler(block_size=8, max_num_seqs=8, token_budget=16)
    sched.add(Req("r0", _prompt(5, 0), 40))
    done = run_requests(runner, sched, async_mode)
    assert done["r0"] == hf_greedy(hf_model, 40, _prompt(5, 0))
    num_plain = slots.count(None)
    # 39 decode steps from position 5 to 43: blocks start at 8, 16, 24, 32, 40, plus the first decode
    assert len(slots) == 39 and num_plain == 6 and {0, 1} <= set(slots), slots


def test_small_graphs_compute_logits_and_argmax(tiny):
    """Graphs of up to MAX_LOGITS_ROWS rows also hold the LM head and its argmax, which they
    write into last_sampled at sample_rows (padding rows at scratch entries past the real rows);
    larger ones leave all that to the runner. Inputs: one-token sequences, sequence i in block i,
    input ids gathered from last_sampled (even rows) or copied (odd rows)."""
    runner = make_runner(
        make_config(tiny[0], max_num_seqs=16, max_num_batched_tokens=16, attention_backend="triton")
    )
    graphs = EagerGraphs(
        runner.config,
        runner.model,
        runner.kv_caches,
        runner._inputs,
        runner.input_batch.max_num_blocks_per_req,
        runner._staging,
        runner._sampled_cpu,
        sizes=runner.sizes,
    )
    graphs.capture()
    assert graphs.sizes == [1, 2, 4, 8, 16] and MAX_LOGITS_ROWS == 8
    block_size, num_head_ids = runner.config.cache.block_size, runner._inputs.num_head_ids
    last_sampled = runner._last_sampled
    for size in graphs.sizes:
        inputs = runner._inputs.sections(size, size).tensors
        rows = torch.arange(size)
        last_sampled.fill_(-1)
        last_sampled[rows] = rows + 5
        inputs["input_ids"][:] = rows + 3
        inputs["input_src"][:] = torch.where(rows % 2 == 0, rows, num_head_ids + rows)
        inputs["positions"][:] = 0
        inputs["slot_mapping"][:] = rows * block_size
        inputs["query_start_loc"][:] = torch.arange(size + 1, dtype=torch.int32)
        inputs["seq_lens"][:] = 1
        inputs["decode_order"][:] = rows
        inputs["sample_rows"][:] = size - 1 - rows  # reversed: each row samples for another
        graphs.load_block_table(rows[None, :, None].int(), version=size)  # [G = 1, S, C = 1]
        hidden = graphs.replay(size)
        assert (
            graphs.input_ids[:size].tolist()
            == torch.where(rows % 2 == 0, rows + 5, rows + 3).tolist()
        )
        logits, argmax = graphs.logits(size), graphs.argmax(size)
        if size > MAX_LOGITS_ROWS:
            assert logits is None and argmax is None
            assert (last_sampled[size:] == -1).all()
            continue
        assert (
            logits.shape == (size, VOCAB)
            and logits.dtype == torch.float32
            and torch.isfinite(logits).all()
        )
        torch.testing.assert_close(logits, runner.model.compute_logits(hidden), rtol=0, atol=0)
        assert argmax.dtype == torch.int64 and argmax.equal(logits.argmax(dim=-1))
        assert last_sampled[:size].equal(argmax.flip(0)) and (last_sampled[size:] == -1).all()


def _run_and_spy(runner, specs, async_mode: bool) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Runs the requests; counts steps that took a graph's ids (count_sampled) and that ran the
    sampler."""
    calls = {"count_sampled": 0, "sample": 0}
    for name in calls:
        method = getattr(runner.sampler, name)

        def spy(*args, _method=method, _name=name):
            calls[_name] += 1
            return _method(*args)

        setattr(runner.sampler, name, spy)
    sched = MiniScheduler(block_size=8, max_num_seqs=runner.max_num_reqs, token_budget=16)
    for i, (num_prompt, max_tokens, params) in enumerate(specs):
        sched.add(Req(f"r{i}", _prompt(num_prompt, 20 + i), max_tokens, params))
    return run_requests(runner, sched, async_mode), calls


GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_k=20, seed=11)


@pytest.mark.parametrize("async_mode", [False, True])
def test_greedy_batches_take_the_graph_ids(tiny, async_mode):
    """Every decode step of a greedy batch takes the graph's argmax (no sampler launch); the
    tokens equal transformers'."""
    folder, hf_model = tiny
    runner, graphs = _graphed_runner(folder, max_num_seqs=4)
    num_calls = {"replay": 0, "load_block_table": 0}
    for name in num_calls:
        method = getattr(graphs, name)

        def counted(*args, _method=method, _name=name):
            num_calls[_name] += 1
            return _method(*args)

        setattr(graphs, name, counted)
    specs = [(7, 12, GREEDY), (3, 6, GREEDY), (12, 4, GREEDY)]
    done, calls = _run_and_spy(runner, specs, async_mode)
    for i, (num_prompt, max_tokens, _) in enumerate(specs):
        assert done[f"r{i}"] == hf_greedy(hf_model, max_tokens, _prompt(num_prompt, 20 + i)), i
    assert calls["count_sampled"] >= 8 and calls["sample"] <= 3, calls  # the prefill steps
    # steady steps replay the block table loaded before: a load per change of rows or blocks
    assert num_calls["replay"] >= 8 and num_calls["load_block_table"] <= num_calls["replay"] - 3, (
        num_calls
    )


@pytest.mark.parametrize(
    "specs, takes_graph_ids",
    [
        ([(7, 8, GREEDY), (3, 8, SEEDED)], False),  # a greedy row beside a random one
        ([(7, 8, SamplingParams(temperature=0.0, logprobs=2)), (5, 6, GREEDY)], False),
        ([(6, 8, SamplingParams(temperature=0.0, repetition_penalty=1.3)), (4, 8, GREEDY)], False),
        # min_tokens bans EOS and stop ids only while below: then the batch is greedy
        (
            [
                (4, 8, SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[1, 2])),
                (6, 8, GREEDY),
            ],
            True,
        ),
    ],
    ids=["mixed", "logprobs", "penalties", "min_tokens"],
)
def test_other_batches_are_sampled_as_without_graphs(tiny, specs, takes_graph_ids):
    """A batch that needs more than the argmax runs the sampler on the graph's logits: its tokens
    equal the same runner's without graphs."""
    folder, _ = tiny
    graphed, _ = _graphed_runner(folder, max_num_seqs=4)
    eager = make_runner(
        make_config(folder, max_num_seqs=4, max_num_batched_tokens=16, attention_backend="triton")
    )
    done, calls = _run_and_spy(graphed, specs, async_mode=True)
    expected, _ = _run_and_spy(eager, specs, async_mode=True)
    assert done == expected
    assert calls["sample"] >= 3, calls
    assert (calls["count_sampled"] > 0) == takes_graph_ids, calls


@pytest.mark.parametrize("first_block", [0, 5])
def test_replay_after_an_eager_decode_step_sees_padding(tiny, first_block):
    """Sync mode: r2 (prompt_embeds, a one-token prompt) joins two decodes: a decode-shaped step that
    runs eagerly (embeds); the next step reuses its sequence sections and replays the graph of 4 for 3
    sequences, so the eager step must have padded them too. Unpadded, the stale input_src, sample_rows,
    decode_order and query_start_loc showed at the replay (first_block 5: input_src out of the ids
    table, an IndexError here, a device-side assert on CUDA)."""
    folder, hf_model = tiny
    runner, graphs = _graphed_runner(folder, max_num_seqs=4)
    replay, num_head_ids = graphs.replay, runner._inputs.num_head_ids
    checked = []

    def checked_replay(size, slot=None):
        if slot is not None:  # what the graph does first: then its inputs are in place
            graphs.stage_in(size, slot)
        num_seqs = len(runner.input_batch._previous.req_ids)
        inputs = runner._inputs.sections(size, size).tensors
        pad = range(num_seqs, size)
        assert inputs["input_src"][num_seqs:].tolist() == [num_head_ids + i for i in pad]
        assert inputs["sample_rows"][num_seqs:].tolist() == [runner.max_num_reqs + i for i in pad]
        assert inputs["decode_order"][num_seqs:].tolist() == list(pad)
        assert inputs["query_start_loc"][num_seqs + 1 :].tolist() == [num_seqs] * len(pad)
        checked.append((num_seqs, size))
        return replay(size, slot)

    graphs.replay = checked_replay
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=16)
    sched._next_block = first_block  # blocks below it are taken: a stale index lands out of range
    sched.add(Req("r0", _prompt(10, 1), 6))
    sched.add(Req("r1", _prompt(5, 2), 6))
    embeds = torch.randn(1, 64, generator=torch.Generator().manual_seed(3))
    for step in range(12):
        if step == 2:
            sched.add(Req("r2", [0], 4, prompt_embeds=embeds))
        if not sched.has_work():
            break
        sched.update(runner.execute_model(sched.schedule()).get_output())
    assert (3, 4) in checked
    assert sched.done["r2"] == hf_greedy(hf_model, 4, prompt_embeds=embeds)
