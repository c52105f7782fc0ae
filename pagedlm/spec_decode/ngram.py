"""The n-gram proposer (prompt lookup), on the host, vectorised over the batch with numpy.

For each request: the longest n in [min_n, max_n] such that the last n tokens occurred earlier in
its row, and of those occurrences the most recent. The drafts are the k tokens after it, copied
as LZ77 copies (distance d = from that occurrence's end to the row's end): where the copy runs
into the row's end it continues with the tokens it has just copied, so a periodic tail ("a b a b")
drafts its period k times over instead of stopping at the row's end. A request with no match
drafts nothing.

How: one pass over [B, W] finds the candidate ends (the positions holding the row's last token,
before the last one); each further token of the suffix is compared at the surviving candidates
only, so the cost is one pass over the rows plus max_n passes over the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NO_DRAFT = -1  # pads draft rows, as vLLM's PLACEHOLDER_TOKEN_ID


@dataclass(frozen=True, slots=True)
class NgramDrafts:
    token_ids: np.ndarray  # [B, k] int64, NO_DRAFT where a request drafts nothing
    num_drafts: np.ndarray  # [B] int64: k or 0


def propose_ngram(
    token_ids: np.ndarray,
    num_tokens: np.ndarray,
    rows: np.ndarray,
    k: int,
    min_n: int,
    max_n: int,
) -> NgramDrafts:
    """token_ids [R, W] int (a table of token rows), num_tokens [R] (each row's known tokens),
    rows [B] (the requests' rows) -> k drafts for each of the B requests."""
    lengths = num_tokens[rows].astype(np.int64)  # [B]
    width = int(lengths.max(initial=0))
    if width == 0:
        return NgramDrafts(
            np.full((len(rows), k), NO_DRAFT, np.int64), np.zeros(len(rows), np.int64)
        )
    batch = np.arange(len(rows))
    table = token_ids[rows, :width]  # [B, W]: one gather of the rows used
    last = table[batch, np.maximum(lengths - 1, 0)]  # [B]
    # candidate ends e: table[e] == the last token, e <= length - 2 (an earlier occurrence);
    # flatnonzero and divmod: 2-D nonzero costs 30x more
    cand_b, cand_e = np.divmod(np.flatnonzero(table == last[:, None]), width)  # [C] each
    before_last = cand_e < lengths[cand_b] - 1
    cand_b, cand_e = cand_b[before_last], cand_e[before_last]
    matched = _matched_lengths(table, lengths, cand_b, cand_e, max_n)  # [C]
    keep = matched >= min_n
    cand_b, cand_e, matched = cand_b[keep], cand_e[keep], matched[keep]
    best = np.full(len(rows), -1, dtype=np.int64)  # [B]: n * (W + 1) + e of the best match
    np.maximum.at(best, cand_b, matched * (width + 1) + cand_e)
    found = best >= 0
    end = best % (width + 1)  # [B]: the last position of the chosen occurrence
    distance = np.maximum(lengths - 1 - end, 1)  # [B]: d >= 1 where found
    offsets = np.arange(k)[None, :] % distance[:, None]  # [B, k]
    source = np.where(found[:, None], end[:, None] + 1 + offsets, 0)  # [B, k]
    drafts = np.where(found[:, None], table[batch[:, None], source], NO_DRAFT).astype(np.int64)
    return NgramDrafts(drafts, np.where(found, k, 0).astype(np.int64))


def _matched_lengths(
    table: np.ndarray, lengths: np.ndarray, cand_b: np.ndarray, cand_e: np.ndarray, max_n: int
) -> np.ndarray:
    """[C]: how many tokens ending at each candidate end match the row's last tokens, up to
    max_n (at least 1: the candidates hold the last token)."""
    matched = np.ones(len(cand_b), dtype=np.int64)
    alive = np.ones(len(cand_b), dtype=bool)
    for back in range(1, max_n):
        reach = alive & (cand_e >= back)
        at = np.where(reach, cand_e - back, 0)
        suffix_at = np.where(reach, lengths[cand_b] - 1 - back, 0)
        alive = reach & (table[cand_b, at] == table[cand_b, suffix_at])
        matched += alive
        if not alive.any():
            break
    return matched
