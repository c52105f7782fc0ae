"""CompletionOutput.weight_versions: which weights sampled which tokens, across a weight update
between the steps of a running request; and the spans the output processor builds."""

from __future__ import annotations

import tiny_hf_models
from rl_helpers import PROMPTS

from pagedlm import SamplingParams
from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.engine.output_processor import OutputProcessor
from pagedlm.outputs import WeightVersionSpan

NUM_TOKENS = 12


def test_spans_follow_the_versions_of_core_outputs() -> None:
    processor = OutputProcessor(None)
    processor.add_request("r", None, [5, 6], SamplingParams(max_tokens=9), 0.0, [5, 6])
    steps = [([7, 8], "v1"), ([9], "v1"), ([], "v2"), ([10], "v2"), ([11, 12], "v1")]
    for ids, version in steps:
        processor.process_outputs([EngineCoreOutput("r", ids, weight_version=version)])
    (out,) = processor.process_outputs(
        [EngineCoreOutput("r", [13], finish_reason="length", weight_version="v1")]
    ).request_outputs
    assert out.outputs[0].weight_versions == [
        WeightVersionSpan("v1", 0, 3),
        WeightVersionSpan("v2", 3, 4),
        WeightVersionSpan("v1", 4, 7),  # a version met again opens a span of its own
    ]


def test_update_between_steps_of_a_running_request(llm, model_a, model_b) -> None:
    """A's tokens, then B's: after the update the request's KV is recomputed with B (no stale KV),
    so its next tokens are B's greedy continuation of the prompt and A's tokens so far."""
    engine, prompt = llm.llm_engine, PROMPTS[0]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    old_version = llm.collective_rpc("get_weight_version")[0]
    engine.add_request("spans", {"prompt_token_ids": prompt}, params)
    seen = 0
    while seen < 3:
        (out,) = engine.step() or [None]
        seen = len(out.outputs[0].token_ids) if out else seen
    llm.update_weights_from_tensor(
        [(name, p.detach()) for name, p in model_b.hf_model.named_parameters()], "b"
    )
    while out is None or not out.finished:
        (out,) = engine.step() or [None]
    tokens, spans = out.outputs[0].token_ids, out.outputs[0].weight_versions
    switch = spans[0].end
    assert seen <= switch < NUM_TOKENS
    assert spans == [WeightVersionSpan(old_version, 0, switch), WeightVersionSpan("b", switch, 12)]
    a_greedy = tiny_hf_models.hf_greedy(model_a.hf_model, [prompt], NUM_TOKENS)[0]
    assert tokens[:switch] == a_greedy[:switch]
    (b_rest,) = tiny_hf_models.hf_greedy(
        model_b.hf_model, [prompt + tokens[:switch]], NUM_TOKENS - switch
    )
    assert tokens[switch:] == b_rest
