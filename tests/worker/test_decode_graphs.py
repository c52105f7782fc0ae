"""The pure-decode CUDA-graph path without CUDA: capture sizes, when graphs are on, and what a graph
replays (the batch padded in the static buffers, fixed host ints, the fixed-width block table),
run eagerly through the Triton kernels in the interpreter; greedy tokens must equal transformers'.
Capture and replay themselves need CUDA: tests/gpu/test_cuda_graphs.py."""
from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch
from worker_helpers import (VOCAB, MiniScheduler, Req, hf_greedy, make_config, make_runner,
                            run_requests, save_tiny_llama)

from pagedlm.worker.cuda_graphs import MAX_LOGITS_ROWS, DecodeGraphs, capture_sizes, graphs_enabled


class EagerGraphs(DecodeGraphs):
    """capture() without CUDA: each size's "graph" runs the function a CUDA graph would hold."""

    def capture(self, stream: None = None) -> None:
        for size in self.sizes:
            self._graphs[size] = SimpleNamespace(replay=functools.partial(self._run, size))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    return path, save_tiny_llama(path)


def _prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def test_capture_sizes():
    sizes = capture_sizes(max_num_seqs=1024, max_num_tokens=16384)
    assert len(sizes) == 51 and sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-1] == 512
    assert sizes[sizes.index(256) + 1] == 272 and sizes == sorted(set(sizes))
    assert capture_sizes(6, 8192) == [1, 2, 4, 6]  # capped at max_num_seqs, the cap included
    assert capture_sizes(256, 100) == [1, 2, 4, *range(8, 97, 8), 100]  # and at the token budget
    assert capture_sizes(1, 1) == [1]


def test_graphs_only_on_cuda_with_triton_unless_eager(tiny):
    config = make_config(tiny[0])  # CPU
    cuda = dataclasses.replace(config, device=torch.device("cuda"), enforce_eager=False,
                               attention_backend="auto")
    assert not graphs_enabled(config)
    assert graphs_enabled(cuda)
    assert graphs_enabled(dataclasses.replace(cuda, attention_backend="triton"))
    assert not graphs_enabled(dataclasses.replace(cuda, enforce_eager=True))
    assert not graphs_enabled(dataclasses.replace(cuda, attention_backend="torch"))


# max_model_len 64: the varlen kernel; 512: split decode (the captured max_seq_len is
# max_model_len, so 2 splits, the second empty for these short sequences)
@pytest.mark.parametrize("max_model_len, async_mode", [(64, False), (512, True)])
def test_padded_decode_greedy_equals_transformers(tiny, max_model_len, async_mode):
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=8, max_num_batched_tokens=16,
                                     max_model_len=max_model_len, attention_backend="triton"))
    graphs = EagerGraphs(runner.config, runner.model, runner.kv_caches, runner._inputs,
                         runner.input_batch.max_num_blocks_per_req)
    graphs.capture()
    graphs._output.fill_(float("nan"))
    assert graphs.sizes == [1, 2, 4, 8] and graphs.padded_size(5) == 8
    assert graphs.padded_size(9) is None
    replays: list[tuple[int, int]] = []  # (sequences in the batch, replayed size)
    replay = graphs.replay

    def counted_replay(size: int, block_table: torch.Tensor) -> torch.Tensor:
        replays.append((block_table.shape[0], size))
        seq_lens = runner._inputs.seq_lens[:size]  # padding rows: 0
        expected = torch.argsort(-seq_lens.long(), stable=True)  # longest first, padding last
        assert runner._inputs.decode_order[:size].tolist() == expected.tolist()
        return replay(size, block_table)

    graphs.replay = counted_replay
    runner.graphs = graphs
    # r0 lives longest: its first block (slot 0) is read by every step that pads
    specs = [(11, 9), (3, 4), (6, 6), (17, 5), (1, 8), (9, 7), (5, 3)]  # (prompt len, max tokens)
    sched = MiniScheduler(block_size=8, max_num_seqs=8, token_budget=16)
    for i, (num_prompt, max_tokens) in enumerate(specs):
        sched.add(Req(f"r{i}", _prompt(num_prompt, i), max_tokens))
    done = run_requests(runner, sched, async_mode)
    for i, (num_prompt, max_tokens) in enumerate(specs):
        assert done[f"r{i}"] == hf_greedy(hf_model, max_tokens, _prompt(num_prompt, i)), i
    assert len(replays) >= 5 and any(num_seqs < size for num_seqs, size in replays)
    assert all(size == graphs.padded_size(num_seqs) for num_seqs, size in replays)


def test_small_graphs_compute_the_logits(tiny):
    """Graphs of up to MAX_LOGITS_ROWS rows also hold the LM head (the runner samples from their
    logits); larger ones leave it to the runner."""
    runner = make_runner(make_config(tiny[0], max_num_seqs=16, max_num_batched_tokens=16, attention_backend="triton"))
    graphs = EagerGraphs(runner.config, runner.model, runner.kv_caches, runner._inputs,
                         runner.input_batch.max_num_blocks_per_req)
    graphs.capture()
    assert graphs.sizes == [1, 2, 4, 8, 16] and MAX_LOGITS_ROWS == 8
    inputs, block_size = runner._inputs, runner.config.cache.block_size
    for size in graphs.sizes:  # size one-token sequences, sequence i in block i (no padding row)
        rows = torch.arange(size, dtype=torch.int32)
        inputs.input_ids[:size] = rows + 3
        inputs.positions[:size] = 0
        inputs.slot_mapping[:size] = rows * block_size
        inputs.query_start_loc[:size + 1] = torch.arange(size + 1, dtype=torch.int32)
        inputs.seq_lens[:size] = 1
        inputs.decode_order[:size] = rows
        hidden = graphs.replay(size, rows[:, None])
        logits = graphs.logits(size)
        if size > MAX_LOGITS_ROWS:
            assert logits is None
            continue
        assert logits.shape == (size, VOCAB) and logits.dtype == torch.float32 and torch.isfinite(logits).all()
        torch.testing.assert_close(logits, runner.model.compute_logits(hidden), rtol=0, atol=0)
