"""The official `openai` client against the live server on the default model: completions, chat,
streaming, n=2, stop strings, max_tokens, usage (with prefix-cache hits), logprobs, models, the
API key, and 32 concurrent greedy requests equal to the same requests sent alone."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from server_helpers import API_KEY, ServerProcess

pytestmark = pytest.mark.slow

FRANCE = "The capital of France is"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def client(default_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.url("/v1"), api_key=API_KEY, timeout=300)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "SmolLM2-135M-Instruct.Q4_1.gguf"
    return models[0].id


def test_models_show_the_served_name_and_one_model_by_id(client: openai.OpenAI, model: str) -> None:
    card = client.models.list().data[0]
    assert card.model_extra["root"] == model  # not the model file's path on the server's disk
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-17")
    assert caught.value.body["code"] == "model_not_found" and "gpt-17" in caught.value.message


def test_a_wrong_key_is_an_authentication_error(default_server: ServerProcess, model: str) -> None:
    wrong = openai.OpenAI(base_url=default_server.url("/v1"), api_key="wrong", max_retries=0)
    for call in (wrong.models.list, lambda: wrong.completions.create(model=model, prompt="Hi")):
        with pytest.raises(openai.AuthenticationError) as caught:
            call()
        assert caught.value.body["type"] == "authentication_error"


def greedy_completion(client: openai.OpenAI, model: str, prompt: str, max_tokens: int = 8) -> str:
    result = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0
    )
    return result.choices[0].text


def test_completion_text_finish_and_usage(client: openai.OpenAI, model: str) -> None:
    result = client.completions.create(model=model, prompt=FRANCE, max_tokens=3, temperature=0)
    choice = result.choices[0]
    assert "Paris" in choice.text
    assert choice.finish_reason in ("length", "stop")
    assert result.object == "text_completion" and result.model == model
    usage = result.usage
    assert usage.prompt_tokens == 5 and 1 <= usage.completion_tokens <= 3
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_max_tokens_is_exact_with_ignore_eos(client: openai.OpenAI, model: str) -> None:
    result = client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert result.usage.completion_tokens == 4
    assert result.choices[0].finish_reason == "length"


def test_chat_answers_with_the_template(client: openai.OpenAI, model: str) -> None:
    result = client.chat.completions.create(
        model=model,
        max_tokens=8,
        temperature=0,
        messages=[
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
    )
    choice = result.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert result.object == "chat.completion"
    assert result.usage.prompt_tokens > 20  # the template wraps the messages


def test_completion_stream_equals_whole(client: openai.OpenAI, model: str) -> None:
    whole = greedy_completion(client, model, FRANCE, max_tokens=5)
    chunks = list(
        client.completions.create(
            model=model,
            prompt=FRANCE,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("length", "stop") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_equals_whole(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=5, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[
        0
    ].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("create", ["completions", "chat"])
def test_continuous_usage_stats_put_usage_in_every_chunk(
    client: openai.OpenAI, model: str, create: str
) -> None:
    """vLLM's stream_options.continuous_usage_stats (guidellm sends it on every stream)."""
    params = dict(
        model=model,
        max_tokens=4,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    if create == "completions":
        chunks = list(client.completions.create(prompt=FRANCE, **params))
    else:
        chunks = list(
            client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **params)
        )
    assert all(c.usage is not None for c in chunks)
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 4
    assert len({c.usage.prompt_tokens for c in chunks}) == 1
    assert all(
        c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks
    )
    assert chunks[-1].choices == []  # the usage chunk still ends the stream


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": FRANCE}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ],
    ids=["completions", "chat"],
)
def test_stream_chunks_carry_finish_reason_null_until_the_last(
    default_server: ServerProcess, path: str, body: dict
) -> None:
    """As OpenAI's: every choice of a chunk has finish_reason (and logprobs), null until its
    end; a chat delta names only what it brings."""
    request = {**body, "max_tokens": 4, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", default_server.url(path), json=request, headers=AUTH, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        lines = [
            line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")
        ]
    assert lines[-1] == "[DONE]"
    choices = [choice for line in lines[:-1] for choice in json.loads(line)["choices"]]
    assert [c["finish_reason"] for c in choices][-1] == "length"
    assert all(c["finish_reason"] is None and "logprobs" in c for c in choices[:-1]), choices
    if path == "/v1/chat/completions":
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        assert all(set(c["delta"]) <= {"content"} for c in choices[1:]), choices


