"""The start-up warm-up steps leave the runner as they found it (CPU), and on CUDA they, with the
profile step and the graph capture, cover what serving launches: no Triton compile while serving."""

from __future__ import annotations

import pytest
from worker_helpers import (
    MiniScheduler,
    Req,
    hf_greedy,
    make_config,
    make_runner,
    random_prompt,
    run_requests,
)

from pagedlm.ops import gate_up_silu
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.input_batch import cdiv
from pagedlm.worker.kernel_warmup import WARM_UP_REQUESTS, warm_up_kernels


def test_warm_up_leaves_no_trace(tiny):
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=3, max_num_batched_tokens=32))
    steps_before = runner._num_steps
    warm_up_kernels(runner)
    max_prompt = runner.config.model.max_model_len - 1
    # per request: its prompt in chunks of the 32-token budget, then a decode step (the mixed one's
    # with a new prompt)
    assert any(request.mixed_with for request in WARM_UP_REQUESTS)
    assert runner._num_steps == steps_before + sum(
        cdiv(min(request.num_prompt_tokens, max_prompt), 32) + 1 for request in WARM_UP_REQUESTS
    )
    assert runner.input_batch.num_reqs == 0 and runner.input_batch.req_id_to_row == {}
    sched = MiniScheduler(block_size=8, max_num_seqs=3, token_budget=32)
    sched.add(Req("after", random_prompt(7, 60), 4))
    assert run_requests(runner, sched, async_mode=True)["after"] == hf_greedy(
        hf_model, 4, random_prompt(7, 60)
    )


@pytest.mark.parametrize("budget", [gate_up_silu.MIN_ROWS, gate_up_silu.MIN_ROWS - 1])
def test_warm_up_launches_the_fused_gemm_where_a_step_can(tiny, monkeypatch, budget):
    """With a step budget of MIN_ROWS tokens the warm-up runs the fused gate_up GEMM once (made to
    apply on CPU from MIN_ROWS rows, as on the GPU), on MIN_ROWS rows of a layer's own gate_up weight
    (the warm-up's prompts are shorter: max_model_len 64); below that budget, never."""
    folder, _ = tiny
    runner = make_runner(make_config(folder, max_num_seqs=3, max_num_batched_tokens=budget))
    calls = []
    monkeypatch.setattr(
        gate_up_silu, "takes_fused", lambda x, weight, bias: x.shape[0] >= gate_up_silu.MIN_ROWS
    )
    monkeypatch.setattr(gate_up_silu, "gate_up_silu", lambda x, weight: calls.append((x, weight)))
    warm_up_kernels(runner)
    if budget < gate_up_silu.MIN_ROWS:
        assert calls == []
        return
    ((x, weight),) = calls
    assert x.shape == (gate_up_silu.MIN_ROWS, runner.model.config.hidden_size)
    assert weight is runner.model.model.layers[0].mlp.gate_up_proj.weight


def _long_context_copy(folder, tmp_path, positions: int = 512):
    """The tiny model's folder with max_position_embeddings `positions`."""
    import json
    import shutil

    long_folder = tmp_path / "long"
    shutil.copytree(folder, long_folder)
    config = json.loads((long_folder / "config.json").read_text())
    (long_folder / "config.json").write_text(
        json.dumps(dict(config, max_position_embeddings=positions))
    )
    return long_folder


