"""OutputProcessor on hand-made core outputs: parallel samples gathered, stop strings finishing
requests (and telling the core), logprobs, aborts."""

from __future__ import annotations

from typing import Any

from pagedlm.core.sched_output import EngineCoreOutput, Logprobs
from pagedlm.engine.output_processor import OutputProcessor
from pagedlm.sampling_params import SamplingParams


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_parallel_samples_are_gathered_in_index_order(byte_level_tokenizer: Any) -> None:
    processor = OutputProcessor(byte_level_tokenizer)
    prompt = _ids(byte_level_tokenizer, "Hello")
    core_ids = processor.add_request("r", "Hello", prompt, SamplingParams(n=2), 1.0, prompt)
    assert core_ids == ["r_0", "r_1"]
    world, cat = _ids(byte_level_tokenizer, " world"), _ids(byte_level_tokenizer, " cat")

    first = processor.process_outputs([EngineCoreOutput("r_1", cat, finish_reason="length")])
    (out,) = first.request_outputs
    assert not out.finished and out.request_id == "r"
    assert [c.index for c in out.outputs] == [0, 1]
    assert out.outputs[1].text == " cat" and out.outputs[1].finish_reason == "length"
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason is None

    second = processor.process_outputs(
        [EngineCoreOutput("r_0", world, finish_reason="stop", stop_reason=7, num_cached_tokens=16)]
    )
    (out,) = second.request_outputs
    assert out.finished and out.num_cached_tokens == 16
    assert out.outputs[0].text == " world" and out.outputs[0].stop_reason == 7
    assert out.metrics.finished_time is not None and out.metrics.first_token_time is not None
    assert processor.num_unfinished_requests() == 0


def test_stop_string_finishes_the_request_and_drops_later_tokens(byte_level_tokenizer: Any) -> None:
    processor = OutputProcessor(byte_level_tokenizer)
    prompt = _ids(byte_level_tokenizer, "Hello")
    processor.add_request("a", "Hello", prompt, SamplingParams(stop=["cat"]), 1.0, prompt)
    tokens = _ids(byte_level_tokenizer, " the cat sat")
    num_through_cat = len(_ids(byte_level_tokenizer, " the cat"))

    result = processor.process_outputs([EngineCoreOutput("a", tokens)])
    assert result.reqs_to_finish == ["a"]  # the core must free it
    (out,) = result.request_outputs
    assert out.finished
    assert out.outputs[0].text == " the " and out.outputs[0].stop_reason == "cat"
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].token_ids == tokens[:num_through_cat]
    # A step that was already in flight reports more tokens: ignored.
    late = processor.process_outputs([EngineCoreOutput("a", tokens[:1])])
    assert late.request_outputs == [] and late.reqs_to_finish == []


def test_core_finished_request_is_not_finished_again(byte_level_tokenizer: Any) -> None:
    processor = OutputProcessor(byte_level_tokenizer)
    prompt = _ids(byte_level_tokenizer, "Hello")
    processor.add_request("a", "Hello", prompt, SamplingParams(stop=["cat"]), 1.0, prompt)
    tokens = _ids(byte_level_tokenizer, " the cat")
    result = processor.process_outputs([EngineCoreOutput("a", tokens, finish_reason="length")])
    assert result.reqs_to_finish == []  # the core already freed it
    assert result.request_outputs[0].outputs[0].stop_reason == "cat"


def test_logprobs_become_dicts_with_ranks() -> None:
    processor = OutputProcessor(None)  # no tokenizer: token ids only, empty text
    processor.add_request("a", None, [3, 4], SamplingParams(logprobs=2), 1.0, [3, 4])
    lp = [
        Logprobs(token_ids=[9, 5, 9], logprobs=[-0.5, -0.1, -0.5], sampled_rank=2),
        Logprobs(token_ids=[6, 6, 8], logprobs=[-0.2, -0.2, -2.0], sampled_rank=1),
    ]
    result = processor.process_outputs(
        [EngineCoreOutput("a", [9, 6], new_logprobs=lp, finish_reason="length")]
    )
    completion = result.request_outputs[0].outputs[0]
    assert completion.text == "" and completion.token_ids == [9, 6]
    assert completion.cumulative_logprob == -0.5 + -0.2
    first, second = completion.logprobs
    assert {t: (v.logprob, v.rank) for t, v in first.items()} == {9: (-0.5, 2), 5: (-0.1, 1)}
    assert {t: (v.logprob, v.rank) for t, v in second.items()} == {6: (-0.2, 1), 8: (-2.0, 2)}


def test_abort_returns_core_ids_and_forgets_the_request() -> None:
    processor = OutputProcessor(None)
    processor.add_request("a", None, [3], SamplingParams(n=3), 1.0, [3])
    processor.process_outputs([EngineCoreOutput("a_1", [5], finish_reason="length")])
    assert processor.abort_requests(["a", "unknown"]) == ["a_0", "a_2"]
    assert processor.num_unfinished_requests() == 0
    assert processor.process_outputs([EngineCoreOutput("a_0", [5])]).request_outputs == []


def test_final_only_request_is_reported_once_finished() -> None:
    processor = OutputProcessor(None)
    processor.add_request("f", None, [3], SamplingParams(n=2), 1.0, [3], final_only=True)
    processor.add_request("s", None, [3], SamplingParams(), 1.0, [3])  # streamed
    step = processor.process_outputs(
        [EngineCoreOutput("f_0", [5]), EngineCoreOutput("f_1", [6]), EngineCoreOutput("s", [7])]
    )
    assert [out.request_id for out in step.request_outputs] == ["s"]
    one_done = processor.process_outputs([EngineCoreOutput("f_0", [8], finish_reason="length")])
    assert one_done.request_outputs == []  # sample 1 still runs
    done = processor.process_outputs([EngineCoreOutput("f_1", [9], finish_reason="length")])
    (out,) = done.request_outputs
    assert out.finished and [c.token_ids for c in out.outputs] == [[5, 8], [6, 9]]
    assert processor.num_unfinished_requests() == 1  # "s"
