"""Prefix-cache block hashes (core/block_hash.py): sha256 chains over an injective encoding, equal in
every process, with no collision where Python's tuple hash had one; prefix hits end to end."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_hf_models import hf_greedy, random_prompts, save_tiny_model

from pagedlm.core.block_hash import ROOT_BLOCK_HASH, encode_block, hash_block
from pagedlm.core.kv_cache_manager import KVCacheManager

from .fakes import make_request

BLOCK_SIZE = 4
INT64 = st.integers(-(2**63), 2**63 - 1)
DIGESTS = st.binary(min_size=32, max_size=32)


def _block_hashes(
    kv: KVCacheManager, prompt: list[int], cache_salt: str | None = None
) -> list[bytes]:
    """The chain over every full block but the one holding the last token (what a lookup hashes)."""
    request = make_request("probe", prompt)
    request.cache_salt = cache_salt
    kv.get_computed_blocks(request)
    return list(request.block_hashes)


def _decode(data: bytes) -> tuple[bytes, list[int], bytes]:
    """The layout's inverse, written apart from the encoder: a left inverse proves injectivity."""
    parent, num_tokens = data[:32], int.from_bytes(data[32:36], "little")
    offset = 36 + 8 * num_tokens
    tokens = [int.from_bytes(data[i : i + 8], "little", signed=True) for i in range(36, offset, 8)]
    num_extra = int.from_bytes(data[offset : offset + 4], "little")
    extra = data[offset + 4 :]
    assert len(extra) == num_extra, "trailing or missing bytes"
    return parent, tokens, extra


def test_digest_follows_the_documented_layout():
    tokens = [1, 2, -3, 2**40]
    layout = (
        hashlib.sha256(b"pagedlm prefix-cache block hash v1").digest()
        + (4).to_bytes(4, "little")
        + b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)
        + bytes(4)
    )
    digest = hash_block(None, tokens)
    assert isinstance(digest, bytes) and len(digest) == 32
    assert digest == hashlib.sha256(layout).digest()
    assert (
        hash_block(digest, [5])
        == hashlib.sha256(
            digest + (1).to_bytes(4, "little") + (5).to_bytes(8, "little") + bytes(4)
        ).digest()
    )


@given(
    parent=st.none() | DIGESTS, tokens=st.lists(INT64, max_size=20), extra=st.binary(max_size=40)
)
def test_encoding_decodes_back(parent: bytes | None, tokens: list[int], extra: bytes):
    assert _decode(encode_block(parent, tokens, extra)) == (
        parent or ROOT_BLOCK_HASH,
        tokens,
        extra,
    )


@given(
    a=st.tuples(DIGESTS, st.lists(st.integers(0, 300), max_size=6), st.binary(max_size=9)),
    b=st.tuples(DIGESTS, st.lists(st.integers(0, 300), max_size=6), st.binary(max_size=9)),
)
def test_different_inputs_never_share_an_encoding_or_a_hash(a, b):
    if a != b:
        assert encode_block(*a) != encode_block(*b)
        assert hash_block(*a) != hash_block(*b)


def test_near_ambiguous_inputs_differ():
    """Splits a concatenating encoding would confuse: token boundaries, tokens vs extra keys."""
    two = (2).to_bytes(8, "little")
    pairs = [
        ((None, [1, 2], b""), (None, [1], two)),
        ((None, [12, 3], b""), (None, [1, 23], b"")),
        ((None, [256], b""), (None, [1, 0], b"")),
        ((None, [], b""), (None, [0], b"")),
        ((None, [1], b""), (None, [1], b"\0")),
    ]
    for a, b in pairs:
        assert hash_block(*a) != hash_block(*b), (a, b)


def test_extra_keys_are_part_of_the_key():
    digests = {hash_block(None, [1, 2], extra) for extra in (b"", b"lora-1", b"lora-2")}
    assert len(digests) == 3


def test_cache_salt_keys_the_first_block_and_so_the_whole_chain():
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    prompt = list(range(3 * BLOCK_SIZE + 1))
    chains = {salt: _block_hashes(kv, prompt, salt) for salt in (None, "tenant-a", "tenant-b")}
    assert _block_hashes(kv, prompt, "tenant-a") == chains["tenant-a"]
    for first, second in itertools.combinations(chains.values(), 2):
        assert all(a != b for a, b in zip(first, second))
    salted = chains["tenant-a"]
    assert salted[0] == hash_block(None, prompt[:BLOCK_SIZE], b"salt:tenant-a")
    # no salt past block 0: the later blocks carry it through their parent only
    assert salted[1] == hash_block(salted[0], prompt[BLOCK_SIZE : 2 * BLOCK_SIZE])
    assert chains[None][0] == hash_block(None, prompt[:BLOCK_SIZE])


@pytest.mark.parametrize("lookup_salt, num_hit", [("a", 2 * BLOCK_SIZE), ("b", 0), (None, 0)])
def test_salted_blocks_hit_only_for_the_same_salt(lookup_salt: str | None, num_hit: int):
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    prompt = list(range(2 * BLOCK_SIZE + 1))
    owner = make_request("owner", prompt)
    owner.cache_salt = "a"
    assert kv.allocate_slots(owner, owner.num_tokens, []) is not None  # registers 2 full blocks
    probe = make_request("probe", prompt)
    probe.cache_salt = lookup_salt
    assert kv.get_computed_blocks(probe)[1] == num_hit