@pytest.mark.gpu
@pytest.mark.parametrize("max_model_len", [None, 512])
def test_no_compile_while_serving(tiny, tmp_path, max_model_len):
    """Prompts of 1..33 tokens chunked by a 12-token budget, greedy, temperature 0.7 and 1.0, top-p:
    every kernel specialisation these steps launch was compiled at start-up. With max_model_len 512
    every captured graph takes the split decode, so only the warm-up's mixed step launches the varlen
    kernel's decode part before serving does."""
    from pagedlm.ops.jit_watch import compile_watch

    folder, _ = tiny
    extra = {}
    if max_model_len:
        folder, extra = (
            _long_context_copy(folder, tmp_path),
            dict(max_model_len=max_model_len, num_blocks=70),
        )
    runner = make_runner(
        make_config(
            folder,
            max_num_seqs=4,
            max_num_batched_tokens=12,
            device="cuda",
            attention_backend="auto",
            **extra,
        )
    )
    first = len(compile_watch().events)
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=12)
    temperatures = (0.0, 0.7, 1.0)
    for i, num_prompt in enumerate((1, 2, 3, 7, 19, 33)):
        params = SamplingParams(
            temperature=temperatures[i % 3], seed=i, top_p=0.9 if i == 4 else 1.0
        )
        sched.add(Req(f"r{i}", random_prompt(num_prompt, 70 + i), 6, params))
    done = run_requests(runner, sched, async_mode=True)
    assert all(len(tokens) == 6 for tokens in done.values())
    late = [f"{e.kernel}{e.signature}" for e in compile_watch().since(first)]
    assert not late, "compiled while serving:\n" + "\n".join(late)


@pytest.mark.gpu
@pytest.mark.parametrize("max_model_len, prompt_lens", [(4096, [2148]), (1024, [700, 700, 700])])
def test_fused_gemm_compiles_at_start_up(tiny, tmp_path, monkeypatch, max_model_len, prompt_lens):
    """bf16 with num_gpu_blocks_override (no profile step) and FULL_DECODE_ONLY (no piecewise capture)
    and a budget of MIN_ROWS tokens: a step that takes the fused gate_up GEMM while serving (one long
    prompt's chunk, or several prompts where no prompt is that long) compiles nothing then: the
    warm-up launched it at start-up."""
    from pagedlm import LLM
    from pagedlm.ops.jit_watch import compile_watch

    rows = gate_up_silu.MIN_ROWS
    folder = _long_context_copy(tiny[0], tmp_path, positions=max_model_len)
    llm = LLM(
        str(folder),
        dtype="bfloat16",
        device="cuda",
        attention_backend="triton",
        skip_tokenizer_init=True,
        cudagraph_mode="FULL_DECODE_ONLY",
        num_gpu_blocks_override=320,
        max_num_batched_tokens=rows,
        max_model_len=max_model_len,
        max_num_seqs=4,
    )
    first = len(compile_watch().events)
    fused = []
    real = gate_up_silu.gate_up_silu
    monkeypatch.setattr(
        gate_up_silu, "gate_up_silu", lambda x, w: fused.append(x.shape[0]) or real(x, w)
    )
    prompts = [{"prompt_token_ids": random_prompt(n, 5 + i)} for i, n in enumerate(prompt_lens)]
    out = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False
    )
    assert [len(o.outputs[0].token_ids) for o in out] == [2] * len(prompts)
    assert rows in fused  # a full step of prompt tokens took the fused GEMM while serving
    late = [f"{e.kernel}{e.signature}" for e in compile_watch().since(first)]
    assert not late, "compiled while serving:\n" + "\n".join(late)


def test_eager_warm_up_launches_the_split_decode_kernel(tiny, tmp_path, monkeypatch):
    """Without CUDA graphs no capture launches the split-decode kernel (a decode over a short context
    never takes it): the warm-up's last request decodes over more than MIN_KEYS_PER_SPLIT keys, and
    that step must take it (Triton under the interpreter on CPU)."""
    from pagedlm.attention import triton_backend

    folder = _long_context_copy(tiny[0], tmp_path)
    runner = make_runner(
        make_config(
            folder,
            max_num_batched_tokens=128,
            max_model_len=512,
            num_blocks=70,
            attention_backend="triton",
        )
    )
    split_counts = []
    split_decode = triton_backend.split_decode_attention

    def spy(q, kv_cache, meta, scale, sliding_window, num_splits, *args, **kwargs):
        split_counts.append(num_splits)
        return split_decode(q, kv_cache, meta, scale, sliding_window, num_splits, *args, **kwargs)

    monkeypatch.setattr(triton_backend, "split_decode_attention", spy)
    monkeypatch.setattr(triton_backend, "SPLIT_LARGE_BATCHES", True)
    warm_up_kernels(runner)
    assert split_counts and min(split_counts) >= 2, split_counts


