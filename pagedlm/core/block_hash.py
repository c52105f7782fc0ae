"""Prefix-cache block hashes: sha256 over a canonical, unambiguous encoding of one block.

    hash_i = sha256(hash_{i-1} | u32 num_tokens | i64 token_ids[num_tokens] | u32 len(extra) | extra)
    hash_{-1} = ROOT_BLOCK_HASH

integers little-endian, fixed width. Every field has a fixed width or a fixed-width length in front
of it, so the encoding is injective: two different (parent, tokens, extra) triples never share one,
and equal hashes mean equal prefixes unless sha256 itself collides. Python's built-in `hash()` is not
collision resistant (`hash(-1) == hash(-2)`, ints wrap modulo 2**61 - 1, and 64 bits fall to a
birthday search), so a client could craft a prompt whose block hash matches another user's prefix
and read or poison that KV; it also differs between processes (`hash(None)` is address based before
Python 3.12). The digests here are the same in every process and on every host.

A request's `cache_salt` (vLLM's) is an extra key of its FIRST block only; every later block chains
from that hash, so two requests share cached blocks only if their salts are equal (None included).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes  # a 32-byte sha256 digest
ROOT_BLOCK_HASH: BlockHash = hashlib.sha256(b"pagedlm prefix-cache block hash v1").digest()
_EXTRA_LEN = struct.Struct("<I")
_CACHE_SALT_PREFIX = b"salt:"  # tags the salt apart from any other kind of extra key


@functools.cache
def _tokens_struct(num_tokens: int) -> struct.Struct:
    """u32 count, then the token ids as i64 (one Struct per block length)."""
    return struct.Struct(f"<I{num_tokens}q")


def encode_block(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: bytes = b""
) -> bytes:
    """The bytes `hash_block` digests; parent None is the first block (the root)."""
    parent = ROOT_BLOCK_HASH if parent is None else parent
    if len(parent) != len(ROOT_BLOCK_HASH):
        raise ValueError(
            f"parent must be a {len(ROOT_BLOCK_HASH)}-byte block hash, got {len(parent)} bytes"
        )
    try:
        tokens = _tokens_struct(len(token_ids)).pack(len(token_ids), *token_ids)
    except struct.error as exc:
        raise ValueError(f"token_ids must be integers in [-2**63, 2**63): {exc}") from exc
    return b"".join((parent, tokens, _EXTRA_LEN.pack(len(extra_keys)), extra_keys))


def hash_block(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: bytes = b""
) -> BlockHash:
    """The hash of a full block given its parent's hash (None for the first block), its token ids
    and `extra_keys` (bytes that must also match for a hit, e.g. an adapter or a cache salt)."""
    return hashlib.sha256(encode_block(parent, token_ids, extra_keys)).digest()


def cache_salt_keys(cache_salt: str | None) -> bytes:
    """The first block's extra keys for a request's cache salt (b"" when unsalted)."""
    return b"" if cache_salt is None else _CACHE_SALT_PREFIX + cache_salt.encode("utf-8")
