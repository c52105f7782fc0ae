"""Start-up work that launches the Triton kernel specialisations a pure-decode CUDA-graph capture
leaves out, so that no request waits for a compile (pagedlm.ops.jit_watch logs any that still
happens while serving). Each kernel module declares what its dispatch rules need (ops/warm_up.py):
requests, run here as dummy steps on the real KV cache before any request exists (ModelRunner.
dummy_steps: its prompt in chunks of the step budget, then one decode step, eager under
enforce_eager, with a new prompt beside it for a mixed step), and direct calls.
Left uncompiled: the eager 2-8-row GEMV of a prompt_embeds step (which runs eagerly) when
max_num_seqs is 1 (no decode graph of 2-8 rows compiled it); jit_watch logs it if it happens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlm.attention import triton_backend, triton_decode, triton_paged
from pagedlm.ops import gate_up_silu
from pagedlm.ops.warm_up import WarmUpRequest, WarmUpTarget
from pagedlm.sample import grammar_mask, sampler
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.dummy_steps import DummySteps

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner

WARM_UP_REQUESTS = (
    *triton_paged.WARM_UP_REQUESTS,
    *triton_decode.WARM_UP_REQUESTS,
    *sampler.WARM_UP_REQUESTS,
)
WARM_UP_CALLS = (
    gate_up_silu.warm_up,
    sampler.warm_up_threshold_kernel,
    grammar_mask.warm_up,
    triton_backend.warm_up_large_batch_split,
)


def warm_up_kernels(runner: ModelRunner) -> None:
    """Each of WARM_UP_REQUESTS that the runner's limits allow, one after the other (waiting for each
    step), then each of WARM_UP_CALLS."""
    with runner.dummy_steps() as steps:
        for request in WARM_UP_REQUESTS:
            _run(runner, steps, request)
    model = runner.config.model
    target = WarmUpTarget(
        model=runner.model,
        device=runner.device,
        vocab_size=model.vocab_size,
        max_num_tokens=runner.max_num_tokens,
        kv_caches=runner.kv_caches,
    )
    for call in WARM_UP_CALLS:
        call(target)
    if runner.spec is not None:
        runner.spec.warm_up()


def _run(runner: ModelRunner, steps: DummySteps, request: WarmUpRequest) -> None:
    """The request's prompt, then its decode step (beside a new prompt of request.mixed_with tokens),
    then it leaves; skipped where no step or KV cache of the runner holds it (nor then a real one)."""
    if request.mixed_with and (
        runner.max_num_reqs < 2 or 1 + request.mixed_with > runner.max_num_tokens
    ):
        return
    params = SamplingParams(
        temperature=request.temperature, top_p=request.top_p, seed=0, max_tokens=2, ignore_eos=True
    )
    num_prompt = min(request.num_prompt_tokens, runner.config.model.max_model_len - 1)
    req_ids = [steps.add(num_prompt, params, num_decodes=1)]
    if request.mixed_with:
        req_ids.append(steps.add(request.mixed_with, params, num_decodes=0))
    if None not in req_ids:
        steps.prefill(req_ids[0])
        steps.step(dict(zip(req_ids, (1, request.mixed_with))))  # its decode, then the new prompt
    steps.finish(*(req_id for req_id in req_ids if req_id is not None))
