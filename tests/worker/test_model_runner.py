"""The runner end to end on a tiny random Llama: greedy tokens equal transformers' generate in
sync and async mode, with chunked prefill, row reuse, preemption and prompt embeddings."""

from __future__ import annotations

import pytest
import torch
from worker_helpers import (
    HEAD_DIM,
    HIDDEN,
    NUM_KV_HEADS,
    MiniScheduler,
    Req,
    hf_greedy,
    make_config,
    make_runner,
    random_prompt,
    run_requests,
)

from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.model_runner import ModelRunner
from pagedlm.worker.profile_run import profile_run
from pagedlm.worker.sizes import capture_sizes


def _spy_layouts(runner) -> list:
    """Records each step's BatchLayout."""
    layouts = []
    prepare = runner.input_batch.prepare

    def spy(sched, buf):
        layouts.append(prepare(sched, buf))
        return layouts[-1]

    runner.input_batch.prepare = spy
    return layouts


@pytest.mark.parametrize("async_mode", [False, True])
def test_greedy_equals_transformers(tiny, async_mode):
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=4, max_num_batched_tokens=12))
    layouts = _spy_layouts(runner)
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=12)
    specs = {"a": (5, 6), "b": (19, 4), "c": (9, 7)}  # prompt length, max_tokens
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        sched.add(Req(req_id, random_prompt(num_prompt, i), max_tokens))
    done = run_requests(runner, sched, async_mode)
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        assert done[req_id] == hf_greedy(hf_model, max_tokens, random_prompt(num_prompt, i)), req_id
    assert (sum(layout.num_placeholders for layout in layouts) > 0) == async_mode


def test_rows_are_reused_after_finish(tiny):
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=2, max_num_batched_tokens=16))
    sched = MiniScheduler(block_size=8, max_num_seqs=2, token_budget=16)
    specs = {"long": (14, 3), "short": (3, 2), "next": (6, 4), "last": (2, 3)}
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        sched.add(Req(req_id, random_prompt(num_prompt, 10 + i), max_tokens))
    done = run_requests(runner, sched, async_mode=True)
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        assert done[req_id] == hf_greedy(hf_model, max_tokens, random_prompt(num_prompt, 10 + i)), (
            req_id
        )
    # "long" (14 prompt tokens) finishes first; "next" takes its row over its stale tokens
    assert sched.rows_seen == {"long": 0, "short": 1, "next": 0, "last": 1}


def test_preempted_request_resumes_with_its_outputs(tiny):
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=2, max_num_batched_tokens=16))
    sched = MiniScheduler(block_size=8, max_num_seqs=2, token_budget=16)
    sched.add(Req("p", random_prompt(10, 20), 8))
    sched.add(Req("q", random_prompt(7, 21), 6))
    done = run_requests(runner, sched, async_mode=False, preempt_at={3: "p"})
    assert done["p"] == hf_greedy(hf_model, 8, random_prompt(10, 20))
    assert done["q"] == hf_greedy(hf_model, 6, random_prompt(7, 21))


@pytest.mark.parametrize("async_mode", [False, True])
def test_prompt_embeds(tiny, async_mode):
    """A prompt given as embeddings (chunked over steps) next to a prompt given as ids."""
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=4, max_num_batched_tokens=16))
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=6)
    embeds = torch.randn(11, HIDDEN, generator=torch.Generator().manual_seed(30)) * 0.3
    sched.add(Req("ids", random_prompt(5, 31), 5))
    sched.add(Req("emb", [0] * 11, 5, prompt_embeds=embeds))
    done = run_requests(runner, sched, async_mode)
    assert done["ids"] == hf_greedy(hf_model, 5, random_prompt(5, 31))
    assert done["emb"] == hf_greedy(hf_model, 5, prompt_embeds=embeds)
    assert done["emb"] != hf_greedy(hf_model, 5, [0] * 11)  # the embeddings were used