def test_chain_changes_from_the_first_differing_block_on():
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    prompt = list(range(4 * BLOCK_SIZE + 1))
    base = _block_hashes(kv, prompt)
    assert len(base) == 4 and len(set(base)) == 4
    for pos in range(4 * BLOCK_SIZE):
        changed = list(prompt)
        changed[pos] += 100
        hashes = _block_hashes(kv, changed)
        first = pos // BLOCK_SIZE
        assert hashes[:first] == base[:first]
        assert all(h != b for h, b in zip(hashes[first:], base[first:])), pos


def test_equal_prompts_hash_equally_in_two_managers_and_by_block_size():
    prompt = list(range(40, 57))
    first, second = (KVCacheManager(8, BLOCK_SIZE, True) for _ in range(2))
    assert _block_hashes(first, prompt) == _block_hashes(second, prompt)
    wider = _block_hashes(KVCacheManager(8, 2 * BLOCK_SIZE, True), prompt)
    assert len(wider) == 2 and not set(wider) & set(_block_hashes(first, prompt))


# The child loads block_hash.py by path (no torch import: fast) and chains it by hand.
_CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("block_hash", sys.argv[1])
block_hash = importlib.util.module_from_spec(spec)
spec.loader.exec_module(block_hash)
tokens, parent, chain = json.loads(sys.argv[2]), None, []
for start in range(0, len(tokens) - 4, 4):
    parent = block_hash.hash_block(parent, tokens[start:start + 4])
    chain.append(parent.hex())
print(json.dumps(chain))
"""


def test_hashes_are_equal_across_processes_whatever_the_hash_seed():
    """Python's hash() of str, bytes (and None before 3.12) changes with the process; these must not."""
    prompt = list(range(900, 913))
    expected = [h.hex() for h in _block_hashes(KVCacheManager(8, 4, True), prompt)]
    assert len(expected) == 3
    source = str(Path(__file__).resolve().parents[2] / "pagedlm" / "core" / "block_hash.py")
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, source, json.dumps(prompt)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(done.stdout) == expected


@pytest.mark.parametrize(
    "victim, attacker", [([-1] * 4, [-2] * 4), ([0, 1, 2, 3], [2**61 - 1, 1, 2, 3])]
)
def test_old_tuple_hash_collisions_are_no_hit(victim: list[int], attacker: list[int]):
    """CPython's hash(-1) == hash(-2) and ints hash modulo 2**61 - 1, so the old key
    hash((parent, tuple(tokens), extras)) collided for these blocks; now the attacker's prompt misses.
    (The engine rejects such ids; a collision of in-vocabulary ids needs a ~2**32 birthday search.)"""
    assert hash((None, tuple(victim), None)) == hash((None, tuple(attacker), None))
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    owner = make_request("victim", victim + [7])
    hits, _ = kv.get_computed_blocks(owner)
    assert kv.allocate_slots(owner, owner.num_tokens, hits) is not None  # registers the full block
    assert kv.get_computed_blocks(make_request("attacker", attacker + [7]))[1] == 0
    assert (
        kv.get_computed_blocks(make_request("again", victim + [7]))[1] == BLOCK_SIZE
    )  # the control


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="token_ids"):
        hash_block(None, [2**63])
    with pytest.raises(ValueError, match="parent"):
        hash_block(b"short", [1])


def test_prefix_hits_end_to_end_on_the_tiny_model(tmp_path: Path):
    """Two blocks of 16 shared: the second prompt hits them and still matches transformers; a prompt
    differing only in its first token hits nothing (the chain carries the change)."""
    from pagedlm import LLM, SamplingParams

    model = save_tiny_model(tmp_path, "llama")
    (prefix,) = random_prompts(1, 32, 32, seed=3)
    prompts = [prefix + [5, 6, 7], prefix + [9, 10], [(prefix[0] + 1) % 256] + prefix[1:] + [9, 10]]
    llm = LLM(
        str(tmp_path),
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=64,
        num_gpu_blocks_override=32,
        block_size=16,
        device="cpu",
    )
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outputs = [llm.generate([prompt], params, use_tqdm=False)[0] for prompt in prompts]
    assert [o.num_cached_tokens for o in outputs] == [0, 32, 0]
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(model, prompts, 4)
    assert llm.get_stats().prefix_cache_hits == 32


def test_cache_salt_isolates_prefix_hits_on_the_tiny_model(tmp_path: Path):
    """Greedy outputs are equal whatever the salt; only a request with the same salt hits the two
    cached blocks (16 tokens each) of a prompt, and an unsalted one hits only unsalted blocks."""
    from pagedlm import LLM, SamplingParams

    save_tiny_model(tmp_path, "llama")
    (prompt,) = random_prompts(1, 40, 40, seed=4)
    llm = LLM(
        str(tmp_path),
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=64,
        num_gpu_blocks_override=32,
        block_size=16,
        device="cpu",
    )
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    salts = ["a", "a", "b", None, None]
    outputs = [
        llm.generate({"prompt_token_ids": prompt, "cache_salt": salt}, params, use_tqdm=False)[0]
        for salt in salts
    ]
    assert [o.num_cached_tokens for o in outputs] == [0, 32, 0, 0, 32]
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) == 1
