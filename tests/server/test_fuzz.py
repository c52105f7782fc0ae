"""Schemathesis against the server's OpenAPI schema for the two generation endpoints and
/tokenize (valid and invalid bodies), and hypothesis putting any JSON value into any field of a
valid body: no 5xx and no hang, then a normal request succeeds and the KV cache is empty again;
extreme valid values generate. A tiny-model server with max_model_len 48
keeps each generation short. (A killed engine core: test_faults.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from server_helpers import ServerProcess, start_server, tiny_server_args

from pagedlm.server.protocol import (
    MAX_TEMPERATURE,
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
)

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 60  # a call that takes longer counts as a hang
FUZZ_SETTINGS = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("fuzz") / "server.log"
    server = start_server(tiny_server_args(tiny_model_dir, "--max-model-len", "48"), log_path)
    yield server
    server.stop()


@pytest.mark.parametrize(
    "mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"]
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_fuzz_endpoint(server: ServerProcess, path: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(server.url("/openapi.json"))
    operation = schema[path]["POST"]

    @FUZZ_SETTINGS
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        assert_clear_answer(case.call(base_url=server.base_url, timeout=CALL_TIMEOUT_S), case.body)

    check()
    assert_serves_and_is_idle(server)


# What a schema-driven fuzzer does not send: any JSON value in any field (known or not), strings
# with lone surrogates (JSON's "\ud800"), integers past 64 bits, deep nesting.
SURROGATES = st.sampled_from(["\ud800", "\udfff", "\ud83d"])
STRINGS = st.lists(st.one_of(st.characters(), SURROGATES), max_size=8).map("".join)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | STRINGS
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STRINGS, inner, max_size=3),
    max_leaves=10,
)
# Most fields are strings or lists of them: those come first, then any value.
FIELD_VALUES = st.one_of(STRINGS, st.lists(STRINGS, max_size=3), JSON_VALUES)
VALID_BODIES = {
    "/v1/completions": (CompletionRequest, {"prompt": "Hi", "max_tokens": 2}),
    "/v1/chat/completions": (
        ChatCompletionRequest,
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    ),
    "/tokenize": (TokenizeRequest, {"prompt": "Hi"}),
}


@pytest.mark.parametrize("path", list(VALID_BODIES))
def test_any_value_in_any_field_is_answered_without_5xx(server: ServerProcess, path: str) -> None:
    model, valid = VALID_BODIES[path]
    fields = st.sampled_from([*model.model_fields, "unknown_field"])

    @settings(FUZZ_SETTINGS, max_examples=100)
    @given(changes=st.dictionaries(fields, FIELD_VALUES, min_size=1, max_size=2))
    def check(changes: dict) -> None:
        body = {**valid, **changes}
        data = json.dumps(body).encode()  # ensure_ascii: a lone surrogate goes as its escape
        response = httpx.post(
            server.url(path),
            content=data,
            timeout=CALL_TIMEOUT_S,
            headers={"Content-Type": "application/json"},
        )
        assert_clear_answer(response, body)

    check()
    assert_serves_and_is_idle(server)


def assert_clear_answer(response: httpx.Response, body: object) -> None:
    """No 5xx; an error in OpenAI's shape."""
    assert response.status_code < 500, (body, response.text[-2000:])
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def assert_serves_and_is_idle(server: ServerProcess) -> None:
    """After a fuzz run: healthy, a normal request succeeds, every KV block is back."""
    assert httpx.get(server.url("/health")).status_code == 200
    normal = httpx.post(
        server.url("/v1/completions"),
        timeout=CALL_TIMEOUT_S,
        json={"prompt": "Hi", "max_tokens": 3, "ignore_eos": True},
    )
    assert normal.status_code == 200 and normal.json()["usage"]["completion_tokens"] == 3
    server.wait_for_idle(timeout_s=30)


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": MAX_TEMPERATURE},
        {"temperature": 1e-5},
        {"min_p": 1.0},
        {"repetition_penalty": 1e-300},
        {"repetition_penalty": 1e300},
        {"top_k": 1},
        {"logit_bias": {"5": 100, "6": -100}},
        {"seed": -(2**63)},
        {"n": 128, "logprobs": 20},
        {"stop_token_ids": [0, 1, 2], "min_tokens": 3},
        {"presence_penalty": 2, "frequency_penalty": -2},
        {"top_p": 1e-300},  # rounds to 0 in float32: the sampler must still keep one token
    ],
    ids=str,
)
def test_extreme_valid_values(server: ServerProcess, extra: dict) -> None:
    """Valid values at the edges of their ranges generate, and leave the engine alive."""
    body = {"prompt": "Hi", "max_tokens": 3, "temperature": 1.0, **extra}
    response = httpx.post(server.url("/v1/completions"), json=body, timeout=CALL_TIMEOUT_S)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == body.get("n", 1)
    assert httpx.get(server.url("/health")).status_code == 200