def test_random_sampling_same_in_sync_and_async(tiny):
    folder, _ = tiny
    results = []
    for async_mode in (False, True):
        runner = make_runner(make_config(folder, max_num_seqs=4, max_num_batched_tokens=12))
        sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=12)
        for i, seed in enumerate((None, 7, 8)):
            params = SamplingParams(
                temperature=1.5, top_k=20, top_p=0.9, seed=seed, frequency_penalty=0.5 * i
            )
            sched.add(Req(f"r{i}", random_prompt(6 + 5 * i, 60 + i), 6, params))
        results.append(run_requests(runner, sched, async_mode))
    assert results[0] == results[1]
    assert len({tuple(tokens) for tokens in results[0].values()}) == 3


def test_logprobs_per_request(tiny):
    folder, _ = tiny
    runner = make_runner(make_config(folder))
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=16)
    sched.add(Req("lp", random_prompt(4, 40), 1, SamplingParams(temperature=0.0, logprobs=3)))
    sched.add(Req("no", random_prompt(6, 41), 1))
    output = runner.execute_model(sched.schedule()).get_output()
    assert output.req_ids == ["lp", "no"]
    with_lp, without = output.logprobs
    assert without == []
    (entry,) = with_lp
    assert len(entry.token_ids) == len(entry.logprobs) == 4
    assert entry.token_ids[0] == output.sampled_token_ids[0][0] and entry.sampled_rank == 1
    assert entry.logprobs[0] == pytest.approx(max(entry.logprobs)) and entry.logprobs[0] < 0


def test_profile_run_leaves_no_trace(tiny):
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=3, max_num_batched_tokens=16))
    kv_caches = runner.kv_caches
    profile_bytes = profile_run(runner)
    assert runner.kv_caches is kv_caches and runner.input_batch.num_kv_blocks == 64
    # 16 tokens over 3 sequences (6, 5, 5): one block of 8 slots each, K and V, fp32
    assert profile_bytes == 3 * 8 * 2 * NUM_KV_HEADS * HEAD_DIM * 4
    assert runner.input_batch.num_reqs == 0  # and the sampler's rows are free: row 0 is reused
    sched = MiniScheduler(block_size=8, max_num_seqs=3, token_budget=16)
    sched.add(Req("after", random_prompt(7, 50), 3))
    assert run_requests(runner, sched, async_mode=True)["after"] == hf_greedy(
        hf_model, 3, random_prompt(7, 50)
    )


class _Boom(RuntimeError):
    pass


def test_a_failed_profile_step_leaves_the_runner_as_it_was(tiny):
    """The profile's dummy step raises inside the model: the runner's own KV cache, its block count
    and its graphs come back, no dummy request stays, and the next request runs (before, profile_run
    swapped the runner's fields with no try/finally and left its own KV cache in place)."""
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=3, max_num_batched_tokens=16))
    kv_caches, graphs = runner.kv_caches, object()
    runner.graphs = (
        graphs  # stands in for captured graphs: the eager profile step must not see them
    )
    model = runner.model

    class Failing:
        def __call__(self, *args, **kwargs):
            assert (
                runner.graphs is None and runner.kv_caches is not kv_caches
            )  # eager, its own cache
            raise _Boom("the profile step failed")

        def __getattr__(self, name):
            return getattr(model, name)

    runner.model = Failing()
    with pytest.raises(_Boom):
        profile_run(runner)
    assert (
        runner.kv_caches is kv_caches
        and runner.input_batch.num_kv_blocks == 64
        and runner.graphs is graphs
    )
    assert runner.input_batch.num_reqs == 0
    runner.model, runner.graphs = model, None
    sched = MiniScheduler(block_size=8, max_num_seqs=3, token_budget=16)
    sched.add(Req("after", random_prompt(7, 51), 3))
    assert run_requests(runner, sched, async_mode=True)["after"] == hf_greedy(
        hf_model, 3, random_prompt(7, 51)
    )


def _spy_lm_head_rows(runner) -> list[int]:
    """Records the row count of each LM head call."""
    rows: list[int] = []
    compute_logits = runner.model.compute_logits

    def spy(hidden):
        rows.append(hidden.shape[0])
        return compute_logits(hidden)

    runner.model.compute_logits = spy
    return rows


