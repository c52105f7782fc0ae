"""IncrementalDetokenizer: text built token by token must equal the text of a full decode, with
multi-byte characters held back until complete, word-start spaces kept, and stop strings."""

from __future__ import annotations

from typing import Any

import pytest

from pagedlm.engine.detokenizer import IncrementalDetokenizer
from pagedlm.sampling_params import SamplingParams

EMOJI = "\U0001f600"  # 4 UTF-8 bytes


def _split(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """Token ids of prompt + completion, split where the prompt's own tokens end."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    all_ids = tokenizer.encode(prompt + completion, add_special_tokens=False)
    assert all_ids[: len(prompt_ids)] == prompt_ids, "the split must fall on a token boundary"
    return prompt_ids, all_ids[len(prompt_ids) :]


def _stream(
    tokenizer: Any, prompt_ids: list[int], output_ids: list[int], params: SamplingParams
) -> tuple[IncrementalDetokenizer, list[str], str | None, int]:
    """Pushes tokens until a stop; returns the detokenizer, the streamed texts after each
    token, the stop string and how many tokens were pushed."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, params)
    texts = []
    for num_pushed, token_id in enumerate(output_ids, start=1):
        stop = detok.push(token_id)
        texts.append(detok.output_text(finished=stop is not None))
        if stop is not None:
            return detok, texts, stop, num_pushed
    return detok, texts, None, len(output_ids)


def _reference(tokenizer: Any, prompt_ids: list[int], output_ids: list[int]) -> str:
    """What a full decode adds after the prompt."""
    prompt_text = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    full_text = tokenizer.decode(prompt_ids + output_ids, skip_special_tokens=True)
    assert full_text.startswith(prompt_text)
    return full_text[len(prompt_text) :]


@pytest.mark.parametrize("kind", ["byte_level_tokenizer", "sentencepiece_tokenizer"])
def test_emoji_split_over_tokens_is_held_back_until_complete(
    kind: str, request: pytest.FixtureRequest
) -> None:
    tokenizer = request.getfixturevalue(kind)
    prompt_ids, output_ids = _split(tokenizer, "hello world", f" {EMOJI} cat {EMOJI}")
    emoji_ids = tokenizer.encode(EMOJI, add_special_tokens=False)
    assert len(emoji_ids) >= 2, "the test needs a character split over several tokens"
    _, texts, _, _ = _stream(tokenizer, prompt_ids, output_ids, SamplingParams())
    assert all("\ufffd" not in text for text in texts)
    assert texts[-1] == _reference(tokenizer, prompt_ids, output_ids) == f" {EMOJI} cat {EMOJI}"
    # Text only grows, and the partial emoji bytes add nothing.
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert len(set(texts)) < len(texts)


@pytest.mark.parametrize("kind", ["byte_level_tokenizer", "sentencepiece_tokenizer"])
def test_word_start_spaces_survive_token_by_token(
    kind: str, request: pytest.FixtureRequest
) -> None:
    tokenizer = request.getfixturevalue(kind)
    prompt_ids, output_ids = _split(tokenizer, "Hello", " world again")
    _, texts, _, _ = _stream(tokenizer, prompt_ids, output_ids, SamplingParams())
    assert texts[-1] == _reference(tokenizer, prompt_ids, output_ids) == " world again"


def test_sentencepiece_first_output_token_keeps_its_space(sentencepiece_tokenizer: Any) -> None:
    """Decoded alone, a '▁world' token loses its space (the decoder strips a leading one); the
    detokenizer must decode it in the prompt's context."""
    prompt_ids, output_ids = _split(sentencepiece_tokenizer, "Hello", " world")
    assert sentencepiece_tokenizer.decode(output_ids) == "world"
    _, texts, _, _ = _stream(sentencepiece_tokenizer, prompt_ids, output_ids, SamplingParams())
    assert texts[-1] == " world"


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_skipped_or_kept(byte_level_tokenizer: Any, skip: bool) -> None:
    prompt_ids, output_ids = _split(byte_level_tokenizer, "Hello", " world")
    output_ids = output_ids + [byte_level_tokenizer.eos_token_id]
    _, texts, _, _ = _stream(
        byte_level_tokenizer, prompt_ids, output_ids, SamplingParams(skip_special_tokens=skip)
    )
    assert texts[-1] == (" world" if skip else " world</s>")


COMPLETION = " the cat sat on the mat. The end."


@pytest.mark.parametrize(
    "stop, include, expected_text, expected_stop",
    [
        (["sat"], False, " the cat ", "sat"),
        (["sat"], True, " the cat sat", "sat"),
        (["t s"], False, " the ca", "t s"),  # straddles the tokens of "cat" and " sat"
        (["mat", "cat"], False, " the ", "cat"),
        (["sat", "t sat"], False, " the ca", "t sat"),  # both end in " sat": the earlier start wins
        (["Hello"], False, COMPLETION, None),  # the prompt's text is not searched
    ],
)
def test_stop_strings(
    byte_level_tokenizer: Any,
    stop: list[str],
    include: bool,
    expected_text: str,
    expected_stop: str | None,
) -> None:
    prompt_ids, output_ids = _split(byte_level_tokenizer, "Hello", COMPLETION)
    params = SamplingParams(stop=stop, include_stop_str_in_output=include)
    detok, texts, found, num_pushed = _stream(byte_level_tokenizer, prompt_ids, output_ids, params)
    assert found == expected_stop
    assert detok.output_text(finished=True) == expected_text
    if found is not None:
        # It stopped at the token that completed the stop string, not later.
        before = _reference(byte_level_tokenizer, prompt_ids, output_ids[: num_pushed - 1])
        assert found not in before
        assert found in _reference(byte_level_tokenizer, prompt_ids, output_ids[:num_pushed])
        assert num_pushed < len(output_ids)


def test_streamed_text_never_shows_a_stop_string_it_later_removes(
    byte_level_tokenizer: Any,
) -> None:
    prompt_ids, output_ids = _split(byte_level_tokenizer, "Hello", COMPLETION)
    _, texts, found, _ = _stream(
        byte_level_tokenizer, prompt_ids, output_ids, SamplingParams(stop=["sat on"])
    )
    assert found == "sat on"
    final = texts[-1]
    assert final == " the cat "
    assert all(final.startswith(text) for text in texts)  # nothing shown was taken back


def test_stop_strings_wait_for_min_tokens(byte_level_tokenizer: Any) -> None:
    prompt_ids, output_ids = _split(byte_level_tokenizer, "Hello", COMPLETION)
    num_through_cat = len(byte_level_tokenizer.encode(" the cat", add_special_tokens=False))
    params = SamplingParams(stop=["cat", "mat"], min_tokens=num_through_cat)
    detok, _, found, _ = _stream(byte_level_tokenizer, prompt_ids, output_ids, params)
    assert found == "mat"
    assert detok.output_text(finished=True) == " the cat sat on the "