def test_n2_gives_two_seeded_samples(
    client: openai.OpenAI, model: str, default_server: ServerProcess
) -> None:
    prompt = "My favourite animal is"
    num_prompt = httpx.post(
        default_server.url("/tokenize"), json={"prompt": prompt}, headers=AUTH
    ).json()["count"]

    def sample() -> list[str]:
        result = client.completions.create(
            model=model, prompt=prompt, max_tokens=4, n=2, temperature=1.0, seed=1234
        )
        assert [c.index for c in result.choices] == [0, 1]
        assert result.usage.prompt_tokens == num_prompt  # the prompt counts once, not n times
        return [c.text for c in result.choices]

    first = sample()
    assert first == sample()  # seeded: reproducible


def test_n2_streams_both_choices(client: openai.OpenAI, model: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3,
            n=2,
            stream=True,
            seed=7,
        )
    )
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert mine[-1].finish_reason is not None


def test_stop_string_ends_and_is_reported(client: openai.OpenAI, model: str) -> None:
    whole = greedy_completion(client, model, FRANCE, max_tokens=8)
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    assert stop.strip(), f"no usable stop string in {whole!r}"
    result = client.completions.create(
        model=model, prompt=FRANCE, max_tokens=8, temperature=0, stop=[stop]
    )
    choice = result.choices[0]
    assert choice.text == whole[: whole.index(stop)]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop
    kept = client.completions.create(
        model=model,
        prompt=FRANCE,
        max_tokens=8,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == whole[: whole.index(stop) + len(stop)]


def test_cached_tokens_from_the_prefix_cache(client: openai.OpenAI, model: str) -> None:
    prompt = "Here is a long story about a lighthouse keeper and the sea. " * 4  # > 2 blocks
    first = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0)
    second = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 32 and cached % 16 == 0 and cached < second.usage.prompt_tokens


def test_completion_logprobs(client: openai.OpenAI, model: str) -> None:
    result = client.completions.create(
        model=model, prompt=FRANCE, max_tokens=3, temperature=0, logprobs=2
    )
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == result.usage.completion_tokens
    assert "".join(logprobs.tokens) == result.choices[0].text
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert logprob <= 0 and token in top and 2 <= len(top) <= 3
        assert top[token] == max(top.values())  # greedy: the sampled token is the most likely


def test_chat_logprobs(client: openai.OpenAI, model: str) -> None:
    result = client.chat.completions.create(
        model=model,
        max_tokens=2,
        temperature=0,
        messages=[{"role": "user", "content": "Hi"}],
        logprobs=True,
        top_logprobs=2,
    )
    content = result.choices[0].logprobs.content
    assert len(content) == result.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token  # greedy
        assert bytes(entry.bytes).decode() == entry.token


def test_echo_and_token_id_prompts(
    client: openai.OpenAI, model: str, default_server: ServerProcess
) -> None:
    echoed = client.completions.create(
        model=model, prompt=FRANCE, max_tokens=2, temperature=0, echo=True
    )
    plain = greedy_completion(client, model, FRANCE, max_tokens=2)
    assert echoed.choices[0].text == FRANCE + plain
    token_ids = httpx.post(
        default_server.url("/tokenize"), json={"prompt": FRANCE}, headers=AUTH
    ).json()["tokens"]
    batch = client.completions.create(
        model=model, prompt=[token_ids, token_ids], max_tokens=2, temperature=0
    )
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == [plain, plain]


def test_32_concurrent_requests_equal_alone(default_server: ServerProcess, model: str) -> None:
    """4 distinct prompts, each sent alone, then 8 times each, all 32 at once (greedy)."""
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(4)]
    aclient = openai.AsyncOpenAI(base_url=default_server.url("/v1"), api_key=API_KEY, timeout=600)

    async def one(prompt: str) -> str:
        result = await aclient.completions.create(
            model=model, prompt=prompt, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
        return result.choices[0].text

    async def run() -> tuple[list[str], list[str]]:
        alone = [await one(p) for p in prompts]
        together = await asyncio.gather(*(one(prompts[i % 4]) for i in range(32)))
        return alone, together

    alone, together = asyncio.run(run())
    assert together == [alone[i % 4] for i in range(32)]
