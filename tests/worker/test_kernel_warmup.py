"""The start-up warm-up steps leave the runner as they found it (CPU), and on CUDA they, with the
profile step and the graph capture, cover what serving launches: no Triton compile while serving."""
from __future__ import annotations

import pytest
from worker_helpers import MiniScheduler, Req, hf_greedy, make_config, make_runner, random_prompt, run_requests

from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.input_batch import cdiv
from pagedlm.ops import gate_up_silu
from pagedlm.worker.kernel_warmup import WARM_UP_REQUESTS, warm_up_kernels, warm_up_requests


def test_warm_up_leaves_no_trace(tiny):
    folder, hf_model = tiny
    runner = make_runner(make_config(folder, max_num_seqs=3, max_num_batched_tokens=32))
    steps_before = runner._num_steps
    warm_up_kernels(runner)
    max_prompt = runner.config.model.max_model_len - 1
    # per request: its prompt in chunks of the 32-token budget, then a decode step; then the mixed
    # step's two (a prefill, then its decode with a new prompt)
    requests = warm_up_requests(32, max_prompt + 1)
    assert runner._num_steps == steps_before + sum(cdiv(min(n, max_prompt), 32) + 1 for n, _ in requests) + 2
    assert runner.input_batch.num_reqs == 0 and runner.input_batch.req_id_to_row == {}
    sched = MiniScheduler(block_size=8, max_num_seqs=3, token_budget=32)
    sched.add(Req("after", random_prompt(7, 60), 4))
    assert run_requests(runner, sched, async_mode=True)["after"] == hf_greedy(hf_model, 4, random_prompt(7, 60))


def test_fused_gemm_prompt_only_where_a_step_holds_it():
    """The fused gate_up GEMM's prompt joins the warm-up where one step holds MIN_ROWS prompt tokens."""
    rows = gate_up_silu.MIN_ROWS
    assert warm_up_requests(32, 4096) == WARM_UP_REQUESTS
    assert warm_up_requests(rows, rows) == WARM_UP_REQUESTS  # max_model_len - 1 tokens at most
    assert warm_up_requests(rows, rows + 1) == WARM_UP_REQUESTS + ((rows, 0.0),)
    assert warm_up_requests(16384, 8192)[-1] == (rows, 0.0)


def _long_context_copy(folder, tmp_path, positions: int = 512):
    """The tiny model's folder with max_position_embeddings `positions`."""
    import json
    import shutil

    long_folder = tmp_path / "long"
    shutil.copytree(folder, long_folder)
    config = json.loads((long_folder / "config.json").read_text())
    (long_folder / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=positions)))
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
        folder, extra = _long_context_copy(folder, tmp_path), dict(max_model_len=max_model_len, num_blocks=70)
    runner = make_runner(make_config(folder, max_num_seqs=4, max_num_batched_tokens=12, device="cuda",
                                     attention_backend="auto", **extra))
    first = len(compile_watch().events)
    sched = MiniScheduler(block_size=8, max_num_seqs=4, token_budget=12)
    temperatures = (0.0, 0.7, 1.0)
    for i, num_prompt in enumerate((1, 2, 3, 7, 19, 33)):
        params = SamplingParams(temperature=temperatures[i % 3], seed=i, top_p=0.9 if i == 4 else 1.0)
        sched.add(Req(f"r{i}", random_prompt(num_prompt, 70 + i), 6, params))
    done = run_requests(runner, sched, async_mode=True)
    assert all(len(tokens) == 6 for tokens in done.values())
    late = [f"{e.kernel}{e.signature}" for e in compile_watch().since(first)]
    assert not late, "compiled while serving:\n" + "\n".join(late)


@pytest.mark.gpu
def test_fused_gemm_compiles_at_start_up(tiny, tmp_path, monkeypatch):
    """bf16 with num_gpu_blocks_override (no profile step) and FULL_DECODE_ONLY (no piecewise capture)
    and a budget of MIN_ROWS tokens: a prompt that takes the fused gate_up GEMM while serving compiles
    nothing then (the warm-up's MIN_ROWS-token prompt launched it at start-up)."""
    from pagedlm import LLM
    from pagedlm.ops.jit_watch import compile_watch

    rows = gate_up_silu.MIN_ROWS
    folder = _long_context_copy(tiny[0], tmp_path, positions=2 * rows)
    llm = LLM(str(folder), dtype="bfloat16", device="cuda", attention_backend="triton", skip_tokenizer_init=True,
              cudagraph_mode="FULL_DECODE_ONLY", num_gpu_blocks_override=2 * rows // 16 + 8,
              max_num_batched_tokens=rows, max_model_len=2 * rows, max_num_seqs=2)
    first = len(compile_watch().events)
    fused = []
    real = gate_up_silu.gate_up_silu
    monkeypatch.setattr(gate_up_silu, "gate_up_silu", lambda x, w: fused.append(x.shape[0]) or real(x, w))
    out = llm.generate([{"prompt_token_ids": random_prompt(rows + 100, 5)}],
                       SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    assert rows in fused  # the prompt's first chunk took the fused GEMM while serving
    late = [f"{e.kernel}{e.signature}" for e in compile_watch().since(first)]
    assert not late, "compiled while serving:\n" + "\n".join(late)


def test_eager_warm_up_launches_the_split_decode_kernel(tiny, tmp_path, monkeypatch):
    """Without CUDA graphs no capture launches the split-decode kernel (a decode over a short context
    never takes it): the warm-up's last request decodes over more than MIN_KEYS_PER_SPLIT keys, and
    that step must take it (Triton under the interpreter on CPU)."""
    from pagedlm.attention import triton_backend

    folder = _long_context_copy(tiny[0], tmp_path)
    runner = make_runner(make_config(folder, max_num_batched_tokens=128, max_model_len=512, num_blocks=70,
                                     attention_backend="triton"))
    split_counts = []
    split_decode = triton_backend.split_decode_attention

    def spy(q, kv_cache, meta, scale, sliding_window, num_splits, *args, **kwargs):
        split_counts.append(num_splits)
        return split_decode(q, kv_cache, meta, scale, sliding_window, num_splits, *args, **kwargs)

    monkeypatch.setattr(triton_backend, "split_decode_attention", spy)
    warm_up_kernels(runner)
    assert split_counts and min(split_counts) >= 2, split_counts


def test_warm_up_launches_a_mixed_steps_decode_part(tiny, monkeypatch):
    """The warm-up's mixed step attends to its leading decode with the varlen kernel's decode launch,
    then to the prompt with query tiles (Triton under the interpreter on CPU)."""
    from pagedlm.attention import triton_paged

    runner = make_runner(make_config(tiny[0], max_num_batched_tokens=32, attention_backend="triton"))
    launches = []
    launch = triton_paged._launch

    def spy(q, kv_cache, meta, scale, sliding_window, out, num_seqs, order=None, first_seq=None):
        launches.append((meta.num_seqs, num_seqs, first_seq))
        return launch(q, kv_cache, meta, scale, sliding_window, out, num_seqs, order, first_seq)

    monkeypatch.setattr(triton_paged, "_launch", spy)
    warm_up_kernels(runner)
    assert (2, 1, None) in launches and (2, 2, 1) in launches, sorted(set(launches))
