"""LLM / LLMEngine on a tiny random Llama (token ids only): request isolation, parallel sampling,
priority order, prompt forms, max_tokens resolution, abort."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from pagedlm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]


def _token_ids(outputs: list[Any]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def _drain(engine: Any) -> dict[str, Any]:
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished


def test_bad_request_among_good_ones_fails_alone(tiny_llm: LLM) -> None:
    expected = _token_ids(tiny_llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False))
    engine = tiny_llm.llm_engine
    engine.add_request("good-0", PROMPTS[0], GREEDY)
    with pytest.raises(ValueError, match=r"vocab_size=256"):
        engine.add_request("bad-vocab", [5, 300], GREEDY)
    with pytest.raises(ValueError, match=r"70 tokens.*max_model_len is 64"):
        engine.add_request("bad-long", [5] * 70, GREEDY)
    with pytest.raises(ValueError, match=r"already in use"):
        engine.add_request("good-0", PROMPTS[1], GREEDY)
    engine.add_request("good-1", PROMPTS[1], GREEDY)
    finished = _drain(engine)
    assert set(finished) == {"good-0", "good-1"}
    assert [
        finished["good-0"].outputs[0].token_ids,
        finished["good-1"].outputs[0].token_ids,
    ] == expected


def test_request_id_colliding_with_a_sample_id_is_refused(tiny_llm: LLM) -> None:
    engine = tiny_llm.llm_engine
    engine.add_request(
        "a", PROMPTS[0], SamplingParams(n=2, temperature=0.0, max_tokens=4, ignore_eos=True)
    )
    with pytest.raises(ValueError, match=r"request_id 'a_0' is already in use"):
        engine.add_request("a_0", PROMPTS[1], GREEDY)  # "a" runs as core requests a_0, a_1
    finished = _drain(engine)
    assert set(finished) == {"a"}
    assert [len(c.token_ids) for c in finished["a"].outputs] == [4, 4]


def test_generate_checks_every_prompt_before_running_any(tiny_llm: LLM) -> None:
    expected = _token_ids(tiny_llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    with pytest.raises(ValueError, match=r"^prompt 1: .*vocab_size"):
        tiny_llm.generate([PROMPTS[0], [5, -1], PROMPTS[2]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match=r"^prompt 0: .*tokenizer"):
        tiny_llm.generate("text needs a tokenizer", GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match=r"^prompt 2: prompt is empty"):
        tiny_llm.generate([PROMPTS[0], PROMPTS[1], []], GREEDY, use_tqdm=False)
    assert not tiny_llm.llm_engine.has_unfinished_requests()
    again = tiny_llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    assert _token_ids(again) == expected


def test_n_samples_are_seed_plus_index(tiny_llm: LLM) -> None:
    params = SamplingParams(n=2, seed=7, temperature=1.0, max_tokens=8, ignore_eos=True)
    (out,) = tiny_llm.generate(PROMPTS[0], params, use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1]
    assert all(len(c.token_ids) == 8 for c in out.outputs)
    singles = [
        tiny_llm.generate(
            PROMPTS[0],
            SamplingParams(seed=7 + i, temperature=1.0, max_tokens=8, ignore_eos=True),
            use_tqdm=False,
        )[0]
        for i in range(2)
    ]
    assert [c.token_ids for c in out.outputs] == _token_ids(singles)
    assert out.outputs[0].token_ids != out.outputs[1].token_ids


def test_max_tokens_none_fills_the_model_length(tiny_llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    long_params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    outs = tiny_llm.generate([[7] * 60, [7] * 58], [params, long_params], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 6]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_prompt_embeds_match_token_ids(tiny_llm: LLM, tiny_llama_dir: Path) -> None:
    weights = load_file(str(tiny_llama_dir / "model.safetensors"))["model.embed_tokens.weight"]
    embeds = weights[torch.tensor(PROMPTS[2])]  # [num_tokens, hidden_size]
    out_ids, out_embeds = tiny_llm.generate(
        [PROMPTS[2], {"prompt_embeds": embeds}], GREEDY, use_tqdm=False
    )
    assert out_embeds.outputs[0].token_ids == out_ids.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"hidden_size=64"):
        tiny_llm.generate({"prompt_embeds": embeds[:, :10]}, GREEDY, use_tqdm=False)


def test_abort_removes_the_request(tiny_llm: LLM) -> None:
    engine = tiny_llm.llm_engine
    engine.add_request("keep", PROMPTS[0], GREEDY)
    engine.add_request("drop", PROMPTS[1], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort_request("drop")
    finished = _drain(engine)
    assert set(finished) == {"keep"}
    assert tiny_llm.get_stats().num_running == 0 and tiny_llm.get_stats().num_waiting == 0


def test_priority_policy_runs_lower_values_first(tiny_llama_dir: Path) -> None:
    llm = LLM(
        str(tiny_llama_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
        scheduling_policy="priority",
        max_num_seqs=1,
    )
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, priority=[2, 0, 1])
    order = sorted(range(3), key=lambda i: outs[i].metrics.first_token_time)
    assert order == [1, 2, 0]
    assert all(
        outs[a].metrics.finished_time <= outs[b].metrics.first_token_time
        for a, b in zip(order, order[1:])
    )


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_stop_strings_end_requests_and_free_them(
    tiny_llama_with_tokenizer_dir: Path, async_scheduling: bool
) -> None:
    llm = LLM(
        str(tiny_llama_with_tokenizer_dir),
        dtype="float32",
        device="cpu",
        max_model_len=128,
        num_gpu_blocks_override=64,
        async_scheduling=async_scheduling,
    )
    prompts = ["hello world", "the cat sat", "Stop here."]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    texts = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    assert all(len(text) >= 8 for text in texts)
    stops = [text[5:8] for text in texts]
    stop_params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=24,
            ignore_eos=True,
            stop=[stop],
            include_stop_str_in_output=i == 2,
        )
        for i, stop in enumerate(stops)
    ]
    outputs = llm.generate(prompts, stop_params, use_tqdm=False)
    for i, (text, stop, output) in enumerate(zip(texts, stops, outputs)):
        completion = output.outputs[0]
        end = text.index(stop) + (len(stop) if i == 2 else 0)
        assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
        assert completion.text == text[:end]
        assert len(completion.token_ids) < 24
    stats = llm.get_stats()
    assert stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0.0


def test_start_up_objects_are_out_of_the_cyclic_gc(tiny_llm: LLM) -> None:
    """The engine freezes the GC heap once built: its model (made at start-up) is in no generation
    a collection walks, and objects made afterwards still are."""
    import gc

    model = tiny_llm.llm_engine.engine_core.model_runner.model
    later = [object()]  # a list is GC-tracked
    tracked = {id(obj) for obj in gc.get_objects()}
    assert id(model) not in tracked
    assert id(later) in tracked


def test_a_dropped_engine_is_freed_without_the_cyclic_gc(tiny_llama_dir: Path) -> None:
    """The GC heap is frozen after start-up, so an engine held by a reference cycle would never be
    freed (nor its device memory): dropping the LLM must free it by reference counting alone."""
    import gc
    import weakref

    llm = LLM(str(tiny_llama_dir), skip_tokenizer_init=True, seed=0)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3), use_tqdm=False)
    model, engine = (
        weakref.ref(llm.llm_engine.engine_core.model_runner.model),
        weakref.ref(llm.llm_engine),
    )
    gc.disable()
    try:
        del llm
        assert model() is None and engine() is None
    finally:
        gc.enable()