def test_lm_head_runs_only_at_warmed_row_counts(tiny):
    """Mixed steps and shrinking decode batches sample varied row counts; the LM head pads them to
    the row counts lm_head.warm_up runs (cuBLAS meets no new shape while serving), and the padding
    changes no token."""
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=24, max_num_batched_tokens=40))
    rows = _spy_lm_head_rows(runner)
    runner.lm_head.warm_up(runner.model.compute_logits)
    warmed = set(rows)
    assert warmed == {
        runner.lm_head.bucket(n) for n in range(1, 41)
    }  # up to 40: a prompt-logprob chunk
    assert set(capture_sizes(24, 40)) <= warmed  # a replay's LM head runs at its graph size
    rows.clear()
    sched = MiniScheduler(block_size=8, max_num_seqs=24, token_budget=40)
    specs = {
        f"r{i}": (3 + (7 * i) % 13, 2 + (5 * i) % 9) for i in range(19)
    }  # prompt length, max_tokens
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        sched.add(Req(req_id, random_prompt(num_prompt, 40 + i), max_tokens))
    layouts = _spy_layouts(runner)
    done = run_requests(runner, sched, async_mode=True)
    for i, (req_id, (num_prompt, max_tokens)) in enumerate(specs.items()):
        assert done[req_id] == hf_greedy(hf_model, max_tokens, random_prompt(num_prompt, 40 + i)), (
            req_id
        )
    assert set(rows) <= warmed
    sampled = [layout.num_samples for layout in layouts if layout.num_samples]
    assert any(
        num_rows > num_samples for num_rows, num_samples in zip(rows, sampled)
    )  # some padded


@pytest.mark.parametrize(
    "max_num_seqs, max_num_batched_tokens, num_rows",
    [
        (64, 20, 20),  # the token budget bounds the sampling rows
        (1100, 2048, 1280),  # above the largest graph size (1,024): a multiple of 256
        (1024, 700, 700),  # the token budget caps the graph sizes, the cap one of them
        (4, 600, 512),  # a chunk of prompt-logprob rows (at most 512) outgrows the sampling rows
    ],
)
def test_lm_head_buffer_holds_the_largest_step(
    tiny, max_num_seqs, max_num_batched_tokens, num_rows
):
    """The padded buffer holds lm_head.bucket of the most rows the LM head takes at once (a step's
    sampling rows, one a sequence; or a chunk of prompt-logprob rows), and the warm-up runs the LM
    head up to it."""
    runner = ModelRunner(
        make_config(
            tiny[0], max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        )
    )
    runner.load_model()
    rows = _spy_lm_head_rows(runner)
    runner.lm_head.warm_up(runner.model.compute_logits)
    assert runner.lm_head.hidden.shape[0] == num_rows == max(rows)
    max_rows = max(min(max_num_seqs, max_num_batched_tokens), min(512, max_num_batched_tokens))
    assert runner.lm_head.bucket(max_rows) == num_rows


def test_prompt_logprobs_take_warmed_row_counts(tiny):
    """Prompt logprobs run the LM head over a step's prompt rows, padded like the sampling rows
    (their values against transformers: tests/engine/test_engine_logprobs.py)."""
    folder, _ = tiny
    runner = make_runner(make_config(folder, max_num_seqs=4, max_num_batched_tokens=16))
    rows = _spy_lm_head_rows(runner)
    runner.lm_head.warm_up(runner.model.compute_logits)
    warmed = set(rows)
    rows.clear()
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=16)
    sched.add(
        Req("lp", random_prompt(7, 60), 1, SamplingParams(temperature=0.0, prompt_logprobs=2))
    )
    output = runner.execute_model(sched.schedule()).get_output()
    (entries,) = output.prompt_logprobs.values()
    assert set(rows) <= warmed and 6 not in rows  # 6 prompt rows and 1 sampling row, padded
    assert (
        len(entries) == 7 and entries[0] is None and all(len(e.token_ids) == 3 for e in entries[1:])
    )
