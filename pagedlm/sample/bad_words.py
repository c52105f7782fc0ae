"""Bad words (vLLM semantics): a one-token bad word is always banned; the last token of a longer
one is banned when the row's latest output tokens equal the word's other tokens.

Matching runs on the device against each row's last `width` output tokens, which the device
keeps itself (the sampled ids are appended there in stream order), so it is exact under async
scheduling, where the host learns a step's tokens a step late. Host tables per row: each word's
prefix right-aligned in `width` columns (WILDCARD to its left) and its last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedlm.sample.tables import upload

NO_TOKEN = -1  # history before the first output token
WILDCARD = -2  # prefix column left of a word's prefix: matches anything
NEVER = -3  # prefix of a padding word: never matches


@dataclass(slots=True)
class BadWords:
    index: torch.Tensor | None  # [M] int64: positions in the batch; None: all rows
    rows: torch.Tensor  # [M] int64: persistent rows (to record the sampled tokens)
    history: torch.Tensor  # [M, H] int64: the rows' last H output tokens
    prefixes: torch.Tensor  # [M, S, H] int64
    last_ids: torch.Tensor  # [M, S] int64


def apply_bad_words(
    logits: torch.Tensor, history: torch.Tensor, prefixes: torch.Tensor, last_ids: torch.Tensor
) -> torch.Tensor:
    """logits [M, V] (in place): -inf at the last token of every word whose prefix matches."""
    matches = ((prefixes == history[:, None, :]) | (prefixes == WILDCARD)).all(dim=-1)  # [M, S]
    penalty = torch.zeros(matches.shape, dtype=logits.dtype, device=logits.device)
    return logits.scatter_add_(1, last_ids, penalty.masked_fill_(matches, float("-inf")))


class BadWordsTables:
    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        # H >= 1, so a padding word's prefix can say NEVER.
        self.prefixes_np = np.full((num_rows, 1, 1), NEVER, dtype=np.int64)  # [rows, S, H]
        self.last_ids_np = np.zeros((num_rows, 1), dtype=np.int64)  # [rows, S]
        self.num_words_np = np.zeros(num_rows, dtype=np.int64)  # [rows]
        self.history = torch.full(
            (num_rows, 1), NO_TOKEN, dtype=torch.int64, device=device
        )  # [rows, H]

    @property
    def width(self) -> int:
        return self.prefixes_np.shape[2]

    def set_row(
        self, row: int, words: Sequence[Sequence[int]], output_token_ids: Sequence[int]
    ) -> bool:
        """Store the row's words and its output history; returns whether it has any word."""
        words = [list(word) for word in words]
        empty = [w for w in words if not w]
        if empty:
            raise ValueError(
                f"bad_words_token_ids must be non-empty lists of token ids, got {words[:3]}"
            )
        assert all(0 <= t < self.vocab_size for w in words for t in w), (
            f"bad_words_token_ids {words[:3]} outside [0, {self.vocab_size}) (checked at the engine "
            "boundary: SamplingParams.check_vocab)"
        )
        self.num_words_np[row] = len(words)
        if not words:
            return False
        self._grow(len(words), max(len(w) for w in words) - 1)
        width = self.width
        self.prefixes_np[row] = NEVER
        self.last_ids_np[row] = 0
        for s, word in enumerate(words):
            self.prefixes_np[row, s, : width - len(word) + 1] = WILDCARD
            self.prefixes_np[row, s, width - len(word) + 1 :] = word[:-1]
            self.last_ids_np[row, s] = word[-1]
        recent = list(output_token_ids)[-width:]
        history_np = np.full(width, NO_TOKEN, dtype=np.int64)
        history_np[width - len(recent) :] = recent
        self.history[row] = upload(history_np, self.device)
        return True

    def batch(
        self,
        index: torch.Tensor | None,
        rows: torch.Tensor,
        rows_np: np.ndarray,
        drafts: torch.Tensor | None = None,
    ) -> BadWords:
        """The words of rows_np [M] (all with words) and their histories, on the device.
        drafts [M, K] (speculative verification): the drafts before each row's position,
        NO_TOKEN after them; a row's history then ends with them."""
        num_words = int(self.num_words_np[rows_np].max())
        prefixes_np = self.prefixes_np[rows_np, :num_words]  # [M, S, H]
        last_ids_np = self.last_ids_np[rows_np, :num_words]  # [M, S]
        history = self.history.index_select(0, rows)  # [M, H]
        if drafts is not None:
            history = _append(history, drafts)
        return BadWords(
            index=index,
            rows=rows,
            history=history,
            prefixes=upload(prefixes_np, self.device),
            last_ids=upload(last_ids_np, self.device),
        )

    def record(self, rows: torch.Tensor, sampled_token_ids: torch.Tensor) -> None:
        """Append the tokens just sampled: rows [M] int64 (distinct), sampled_token_ids [M]."""
        shifted = torch.cat(
            [self.history.index_select(0, rows)[:, 1:], sampled_token_ids[:, None]], dim=1
        )  # [M, H]
        self.history.index_copy_(0, rows, shifted)

    def record_emitted(self, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Append what verification steps emitted: rows [M] int64 (distinct), token_ids
        [M, K + 1] int64, NO_TOKEN past each row's emitted ones."""
        self.history.index_copy_(0, rows, _append(self.history.index_select(0, rows), token_ids))

    def _grow(self, num_words: int, width: int) -> None:
        """Room for num_words words per row and prefixes of `width` tokens: new prefix columns
        on the left (WILDCARD, or NEVER in padding words), new words as padding (NEVER)."""
        extra_words = num_words - self.prefixes_np.shape[1]
        if extra_words > 0:
            self.prefixes_np = np.pad(
                self.prefixes_np, ((0, 0), (0, extra_words), (0, 0)), constant_values=NEVER
            )
            self.last_ids_np = np.pad(self.last_ids_np, ((0, 0), (0, extra_words)))
        extra_cols = width - self.width
        if extra_cols > 0:
            is_padding = self.prefixes_np[:, :, -1] == NEVER  # [rows, S]
            padding = np.where(is_padding[:, :, None], NEVER, WILDCARD)
            padding = np.broadcast_to(padding, (*self.prefixes_np.shape[:2], extra_cols))
            self.prefixes_np = np.concatenate([padding, self.prefixes_np], axis=2)
            fill = torch.full(
                (self.history.shape[0], extra_cols), NO_TOKEN, dtype=torch.int64, device=self.device
            )
            self.history = torch.cat([fill, self.history], dim=1)


def _append(history: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """history [M, H] then each row's leading ids of token_ids [M, K] (NO_TOKEN after them):
    the last H of the two, [M, H]."""
    width = history.shape[1]
    num_new = (token_ids >= 0).sum(dim=1, keepdim=True)  # [M, 1]
    columns = torch.arange(width, device=history.device)[None, :] + num_new  # [M, H]
    return torch.cat([history, token_ids], dim=1).gather(1, columns)
