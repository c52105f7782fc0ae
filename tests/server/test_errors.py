"""Every error the server answers, with its status, OpenAI's error shape, the parameter and the
message (default model, max_model_len 1024, an API key, a 100 kB body limit)."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import API_KEY, ServerProcess

from pagedlm.server.protocol import MAX_STOP_CHARS, MAX_STOPS

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def http(default_server: ServerProcess) -> httpx.Client:
    with httpx.Client(base_url=default_server.base_url, headers=AUTH, timeout=120) as client:
        yield client


def assert_error(
    response: httpx.Response, status: int, *fragments: str, param: str | None = None
) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in error["message"], error
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize(
    "extra, param, fragment",
    [
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
        # strict types: what OpenAI's schema calls an integer or a boolean takes nothing else
        ({"max_tokens": True}, "max_tokens", "valid integer"),
        ({"max_tokens": "5"}, "max_tokens", "valid integer"),
        ({"max_tokens": 5.0}, "max_tokens", "valid integer"),
        ({"n": "2"}, "n", "valid integer"),
        ({"stream": "yes"}, "stream", "valid boolean"),
        ({"stream": 1}, "stream", "valid boolean"),
        ({"echo": "true"}, "echo", "valid boolean"),
        ({"logprobs": "yes"}, "logprobs", "valid integer"),
        ({"logprobs": True}, "logprobs", "valid integer"),
        ({"temperature": "0.5"}, "temperature", "valid number"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"stop": "x" * (MAX_STOP_CHARS + 1)}, "stop", f"at most {MAX_STOP_CHARS} characters"),
        ({"stop": ["x"] * (MAX_STOPS + 1)}, "stop", f"at most {MAX_STOPS} items"),
        ({"stop": 5}, "stop", "must be a string or a list of strings"),
        ({"prompt": [[1]] * 2049}, "prompt", "at most 2048 items"),
        ({"prompt": [1, "a"]}, "prompt", "prompt.token_ids.1: Input should be a valid integer"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options",
            "valid boolean",
        ),
        ({"echo": True, "logprobs": 1}, "logprobs", "not supported"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": [10**9]}, "prompt", "vocab_size=49152"),
    ],
)
def test_completion_parameter_errors(
    http: httpx.Client, extra: dict, param: str, fragment: str
) -> None:
    body = {"prompt": "Hello", "max_tokens": 2, **extra}
    assert_error(http.post("/v1/completions", json=body), 400, fragment, param=param)


@pytest.mark.parametrize(
    "extra, param, fragment",
    [
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "role"),
        ({"top_logprobs": 2}, "top_logprobs", "logprobs=true"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "greater than or equal to 1"),
        (
            {"messages": [{"role": "user", "content": None}]},
            "messages",
            "messages.0.content: a user message needs content",
        ),
        ({"messages": [{"role": "system"}]}, "messages", "a system message needs content"),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "messages",
            "must be a string or a list of text parts",
        ),
        ({"logprobs": "yes"}, "logprobs", "valid boolean"),
        ({"top_logprobs": True, "logprobs": True}, "top_logprobs", "valid integer"),
    ],
)
def test_chat_parameter_errors(http: httpx.Client, extra: dict, param: str, fragment: str) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}
    assert_error(http.post("/v1/chat/completions", json=body), 400, fragment, param=param)


def tool(name: str, parameters: object = None) -> dict:
    function = {"name": name} if parameters is None else {"name": name, "parameters": parameters}
    return {"type": "function", "function": function}


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def json_schema_format(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


TAG_ITEM = {"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}

CONSTRAINT_ERRORS = [
    # (body fields, param, a fragment of the message), on both endpoints
    ({"response_format": json_schema_format({"type": "bogus"})}, "response_format", "bogus"),
    (
        {"response_format": json_schema_format({"type": "object"}) | {"json_schema": {}}},
        "response_format",
        "json_schema.name: Field required",
    ),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema or structural_tag"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", "either format or"),
    (
        {"response_format": {"type": "structural_tag", "structures": [TAG_ITEM]}},
        "response_format",
        "structures need triggers",
    ),
    (
        {"response_format": {"type": "structural_tag", "format": {"type": "bogus"}}},
        "response_format",
        "response_format (structural_tag) is invalid: Invalid structural tag error: Format type not",
    ),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "is invalid"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex", "not closed"),
    ({"structured_outputs": {"grammar": "root ::= nowhere"}}, "structured_outputs.grammar", ""),
    ({"structured_outputs": {}}, "structured_outputs", "exactly one of"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "got regex"),
    ({"structured_outputs": {"grammer": "x"}}, "structured_outputs", "grammer"),
    (
        {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
        "response_format",
        "not both",
    ),
    ({"guided_json": {"type": "object"}}, "guided_json", "use structured_outputs.json"),
    ({"guided_regex": "a+"}, "guided_regex", "use structured_outputs.regex"),
    ({"guided_choice": ["a"]}, "guided_choice", "use structured_outputs.choice"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar", "use structured_outputs.grammar"),
    ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend", "xgrammar"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "disable_any_whitespace"),
    ({"guided_json_object": True}, "guided_json_object", "json_object"),
]


@pytest.mark.parametrize("extra, param, fragment", CONSTRAINT_ERRORS)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_constraint_errors(
    http: httpx.Client, path: str, extra: dict, param: str, fragment: str
) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    response = http.post(path, json={**body, "max_tokens": 2, **extra})
    assert_error(response, 400, fragment, param=param)


WEATHER = tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})


@pytest.mark.parametrize(
    "extra, param, fragment",
    [
        ({"tools": [tool("bad name!")]}, "tools", "tools.0.function.name"),
        ({"tools": [tool("x" * 65)]}, "tools", "tools.0.function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "given twice"),
        ({"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools", "tools.0.type"),
        ({"tools": [tool("f", "not a schema")]}, "tools", "valid dictionary"),
        ({"tools": [WEATHER], "tool_choice": named("get_time")}, "tool_choice", "get_time"),
        ({"tool_choice": named("get_time")}, "tool_choice", "not among the tools (none)"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
        (
            {"tools": [tool("f", {"type": "bogus"})], "tool_choice": named("f")},
            "tools",
            "the function's parameters",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "tool_choice",
            "cannot be combined",
        ),
        ({"messages": [{"role": "tool", "content": "21"}]}, "messages", "tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages",
            "only an assistant message has tool_calls",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{x"},
                            }
                        ],
                    }
                ]
            },
            "messages",
            "must be a JSON text",
        ),
    ],
)
def test_tool_errors(http: httpx.Client, extra: dict, param: str, fragment: str) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}
    assert_error(http.post("/v1/chat/completions", json=body), 400, fragment, param=param)


def test_invalid_json_is_400(http: httpx.Client) -> None:
    response = http.post(
        "/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert_error(response, 400, "not valid JSON")


def test_prompt_longer_than_the_context(http: httpx.Client) -> None:
    error = assert_error(
        http.post("/v1/completions", json={"prompt": [100] * 1100}),
        400,
        "1100",
        "1024",
        param="prompt",
    )
    assert error["code"] == "context_length_exceeded"


def test_prompt_plus_max_tokens_over_the_context(http: httpx.Client) -> None:
    body = {"prompt": [100] * 1000, "max_tokens": 100}
    error = assert_error(
        http.post("/v1/completions", json=body),
        400,
        "1024",
        "1100",
        "1000",
        "100 for the completion",
        param="max_tokens",
    )
    assert error["code"] == "context_length_exceeded"


def test_chat_over_the_context_names_messages(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "hello " * 1100}]}
    assert_error(http.post("/v1/chat/completions", json=body), 400, "1024", param="messages")


def test_unknown_model_is_404(http: httpx.Client) -> None:
    for path, body in (
        ("/v1/completions", {"prompt": "Hi"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ):
        error = assert_error(
            http.post(path, json={**body, "model": "gpt-17"}),
            404,
            "The model `gpt-17` does not exist",
            param="model",
        )
        assert error["code"] == "model_not_found"


def test_assistant_content_may_be_null(http: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "Hi again"},
    ]
    response = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert response.status_code == 200, response.text


# Every route but /health: the service routes and the docs too (the schema tells an attacker
# what to send; /metrics and /tokenize give away load and prompts' sizes).
KEYED_ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/anything", None),
    ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    ),
    ("POST", "/tokenize", {"prompt": "Hi"}),
    ("POST", "/detokenize", {"tokens": [1]}),
    ("GET", "/metrics", None),
    ("GET", "/docs", None),
    ("GET", "/redoc", None),
    ("GET", "/openapi.json", None),
    ("GET", "/version", None),
    ("GET", "/no-such-route", None),
]


@pytest.mark.parametrize("method, path, body", KEYED_ROUTES, ids=[r[1] for r in KEYED_ROUTES])
def test_api_key_covers_every_route_but_health(
    default_server: ServerProcess, method: str, path: str, body: dict | None
) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": API_KEY},
        {"Authorization": f"Basic {API_KEY}"},
        {"Authorization": f"Bearer {API_KEY}x"},
    ):
        response = httpx.request(
            method, default_server.url(path), json=body, headers=headers, timeout=120
        )
        error = assert_error(response, 401, "API key")
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    # RFC 7235: the scheme is case-insensitive
    for scheme in ("Bearer", "bearer", "BEARER"):
        response = httpx.request(
            method,
            default_server.url(path),
            json=body,
            timeout=120,
            headers={"Authorization": f"{scheme} {API_KEY}"},
        )
        assert response.status_code != 401, (scheme, response.text)


def test_health_needs_no_key(default_server: ServerProcess) -> None:
    assert httpx.get(default_server.url("/health")).status_code == 200


SURROGATE = "\\ud800"  # JSON's escape of a lone surrogate, spelled out in the raw body


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", '{"prompt": "Hi %s"}', "prompt"),
        ("/v1/completions", '{"prompt": ["Hi", "%s"]}', "prompt"),
        ("/v1/completions", '{"prompt": "Hi", "stop": "%s"}', "stop"),
        ("/v1/completions", '{"prompt": "Hi", "stop": ["a", "%s"]}', "stop"),
        ("/v1/completions", '{"prompt": "Hi", "cache_salt": "%s"}', "cache_salt"),
        ("/v1/completions", '{"prompt": "Hi", "model": "%s"}', "model"),
        ("/v1/completions", '{"prompt": "Hi", "user": "%s"}', "user"),
        ("/v1/completions", '{"prompt": "Hi", "logit_bias": {"%s": 1}}', "logit_bias"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "%s"}]}', "messages"),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": "%s"}]}]}',
            "messages",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "Hi", "name": "%s"}]}',
            "messages",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "Hi"}], "stop": "%s"}',
            "stop",
        ),
        ("/tokenize", '{"prompt": "%s"}', "prompt"),
        ("/tokenize", '{"messages": [{"role": "user", "content": "%s"}]}', "messages"),
        ("/detokenize", '{"tokens": [1], "model": "%s"}', "model"),
    ],
)
def test_lone_surrogate_is_a_400_naming_the_field(
    http: httpx.Client, path: str, body: str, param: str
) -> None:
    data = (body % SURROGATE).encode()
    response = http.post(path, content=data, headers={"Content-Type": "application/json"})
    error = assert_error(response, 400, param=param)
    assert "surrogate" in error["message"] or "unicode" in error["message"], error


def test_body_over_the_limit_is_413(http: httpx.Client) -> None:
    body = {"prompt": "a " * 60_000}  # 120 kB > 100 kB
    assert_error(http.post("/v1/completions", json=body), 413, "100000 bytes")

    def chunks():  # no Content-Length: the limit is counted while reading
        for _ in range(30):
            yield b" " * 5000

    response = http.post(
        "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_error(response, 413, "100000 bytes")


def test_unknown_route_is_404_in_openai_shape(http: httpx.Client) -> None:
    assert_error(http.get("/v1/nothing-here"), 404, "Not Found")


def test_request_id_is_echoed(http: httpx.Client) -> None:
    response = http.post(
        "/v1/completions",
        json={"prompt": "Hi", "max_tokens": 1},
        headers={"X-Request-Id": "my-request-7"},
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "my-request-7"
    assert response.json()["id"] == "cmpl-my-request-7"