def test_warm_up_launches_the_large_batch_split_decode(tiny, monkeypatch):
    """The split decode of a large batch (only its longest sequences split) is a compile of its own
    that no warm-up request reaches eagerly: a direct call launches it, once for the tiny model's
    layers (one kind), on the runner's KV cache; not where PAGEDLM_SPLIT_LARGE_DECODE=0 keeps large
    batches on the varlen kernel (Triton under the interpreter on CPU)."""
    from pagedlm.attention import triton_backend
    from pagedlm.ops.warm_up import WarmUpTarget

    runner = make_runner(
        make_config(tiny[0], max_num_batched_tokens=32, attention_backend="triton")
    )
    calls = []
    split_decode = triton_backend.split_decode_attention

    def spy(q, kv_cache, meta, scale, sliding_window, num_splits, *args, **kwargs):
        calls.append((kv_cache.data_ptr(), meta.num_seqs, kwargs.get("split_seqs")))
        return split_decode(q, kv_cache, meta, scale, sliding_window, num_splits, *args, **kwargs)

    monkeypatch.setattr(triton_backend, "split_decode_attention", spy)
    monkeypatch.setattr(triton_backend, "SPLIT_LARGE_BATCHES", True)
    warm_up_kernels(runner)
    large = [c for c in calls if c[2] is not None and c[2] < c[1]]
    assert large == [(runner.kv_caches[0].data_ptr(), 2, 1)], calls
    calls.clear()
    monkeypatch.setattr(triton_backend, "SPLIT_LARGE_BATCHES", False)
    target = WarmUpTarget(runner.model, runner.device, 1, 32, kv_caches=runner.kv_caches)
    triton_backend.warm_up_large_batch_split(target)
    assert calls == []


def test_warm_up_launches_a_mixed_steps_decode_part(tiny, monkeypatch):
    """The warm-up's mixed step attends to its leading decode with the varlen kernel's decode launch,
    then to the prompt with query tiles (Triton under the interpreter on CPU)."""
    from pagedlm.attention import triton_paged

    runner = make_runner(
        make_config(tiny[0], max_num_batched_tokens=32, attention_backend="triton")
    )
    launches = []
    launch = triton_paged._launch

    def spy(q, kv_cache, meta, scale, sliding_window, out, num_seqs, order=None, first_seq=None):
        launches.append((meta.num_seqs, num_seqs, first_seq))
        return launch(q, kv_cache, meta, scale, sliding_window, out, num_seqs, order, first_seq)

    monkeypatch.setattr(triton_paged, "_launch", spy)
    warm_up_kernels(runner)
    assert (2, 1, None) in launches and (2, 2, 1) in launches, sorted(set(launches))


def test_warm_up_launches_the_threshold_kernel_with_and_without_a_floor(tiny, monkeypatch):
    """Both of the threshold kernel's specialisations (a min-p floor or none) over a row of the
    vocabulary's size: a batch where every row has a top-k takes torch.topk's path, so no warm-up
    request could launch the floored one."""
    from pagedlm.sample import sampler, triton_threshold

    folder, _ = tiny
    runner = make_runner(make_config(folder, max_num_seqs=3, max_num_batched_tokens=32))
    calls = []
    threshold = triton_threshold.triton_top_k_top_p_threshold

    def recorded(probs, floor, params):
        calls.append((tuple(probs.shape), floor is None))
        return threshold(probs, floor, params)

    monkeypatch.setattr(sampler, "triton_top_k_top_p_threshold", recorded)
    warm_up_kernels(runner)
    vocab = runner.config.model.vocab_size
    assert calls == [((1, vocab), True), ((1, vocab), False)]
