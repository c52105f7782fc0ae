"""SamplingState: the sampling parameters of the requests in persistent rows, and the step.

Per-row parameters live in host numpy tables (kept by add/remove); numeric ones are mirrored to
the device when rows change and gathered there by row index. Each step the host decides from
per-row feature flags which features the batch uses, uploads only what those need (pinned,
non_blocking) and launches nothing for the rest. No Python loop over requests, no sync.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Collection, Sequence

import numpy as np
import torch

from pagedlm.sample.bad_words import BadWordsTables
from pagedlm.sample.filters import TopKTopP
from pagedlm.sample.noise import MASK64, row_keys_np
from pagedlm.sample.penalties import PenaltyTables
from pagedlm.sample.sampler import (
    TRITON_DEVICE_TYPES,
    Penalties,
    RandomParams,
    SamplerOutput,
    SamplingBatch,
    TokenLists,
    sample_batch,
)
from pagedlm.sample.tables import MirroredTable, PaddedRows, upload
from pagedlm.sampling_params import SamplingParams


class Feature(enum.IntEnum):
    RANDOM = 0  # not greedy
    TEMPERATURE = 1  # random, temperature != 1
    MIN_P = 2
    TOP_K_TOP_P = 3
    PENALTIES = 4
    BIAS = 5
    ALLOWED = 6
    MIN_TOKENS = 7  # min_tokens > 0 with ids to ban (whether still below: num_sampled_np)
    LOGPROBS = 8
    BAD_WORDS = 9


# Columns of the mirrored tables; the defaults are the neutral values.
COL_TEMPERATURE, COL_TOP_P, COL_MIN_P, COL_REPETITION, COL_FREQUENCY, COL_PRESENCE = range(6)
_FLOAT_DEFAULTS = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], dtype=np.float32)
COL_TOP_K = 0
_FLOAT32_MAX = float(np.finfo(np.float32).max)  # the float table's range: larger (or smaller
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # positive) values would store as inf (or 0)
_INT_DEFAULTS = np.array([0], dtype=np.int64)
# Features that make a batch more than an argmax whenever a row has them (min_tokens only while
# the row is below it)
_BEYOND_ARGMAX = np.array([feature != Feature.MIN_TOKENS for feature in Feature])


class SamplingState:
    """Sampling for up to `max_num_reqs` requests, each in a persistent row from add_request to
    remove_request. `sample(logits, rows_np)` draws one token per row of the batch: rows_np
    must be distinct rows that hold requests; logits are modified in place. What a row has
    sampled is counted here (host counter, device token counts): the caller's history of a
    request is read once, at add_request."""

    def __init__(
        self,
        max_num_reqs: int,
        vocab_size: int,
        device: torch.device | str,
        seed: int,
        triton_device_types: Collection[str] = TRITON_DEVICE_TYPES,
    ) -> None:
        """triton_device_types: the device types the sampler's Triton kernels serve (sampler.py)."""
        if max_num_reqs < 1:
            raise ValueError(f"max_num_reqs must be at least 1, got {max_num_reqs}")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._triton_device_types = triton_device_types
        self._rng = random.Random(seed)  # seeds of requests that bring none
        self._init_host_rows()
        self._init_tables()
        self._rows_version = 0  # bumped when a row changes owner
        self._checked_rows: tuple[np.ndarray, int, np.ndarray] | None = None  # _check_rows' last
        self._greedy_rows: tuple[np.ndarray, int, bool] | None = None  # _is_greedy's last

    def _init_host_rows(self) -> None:
        num_rows = self.max_num_reqs
        self._active_np = np.zeros(num_rows, dtype=bool)
        self._flags_np = np.zeros((num_rows, len(Feature)), dtype=bool)
        self._num_sampled_np = np.zeros(num_rows, dtype=np.int64)  # outputs so far, per request
        self._seeds_np = np.zeros(num_rows, dtype=np.uint64)
        self._min_tokens_np = np.zeros(num_rows, dtype=np.int64)
        self._num_logprobs_np = np.zeros(num_rows, dtype=np.int64)

    def _init_tables(self) -> None:
        num_rows = self.max_num_reqs
        self._floats = MirroredTable(_FLOAT_DEFAULTS, num_rows, self.device)
        self._ints = MirroredTable(_INT_DEFAULTS, num_rows, self.device)
        self._allowed = PaddedRows(num_rows, with_values=False)
        self._banned = PaddedRows(num_rows, with_values=False)  # EOS and stop ids (min_tokens)
        self._bias = PaddedRows(num_rows, with_values=True)
        self._penalty_tables: PenaltyTables | None = None  # made on first use
        self._bad_words = BadWordsTables(num_rows, self.vocab_size, self.device)

    # ---- rows ----------------------------------------------------------------------------

    def add_request(
        self,
        row: int,
        params: SamplingParams,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        """Give `row` to a request; `output_token_ids` is non-empty for a resumed one."""
        if not 0 <= row < self.max_num_reqs:
            raise ValueError(f"row must be in [0, {self.max_num_reqs}), got {row}")
        if self._active_np[row]:
            raise ValueError(f"row {row} already holds a request; remove_request it first")
        # the params' token ids lie in the vocabulary: SamplingParams.check_vocab at the engine
        # boundary (LLMEngine._resolve_params)
        bad_eos = [t for t in eos_token_ids if not 0 <= t < self.vocab_size]
        if bad_eos:
            raise ValueError(f"eos_token_ids must be in [0, {self.vocab_size}), got {bad_eos[:5]}")
        self._active_np[row] = True
        self._rows_version += 1
        self._num_sampled_np[row] = len(output_token_ids)
        self._set_numeric_params(row, params)
        self._set_token_lists(row, params, len(output_token_ids), eos_token_ids)
        try:
            self._flags_np[row, Feature.BAD_WORDS] = self._bad_words.set_row(
                row, params.bad_words_token_ids or [], output_token_ids
            )
        except ValueError:  # a refused request leaves its row free
            self.remove_request(row)
            raise
        if self._flags_np[row, Feature.PENALTIES]:
            self._penalties().reset_row(row, prompt_token_ids, output_token_ids)

    def remove_request(self, row: int) -> None:
        if not 0 <= row < self.max_num_reqs or not self._active_np[row]:
            raise ValueError(f"row {row} holds no request")
        self._active_np[row] = False
        self._rows_version += 1
        self._flags_np[row] = False

    def _set_numeric_params(self, row: int, params: SamplingParams) -> None:
        """Greedy rows keep neutral temperature and truncation: they take the argmax."""
        is_random = not params.greedy
        temperature = min(params.temperature, _FLOAT32_MAX) if is_random else 1.0  # float32 table
        top_k = params.top_k if is_random and params.top_k < self.vocab_size else 0
        top_p = params.top_p if is_random else 1.0
        min_p = params.min_p if is_random else 0.0
        seed = params.seed if params.seed is not None else self._rng.getrandbits(64)
        flags = self._flags_np[row]
        flags[Feature.RANDOM] = is_random
        flags[Feature.TEMPERATURE] = temperature != 1.0
        flags[Feature.MIN_P] = min_p > 0.0
        flags[Feature.TOP_K_TOP_P] = top_k > 0 or top_p < 1.0
        flags[Feature.PENALTIES] = (
            params.repetition_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        )
        flags[Feature.LOGPROBS] = params.logprobs is not None
        self._num_logprobs_np[row] = params.logprobs or 0
        repetition = min(max(params.repetition_penalty, _FLOAT32_TINY), _FLOAT32_MAX)
        self._floats.set_row(
            row,
            (
                temperature,
                top_p,
                min_p,
                repetition,
                params.frequency_penalty,
                params.presence_penalty,
            ),
        )
        self._seeds_np[row] = seed & MASK64
        self._ints.set_row(row, (top_k,))

    def _set_token_lists(
        self, row: int, params: SamplingParams, num_outputs: int, eos_token_ids: Sequence[int]
    ) -> None:
        flags = self._flags_np[row]
        flags[Feature.ALLOWED] = self._allowed.set_row(row, params.allowed_token_ids or [])
        bias = params.logit_bias or {}
        flags[Feature.BIAS] = self._bias.set_row(row, list(bias), list(bias.values()))
        banned: list[int] = []
        if params.min_tokens > num_outputs:
            banned = list(params.stop_token_ids or [])
            banned += [] if params.ignore_eos else list(eos_token_ids)
        self._min_tokens_np[row] = params.min_tokens
        flags[Feature.MIN_TOKENS] = self._banned.set_row(row, banned)

    def _penalties(self) -> PenaltyTables:
        if self._penalty_tables is None:
            self._penalty_tables = PenaltyTables(self.max_num_reqs, self.vocab_size, self.device)
        return self._penalty_tables

    # ---- the step ------------------------------------------------------------------------

    def sample(self, logits: torch.Tensor, rows_np: np.ndarray) -> SamplerOutput:
        """logits [N, V] float32 (modified in place), rows_np [N] distinct persistent rows."""
        rows_np = self._check_batch(logits, rows_np)
        if self._is_greedy(rows_np):  # what sample_batch does for an empty batch
            self._num_sampled_np[rows_np] += 1
            return SamplerOutput(logits.argmax(dim=-1))
        batch = self.make_batch(rows_np)
        output = sample_batch(logits.float(), batch, self._triton_device_types)
        self._num_sampled_np[rows_np] += 1
        self._record_drawn(batch, rows_np, output.sampled_token_ids)
        return output

    def _record_drawn(
        self, batch: SamplingBatch, rows_np: np.ndarray, sampled: torch.Tensor
    ) -> None:
        """The tokens sampled [N] by the batch made for rows [N] go into the histories of the
        rows with penalties or bad words."""
        pen = batch.penalties
        if pen is not None:
            penalised_np = rows_np[self._flags_np[rows_np, Feature.PENALTIES]]
            self._penalties().record(
                pen.rows, pen.positions, _pick(sampled, pen.index), penalised_np
            )
        if batch.bad_words is not None:
            self._bad_words.record(batch.bad_words.rows, _pick(sampled, batch.bad_words.index))

    def reads_history(self, rows_np: np.ndarray) -> bool:
        """Whether a row of rows [N] has penalties or bad words (its logits depend on the
        tokens before: a verification step passes make_batch the drafts)."""
        return bool(self._flags_np[rows_np][:, [Feature.PENALTIES, Feature.BAD_WORDS]].any())

    def record_verified(self, rows_np: np.ndarray, token_ids: torch.Tensor) -> None:
        """The tokens [N, K + 1] (-1 past the emitted ones) that rows [N] (distinct) emitted in
        a verification step go into the device histories of the rows with penalties or bad
        words; the host's counts move by count_emitted, once it knows them."""
        flags_np = self._flags_np[rows_np]  # [N, F]
        if flags_np[:, Feature.PENALTIES].any():
            tables = self._penalties()
            mask_np = flags_np[:, Feature.PENALTIES]
            index, rows, positions = self._select(rows_np, mask_np, tables.lengths_np)
            max_end = int(tables.lengths_np[rows_np[mask_np]].max()) + token_ids.shape[1]
            tables.record_emitted(rows, positions, _pick(token_ids, index), max_end)
        if flags_np[:, Feature.BAD_WORDS].any():
            index, rows = self._select(rows_np, flags_np[:, Feature.BAD_WORDS])
            self._bad_words.record_emitted(rows, _pick(token_ids, index))

    def count_emitted(self, rows_np: np.ndarray, counts_np: np.ndarray | int) -> None:
        """Rows [N] (distinct) emitted counts_np [N] tokens outside sample() (speculative
        steps); their next noise keys, min_tokens bans and penalty histories count them."""
        self._num_sampled_np[rows_np] += counts_np
        penalised_np = self._flags_np[rows_np, Feature.PENALTIES]  # [N]
        if penalised_np.any():
            counts_np = np.broadcast_to(counts_np, rows_np.shape)
            self._penalties().lengths_np[rows_np[penalised_np]] += counts_np[penalised_np]

    def noise_keys(self, rows_np: np.ndarray, offsets_np: np.ndarray) -> torch.Tensor:
        """[N] int64 on the device: the noise keys of rows [N] offsets_np [N] tokens ahead."""
        keys_np = row_keys_np(self._seeds_np[rows_np], self._num_sampled_np[rows_np] + offsets_np)
        return upload(keys_np, self.device)

    def is_greedy(self, rows_np: np.ndarray) -> bool:
        """Whether the batch of rows [N] samples by argmax alone: no row draws at random or uses
        anything else (make_batch gives an empty SamplingBatch). Then sample() is the argmax of
        the logits; a caller that has that argmax already (a CUDA graph computed it) may take it
        and report the batch with count_sampled instead."""
        return self._is_greedy(self._check_rows(rows_np))

    def count_sampled(self, rows_np: np.ndarray) -> None:
        """A greedy batch (is_greedy) of rows [N] sampled its argmax outside sample()."""
        rows_np = self._check_rows(rows_np)
        if not self._is_greedy(rows_np):
            raise ValueError("count_sampled: rows_np holds rows that do not sample greedily")
        self._num_sampled_np[rows_np] += 1

    def _is_greedy(self, rows_np: np.ndarray) -> bool:
        """rows_np: as _check_rows returns it (the same array for the same checked rows)."""
        cached = self._greedy_rows
        if cached is not None and cached[0] is rows_np and cached[1] == self._rows_version:
            return cached[2]
        flags_np = self._flags_np[rows_np]  # [N, F]
        used_np = flags_np.any(axis=0)  # [F]
        if used_np[Feature.MIN_TOKENS] and not (used_np & _BEYOND_ARGMAX).any():
            # min_tokens bans apply while a row has sampled fewer tokens: not cached
            below_np = self._num_sampled_np[rows_np] < self._min_tokens_np[rows_np]  # [N]
            return not (flags_np[:, Feature.MIN_TOKENS] & below_np).any()
        self._greedy_rows = (rows_np, self._rows_version, not used_np.any())
        return self._greedy_rows[2]

    def make_batch(
        self,
        rows_np: np.ndarray,
        offsets_np: np.ndarray | None = None,
        drafts: torch.Tensor | None = None,
    ) -> SamplingBatch:
        """The device view of the features the rows [N] use this step (no state changes).
        offsets_np [N]: each row samples that many tokens past the ones counted (a row repeated
        for the positions of its drafts: noise keys and min_tokens bans count them); drafts
        [N, K] int64: the drafts before each row's position, -1 after them (penalties and bad
        words see them as outputs)."""
        flags_np = self._flags_np[rows_np]  # [N, F]
        num_sampled_np = self._num_sampled_np[rows_np]  # [N]
        if offsets_np is not None:
            num_sampled_np = num_sampled_np + offsets_np
        used = flags_np.any(axis=0)  # [F]
        batch = SamplingBatch()
        if used[Feature.LOGPROBS]:
            batch.num_logprobs = int(self._num_logprobs_np[rows_np].max())
        if used[Feature.ALLOWED]:
            batch.allowed = self._token_lists(rows_np, flags_np[:, Feature.ALLOWED], self._allowed)
        if used[Feature.BAD_WORDS]:
            mask_np = flags_np[:, Feature.BAD_WORDS]
            index, rows = self._select(rows_np, mask_np)
            row_drafts = None if drafts is None else _pick(drafts, index)
            batch.bad_words = self._bad_words.batch(index, rows, rows_np[mask_np], row_drafts)
        if used[Feature.MIN_TOKENS]:
            below = num_sampled_np < self._min_tokens_np[rows_np]  # [N]
            banning = (
                flags_np[:, Feature.MIN_TOKENS] & below
            )  # [N]: rows with ids to ban, still below
            if banning.any():
                batch.banned = self._token_lists(rows_np, banning, self._banned)
        if used[Feature.BIAS]:
            batch.bias = self._token_lists(rows_np, flags_np[:, Feature.BIAS], self._bias)
        if used[Feature.PENALTIES]:
            mask_np = flags_np[:, Feature.PENALTIES]
            batch.penalties = self._batch_penalties(rows_np, mask_np, drafts)
        if used[Feature.RANDOM]:
            batch.random = self._random_params(rows_np, flags_np, used, num_sampled_np)
        return batch

    def _check_batch(self, logits: torch.Tensor, rows_np: np.ndarray) -> np.ndarray:
        rows_np = self._check_rows(rows_np)
        if tuple(logits.shape) != (rows_np.size, self.vocab_size):
            raise ValueError(
                f"logits must have shape [{rows_np.size}, {self.vocab_size}] "
                f"(num rows, vocab_size), got {list(logits.shape)}"
            )
        return rows_np

    def _check_rows(self, rows_np: np.ndarray) -> np.ndarray:
        """rows_np as int64 after checking it names rows that hold requests; the array checked
        last is not checked again while no row changed owner (a steady decode passes the same
        array, which nobody writes)."""
        checked = self._checked_rows
        if checked is not None and checked[0] is rows_np and checked[1] == self._rows_version:
            return checked[2]
        original = rows_np
        rows_np = np.asarray(rows_np, dtype=np.int64)
        if rows_np.ndim != 1 or rows_np.size == 0:
            raise ValueError(f"rows_np must be a non-empty 1-D array, got shape {rows_np.shape}")
        if rows_np.min() < 0 or rows_np.max() >= self.max_num_reqs:
            raise ValueError(f"rows_np must be in [0, {self.max_num_reqs}), got {rows_np}")
        if not self._active_np[rows_np].all():
            idle_np = rows_np[~self._active_np[rows_np]]
            raise ValueError(f"rows_np holds rows without a request: {idle_np}")
        self._checked_rows = (original, self._rows_version, rows_np)
        return rows_np

    def _select(
        self, rows_np: np.ndarray, mask_np: np.ndarray, *extra_np: np.ndarray
    ) -> tuple[torch.Tensor | None, ...]:
        """The batch positions where mask_np [N] holds (None: all), their rows, and any
        per-row host values `extra_np` ([num_rows] each) of those rows, [M] each, in one upload."""
        index_np = np.flatnonzero(mask_np)
        selected_np = rows_np[index_np]
        columns_np = [index_np, selected_np, *(values_np[selected_np] for values_np in extra_np)]
        index, *tensors = upload(np.stack(columns_np), self.device)
        return (None if index_np.size == rows_np.size else index), *tensors

    def _token_lists(
        self, rows_np: np.ndarray, mask_np: np.ndarray, table: PaddedRows
    ) -> TokenLists:
        index_np = np.flatnonzero(mask_np)
        ids_np, values_np = table.gather(rows_np[index_np])  # [M, W]
        packed = upload(np.concatenate([index_np[:, None], ids_np], axis=1), self.device)
        values = None if values_np is None else upload(values_np, self.device)
        index = None if index_np.size == rows_np.size else packed[:, 0]
        return TokenLists(index=index, token_ids=packed[:, 1:], values=values)

    def _batch_penalties(
        self, rows_np: np.ndarray, mask_np: np.ndarray, drafts: torch.Tensor | None
    ) -> Penalties:
        self._floats.sync()
        tables = self._penalties()
        index, rows, positions = self._select(rows_np, mask_np, tables.lengths_np)
        row_drafts = None if drafts is None else _pick(drafts, index)
        token_ids, counts, has_history = tables.batch(rows_np[mask_np], rows, row_drafts)
        floats = self._floats.gpu.index_select(0, rows)  # [M, 6]
        repetition = torch.where(has_history, floats[:, COL_REPETITION], 1.0)  # empty: no-op
        return Penalties(
            index=index,
            rows=rows,
            positions=positions,
            token_ids=token_ids,
            counts=counts,
            repetition=repetition,
            frequency=floats[:, COL_FREQUENCY],
            presence=floats[:, COL_PRESENCE],
        )

    def _random_params(
        self,
        rows_np: np.ndarray,
        flags_np: np.ndarray,
        used: np.ndarray,
        num_sampled_np: np.ndarray,
    ) -> RandomParams:
        self._floats.sync()
        self._ints.sync()
        is_random_np = flags_np[:, Feature.RANDOM]
        keys_np = row_keys_np(self._seeds_np[rows_np], num_sampled_np)
        packed_np = np.stack([rows_np, keys_np, is_random_np.astype(np.int64)])  # [3, N]
        rows, keys, is_random = upload(packed_np, self.device)
        params = RandomParams(noise_keys=keys)
        if not is_random_np.all():
            params.is_greedy = is_random == 0
        if used[Feature.TEMPERATURE] or used[Feature.MIN_P]:
            floats = self._floats.gpu.index_select(0, rows)  # [N, 6]
            params.temperature = floats[:, COL_TEMPERATURE] if used[Feature.TEMPERATURE] else None
            params.min_p = floats[:, COL_MIN_P] if used[Feature.MIN_P] else None
        if used[Feature.TOP_K_TOP_P]:
            params.top_k_top_p = self._top_k_top_p(rows_np, flags_np[:, Feature.TOP_K_TOP_P])
        return params

    def _top_k_top_p(self, rows_np: np.ndarray, mask_np: np.ndarray) -> TopKTopP:
        index, rows = self._select(rows_np, mask_np)
        top_k_np = self._ints.np[rows_np[mask_np], COL_TOP_K]  # [M]
        top_p_np = self._floats.np[rows_np[mask_np], COL_TOP_P]  # [M]
        return TopKTopP(
            index=index,
            top_k=self._ints.gpu[:, COL_TOP_K].index_select(0, rows),
            top_p=self._floats.gpu[:, COL_TOP_P].index_select(0, rows),
            max_top_k=int(top_k_np.max()),
            every_row_top_k=bool(top_k_np.min() > 0),
            any_top_p=bool((top_p_np < 1.0).any()),
        )


def _pick(values: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """values [N] at the batch positions index [M] (None: all)."""
    return values if index is None else values.index_select(0, index)
