"""Every error the server answers, with its status, OpenAI's error shape, the parameter and the
message (default model, max_model_len 1024, an API key, a 100 kB body limit)."""
from __future__ import annotations

import httpx
import pytest
from server_helpers import API_KEY, ServerProcess

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def http(default_server: ServerProcess) -> httpx.Client:
    with httpx.Client(base_url=default_server.base_url, headers=AUTH, timeout=120) as client:
        yield client


def assert_error(response: httpx.Response, status: int, *fragments: str,
                 param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in error["message"], error
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("extra, param, fragment", [
    ({"temperature": -1}, "temperature", "greater than or equal to 0"),
    ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"n": 0}, "n", "greater than or equal to 1"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"presence_penalty": 3}, "presence_penalty", "less than or equal to 2"),
    ({"logprobs": 21}, "logprobs", "less than or equal to 20"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids", "[0, 49152)"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens", "at most max_tokens=2"),
    ({"priority": 1}, "priority", "--scheduling-policy priority"),
    ({"seed": "abc"}, "seed", "valid integer"),
    ({"suffix": "tail"}, "suffix", "not supported"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
    ({"best_of": 2}, "best_of", "unrecognized or unsupported parameter"),
    ({"echo": True, "logprobs": 1}, "logprobs", "not supported"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": [10**9]}, "prompt", "vocab_size=49152"),
])
def test_completion_parameter_errors(http: httpx.Client, extra: dict, param: str,
                                     fragment: str) -> None:
    body = {"prompt": "Hello", "max_tokens": 2, **extra}
    assert_error(http.post("/v1/completions", json=body), 400, fragment, param=param)


@pytest.mark.parametrize("extra, param, fragment", [
    ({"messages": []}, "messages", "at least 1 item"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "role"),
    ({"top_logprobs": 2}, "top_logprobs", "logprobs=true"),
    ({"tools": []}, "tools", "unrecognized or unsupported parameter"),
    ({"max_completion_tokens": -1}, "max_completion_tokens", "greater than or equal to 1"),
])
def test_chat_parameter_errors(http: httpx.Client, extra: dict, param: str, fragment: str) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}
    assert_error(http.post("/v1/chat/completions", json=body), 400, fragment, param=param)


def test_invalid_json_is_400(http: httpx.Client) -> None:
    response = http.post("/v1/completions", content=b"{not json",
                         headers={"Content-Type": "application/json"})
    assert_error(response, 400, "not valid JSON")


def test_prompt_longer_than_the_context(http: httpx.Client) -> None:
    error = assert_error(http.post("/v1/completions", json={"prompt": [100] * 1100}),
                         400, "1100", "1024", param="prompt")
    assert error["code"] == "context_length_exceeded"


def test_prompt_plus_max_tokens_over_the_context(http: httpx.Client) -> None:
    body = {"prompt": [100] * 1000, "max_tokens": 100}
    error = assert_error(http.post("/v1/completions", json=body), 400, "1024", "1100", "1000",
                         "100 for the completion", param="max_tokens")
    assert error["code"] == "context_length_exceeded"


def test_chat_over_the_context_names_messages(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "hello " * 1100}]}
    assert_error(http.post("/v1/chat/completions", json=body), 400, "1024", param="messages")


def test_unknown_model_is_404(http: httpx.Client) -> None:
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        error = assert_error(http.post(path, json={**body, "model": "gpt-17"}), 404,
                             "The model `gpt-17` does not exist", param="model")
        assert error["code"] == "model_not_found"


def test_api_key_is_required_on_v1(default_server: ServerProcess) -> None:
    missing = httpx.get(default_server.url("/v1/models"))
    error = assert_error(missing, 401, "API key")
    assert error["type"] == "authentication_error"
    wrong = httpx.post(default_server.url("/v1/completions"), json={"prompt": "Hi"},
                       headers={"Authorization": "Bearer wrong"})
    assert_error(wrong, 401, "API key")
    assert httpx.get(default_server.url("/health")).status_code == 200  # outside /v1: open


def test_body_over_the_limit_is_413(http: httpx.Client) -> None:
    body = {"prompt": "a " * 60_000}  # 120 kB > 100 kB
    assert_error(http.post("/v1/completions", json=body), 413, "100000 bytes")

    def chunks():  # no Content-Length: the limit is counted while reading
        for _ in range(30):
            yield b" " * 5000

    response = http.post("/v1/completions", content=chunks(),
                         headers={"Content-Type": "application/json"})
    assert_error(response, 413, "100000 bytes")


def test_unknown_route_is_404_in_openai_shape(http: httpx.Client) -> None:
    assert_error(http.get("/v1/nothing-here"), 404, "Not Found")


def test_request_id_is_echoed(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                         headers={"X-Request-Id": "my-request-7"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "my-request-7"
    assert response.json()["id"] == "cmpl-my-request-7"
