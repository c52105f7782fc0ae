"""Start-up steps that launch the Triton kernel specialisations a pure-decode CUDA-graph capture
leaves out, so that no request waits for a compile (pagedlm.ops.jit_watch logs any that still
happens while serving). The capture covers decode batches; these steps add
- a short query chunk (at most 16 rows of query tokens x heads of a KV group: the small non-decode
  attention tile, where very short prompts and the last few tokens of a chunked one land) and a
  longer one (the prefill tile; the profile step has it too, but not with num_gpu_blocks_override,
  which skips the profile),
- the fused random draw with a temperature and without one, and with top-p; the truncation
  threshold's kernel (sample/triton_threshold.py) without a min-p floor and with one, by direct
  calls (a batch where every row has a top-k of at most filters.TOP_K_LIMIT takes torch.topk's path
  instead, so a top-k request does not launch it),
- a decode step of each (eager under enforce_eager), the last one over more than
  MIN_KEYS_PER_SPLIT keys: the split-decode kernel, which a decode over a short context never takes
  (with CUDA graphs the capture has launched it already; its prompt then only costs a prefill),
- a mixed step, a decode ahead of a 2-token prompt: the varlen kernel's decode launch for a mixed
  step's leading decodes (decode-only steps replay graphs, and where every capture size takes the
  split decode, as at small max_num_seqs and long max_model_len, nothing else launches it),
- the fused gate_up GEMM on zeros, where a step can hold gate_up_silu.MIN_ROWS rows (the profile
  step and the piecewise capture launch it too, unless num_gpu_blocks_override and FULL_DECODE_ONLY
  skip them).
The steps run on the real KV cache before any request exists, in blocks no request owns yet (not
the null block, which pads block tables)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pagedlm.attention.triton_decode import MIN_KEYS_PER_SPLIT
from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedlm.model.llama import LlamaMLP
from pagedlm.ops import gate_up_silu
from pagedlm.sample.filters import TopKTopP
from pagedlm.sample.triton_threshold import triton_top_k_top_p_threshold
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.input_batch import cdiv

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner

# (prompt tokens, sampling): 2 tokens take the small tile for every GQA group up to 8; 32 (in
# chunks of the step budget, if smaller) the prefill tile for every group >= 2; temperature 0.7
# draws with a temperature, 1.0 without, 0 is greedy; top-p launches the threshold kernel. With
# piecewise graphs these prompts replay them (the pieces' kernels compiled at capture; the attention
# between them runs eagerly and compiles here). Left uncompiled then: the eager 2-8-row GEMV of a
# prompt_embeds step (which runs eagerly) when max_num_seqs is 1 (no decode graph of 2-8 rows
# compiled it); jit_watch logs it if it happens. The last prompt's decode step reads more than
# MIN_KEYS_PER_SPLIT keys: one sequence, long enough to be split
# (attention.triton_decode.choose_num_splits).
WARM_UP_REQUESTS = ((2, dict(temperature=0.7)), (2, dict(temperature=1.0)), (2, dict(top_p=0.9)),
                    (32, dict(temperature=0.0)), (MIN_KEYS_PER_SPLIT + 1, dict(temperature=0.0)))


def warm_up_kernels(runner: ModelRunner) -> None:
    """Per request of WARM_UP_REQUESTS: its prompt in chunks of the step budget, one decode step,
    then it leaves. Waits for each step. Then a mixed step, the fused gate_up GEMM and the threshold
    kernel."""
    for i, (num_prompt, sampling) in enumerate(WARM_UP_REQUESTS):
        num_prompt = min(num_prompt, runner.config.model.max_model_len - 1)
        num_blocks = cdiv(num_prompt + 1, runner.block_size)
        if NULL_BLOCK_ID + num_blocks >= runner.input_batch.num_kv_blocks:
            continue  # a KV cache this small never holds such a batch either
        req_id = f"_warmup_{i}"
        params = SamplingParams(**sampling, seed=0, max_tokens=2, ignore_eos=True)
        new = NewRequestData(req_id=req_id, prompt_token_ids=[0] * num_prompt, output_token_ids=[],
                             sampling_params=params,
                             block_ids=list(range(NULL_BLOCK_ID + 1, NULL_BLOCK_ID + 1 + num_blocks)),
                             num_computed_tokens=0)
        for start in range(0, num_prompt, runner.max_num_tokens):
            chunk = min(runner.max_num_tokens, num_prompt - start)
            new_reqs, cached_reqs = ([new], []) if start == 0 else ([], [CachedRequestData(req_id, [], start)])
            _step(runner, new_reqs, cached_reqs, chunk, req_id, sample=start + chunk == num_prompt)
        _step(runner, [], [CachedRequestData(req_id, [], num_prompt)], 1, req_id, sample=True)
        _finish(runner, {req_id})
    _mixed_step(runner)
    _fused_gate_up(runner)
    _threshold_kernel(runner)


def _threshold_kernel(runner: ModelRunner) -> None:
    """The truncation threshold's kernel on one row of the vocabulary's size, without a min-p floor and
    with one (a row with min-p and top-p, or in a batch where some row has no top-k)."""
    device = runner.device
    params = TopKTopP(index=None, top_k=torch.ones(1, dtype=torch.int64, device=device),
                      top_p=torch.full((1,), 0.5, device=device), max_top_k=1, every_row_top_k=False,
                      any_top_p=True)
    probs = torch.ones(1, runner.config.model.vocab_size, device=device)
    for floor in (None, torch.zeros(1, device=device)):
        triton_top_k_top_p_threshold(probs, floor, params)


def _fused_gate_up(runner: ModelRunner) -> None:
    """The fused gate_up GEMM (ops/gate_up_silu.py) once on zeros of MIN_ROWS rows, where a step can
    be that large and the model's MLP takes it (16-bit, TMA): its only launch before serving where
    num_gpu_blocks_override skips the profile step and FULL_DECODE_ONLY the piecewise capture."""
    if runner.max_num_tokens < gate_up_silu.MIN_ROWS:
        return
    mlp = next((module for module in runner.model.modules() if isinstance(module, LlamaMLP)), None)
    if mlp is not None:
        weight = mlp.gate_up_proj.weight
        mlp.gate_up_proj.gated(weight.new_zeros(gate_up_silu.MIN_ROWS, weight.shape[1]))  # None: not fused


def _mixed_step(runner: ModelRunner) -> None:
    """A 2-token prompt's prefill, then its decode in one step with a new 2-token prompt (decode
    first, as the scheduler orders them), then both leave. Skipped where no step can hold both."""
    if (runner.max_num_tokens < 3 or runner.config.scheduler.max_num_seqs < 2
            or NULL_BLOCK_ID + 2 >= runner.input_batch.num_kv_blocks):
        return
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    decode, prompt = (NewRequestData(req_id=f"_warmup_{name}", prompt_token_ids=[0, 0], output_token_ids=[],
                                     sampling_params=params, block_ids=[NULL_BLOCK_ID + 1 + i],
                                     num_computed_tokens=0) for i, name in enumerate(("decode", "prompt")))
    _step(runner, [decode], [], 2, decode.req_id, sample=True)
    mixed = SchedulerOutput(new_reqs=[prompt], cached_reqs=[CachedRequestData(decode.req_id, [], 2)],
                            num_scheduled_tokens={decode.req_id: 1, prompt.req_id: 2},
                            total_num_scheduled_tokens=3, sampling_req_ids={decode.req_id, prompt.req_id})
    runner.execute_model(mixed).get_output()
    _finish(runner, {decode.req_id, prompt.req_id})


def _finish(runner: ModelRunner, req_ids: set[str]) -> None:
    runner.execute_model(SchedulerOutput(new_reqs=[], cached_reqs=[], num_scheduled_tokens={},
                                         total_num_scheduled_tokens=0, finished_req_ids=req_ids))


def _step(runner: ModelRunner, new_reqs: list[NewRequestData], cached_reqs: list[CachedRequestData],
          num_tokens: int, req_id: str, sample: bool) -> None:
    """One step of req_id's num_tokens; sample: they end at its sequence's end (else a prefill chunk)."""
    sched = SchedulerOutput(new_reqs=new_reqs, cached_reqs=cached_reqs,
                            num_scheduled_tokens={req_id: num_tokens},
                            total_num_scheduled_tokens=num_tokens, sampling_req_ids={req_id} if sample else set())
    runner.execute_model(sched).get_output()
