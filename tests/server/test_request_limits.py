"""Large requests bound their work and stall no one: a text too long for max_model_len is refused
before it is tokenized (by a lower bound on its token count that must be sound), tokenisation
runs on a pool of threads each with its own tokenizer, and four bodies at the size limit, of the
shapes that cost the most to parse, leave /health and a small request fast."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import ServerProcess, start_server, tiny_server_args
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from pagedlm.config import default_model_path
from pagedlm.engine.tokenizer import TokenCountBound, load_tokenizer, token_count_bound
from pagedlm.server.serving import APIError, tokenize_within_context
from pagedlm.server.tokenizer_pool import TokenizerPool

BODY_LIMIT = 4 * 1024 * 1024
HEALTH_BOUND_S = 1.5  # 0.4-0.8 s measured on the loaded 2-core CPU machine; over 60 s before


@pytest.fixture(scope="module")
def default_tokenizer() -> object:
    return load_tokenizer(SimpleNamespace(tokenizer=default_model_path()))


# Texts the default vocabulary covers badly: long runs of one character (the longest tokens are
# runs of '#', spaces and newlines), characters it has no token for (\x04 is dropped), emoji.
RUN_CHARS = st.sampled_from([" ", "#", "\n", "\x04", "\x00", "a", "é", "😀", "\U00040000", "-"])
TEXTS = st.one_of(
    st.text(max_size=200),
    st.lists(st.tuples(RUN_CHARS, st.integers(1, 400)), max_size=6).map(
        lambda runs: "".join(char * n for char, n in runs)
    ),
)


@pytest.fixture(scope="module")
def default_bound(default_tokenizer: object) -> TokenCountBound:
    bound = token_count_bound(default_tokenizer)
    assert bound is not None and bound.max_chars == 81  # the vocabulary's longest token
    assert "\x04" in bound.dropped  # a byte the vocabulary has no token for
    return bound


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=TEXTS)
def test_token_count_bound_is_sound(
    default_tokenizer: object, default_bound: TokenCountBound, text: str
) -> None:
    num_tokens = len(default_tokenizer.encode(text, add_special_tokens=False))
    assert num_tokens >= default_bound.min_tokens(text)


def _fast(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")


def test_no_bound_where_a_tokenizer_may_drop_characters() -> None:
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3}
    splitting = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    splitting.pre_tokenizer = pre_tokenizers.Whitespace()  # drops the spaces: 1M of them, 0 tokens
    assert token_count_bound(_fast(splitting)) is None
    fused = Tokenizer(models.BPE(vocab, [("a", "b")], unk_token="[UNK]", fuse_unk=True))
    assert token_count_bound(_fast(fused)) is None  # one [UNK] for a whole run of unknowns
    stripping = Tokenizer(models.BPE(vocab, [("a", "b")], unk_token="[UNK]"))
    stripping.normalizer = normalizers.Strip()
    assert token_count_bound(_fast(stripping)) is None
    byte_fallback = Tokenizer(
        models.BPE(
            {**vocab, **{f"<0x{b:02X}>": 4 + b for b in range(256)}},
            [("a", "b")],
            byte_fallback=True,
        )
    )
    byte_fallback.decoder = decoders.ByteFallback()
    assert token_count_bound(_fast(byte_fallback)) == TokenCountBound(6, frozenset())


class RefusingTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise AssertionError("tokenized a text the bound refuses")


def test_a_text_too_long_for_the_context_is_refused_before_tokenizing() -> None:
    ctx = SimpleNamespace(token_bound=TokenCountBound(4, frozenset("\x04")), max_model_len=10)
    with pytest.raises(APIError) as caught:
        tokenize_within_context(ctx, RefusingTokenizer(), "x" * 37, "prompt")  # >= 10 tokens
    error = caught.value
    assert (error.status, error.param, error.code) == (400, "prompt", "context_length_exceeded")
    assert "37 characters: at least 10 tokens" in error.message and "max_model_len" in error.message
    # 36 characters may be 9 tokens, and the dropped \x04 count for none: both are tokenized
    for text in ("x" * 36, "x" * 36 + "\x04" * 100):
        with pytest.raises(AssertionError, match="tokenized"):
            tokenize_within_context(ctx, RefusingTokenizer(), text, "prompt")


def test_the_pool_runs_in_parallel_with_a_tokenizer_per_thread() -> None:
    """Two jobs that each wait for the other finish only on two threads at once; each thread has
    its own copy of the tokenizer (a fast tokenizer is not safe to share between threads)."""
    original = SimpleNamespace(vocab={"a": 1})
    pool = TokenizerPool(original, num_threads=2)
    barrier = threading.Barrier(2, timeout=10)

    def job(tokenizer: SimpleNamespace) -> tuple[int, int]:
        barrier.wait()
        assert tokenizer.vocab == {"a": 1} and tokenizer is not original
        return threading.get_ident(), id(tokenizer)

    async def both() -> list[tuple[int, int]]:
        return list(await asyncio.gather(*(pool.run_with_tokenizer(job) for _ in range(2))))

    (thread_a, tok_a), (thread_b, tok_b) = asyncio.run(both())
    assert thread_a != thread_b and tok_a != tok_b


def test_every_thread_copies_its_tokenizer_before_the_first_request() -> None:
    """The copies are made at start-up, not in the first burst of requests."""
    copies: list[int] = []

    class CountedTokenizer:
        def __deepcopy__(self, memo: dict) -> CountedTokenizer:
            copies.append(threading.get_ident())
            return CountedTokenizer()

    pool = TokenizerPool(CountedTokenizer(), num_threads=3)
    deadline = time.monotonic() + 10
    while len(copies) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(set(copies)) == 3  # three threads, one copy each, no request sent
    assert asyncio.run(pool.run(lambda: 7)) == 7


# ---- a live server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("limits") / "server.log"
    server = start_server(
        tiny_server_args(
            tiny_model_dir, "--max-model-len", "512", "--max-request-body-bytes", str(BODY_LIMIT)
        ),
        log_path,
    )
    yield server
    server.stop()


def _filled(make: object, item_bytes: int) -> bytes:
    """make(n) as compact JSON, with n chosen to come close to the body limit."""
    return json.dumps(make((BODY_LIMIT - 200) // item_bytes), separators=(",", ":")).encode()


# The shapes that cost the most CPU per byte to parse and validate, and a text prompt.
LARGE_BODIES = {
    "token_ids": ("/v1/completions", lambda n: {"prompt": [1] * n}, 2),
    "token_id_lists": ("/v1/completions", lambda n: {"prompt": [[1]] * n}, 4),
    "logit_bias": (
        "/v1/completions",
        lambda n: {"prompt": "x", "logit_bias": {str(i): 1 for i in range(n)}},
        12,
    ),
    "messages": (
        "/v1/chat/completions",
        lambda n: {"messages": [{"role": "user", "content": "a"}] * n},
        31,
    ),
    "tokenize": ("/tokenize", lambda n: {"prompt": "hello world " * n}, 12),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "shapes",
    [
        ["token_ids", "token_id_lists", "logit_bias", "messages"],
        ["tokenize", "messages", "token_id_lists", "token_ids"],
    ],
    ids=["parse", "tokenize"],
)
def test_four_large_bodies_stall_neither_health_nor_a_small_request(
    server: ServerProcess, shapes: list[str]
) -> None:
    bodies = {shape: _filled(LARGE_BODIES[shape][1], LARGE_BODIES[shape][2]) for shape in shapes}
    answers: dict[str, httpx.Response] = {}

    def post(shape: str) -> None:
        answers[shape] = httpx.post(
            server.url(LARGE_BODIES[shape][0]),
            content=bodies[shape],
            headers={"Content-Type": "application/json"},
            timeout=300,
        )

    senders = [threading.Thread(target=post, args=(shape,)) for shape in shapes]
    latencies: list[float] = []
    small_request_s = None
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        client.get("/health")  # connected before the bodies arrive
        for sender in senders:
            sender.start()
        while any(sender.is_alive() for sender in senders):
            sent = time.monotonic()
            assert client.get("/health").status_code == 200
            latencies.append(time.monotonic() - sent)
            if small_request_s is None:
                small = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
                assert small.status_code == 200, small.text
                small_request_s = time.monotonic() - sent - latencies[-1]
            time.sleep(0.02)
    for sender in senders:
        sender.join()
    for shape in shapes:  # each refused, with its reason
        assert answers[shape].status_code == 400, (shape, answers[shape].text[:300])
    assert len(latencies) >= 5, "the bodies were handled before /health was asked"
    assert max(latencies) < HEALTH_BOUND_S, f"/health took up to {max(latencies):.2f} s"
    assert small_request_s < 2 * HEALTH_BOUND_S, f"a small request took {small_request_s:.2f} s"
