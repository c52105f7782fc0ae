"""SpeculativeConfig: vLLM's `speculative_config` keys, parsed from a dict or a JSON string and
validated once. Imports no torch (pagedlm/config.py reads it).

`synthetic_acceptance_rates[i]` is the probability that draft i is accepted once drafts 0..i-1
were: the mean acceptance length is then 1 + sum_i prod_{j <= i} rates[j]
(`expected_acceptance_length`). `num_speculative_tokens_per_batch_size` is vLLM's dynamic k: a
list of [first, last, k] batch-size ranges (inclusive, disjoint); a batch size in no range takes
`num_speculative_tokens`, k = 0 means plain decoding at those sizes. Without the key,
DEFAULT_K_BY_BATCH: k up to 32 requests, at most 2 up to 64, plain decoding above, from the H200
crossover (llama3-8b, synthetic acceptance 0.5 / 0.7 / 0.9, k 1..5, batches 1..128, full graphs;
benchmarks/results/2026-12-02-h200-s22/spec_decode): at acceptance 0.5 every k still paid up to
batch 32 (k 5: 0.99x), only k <= 3 at 64 (k 2: 1.03x, k 5: 0.87x) and none at 128 (k 2: 0.93x),
so the batches of T0/T2 (256) decode plainly."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft_model", "suffix")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
REJECTION_SAMPLE_METHODS = ("standard", "synthetic")
DEFAULT_PROMPT_LOOKUP = 5  # vLLM's: both bounds when neither is given
MAX_SPEC_TOKENS = 128  # vLLM's MAX_SPEC_LEN
# without num_speculative_tokens_per_batch_size (module notes): (last batch size, most drafts;
# None: num_speculative_tokens); larger batches decode plainly
DEFAULT_K_BY_BATCH = ((32, None), (64, 2))


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # k
    model: str | None = None  # the draft (draft_model only)
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP
    draft_sample_method: str = "greedy"
    rejection_sample_method: str = "standard"
    synthetic_acceptance_rates: tuple[float, ...] | None = None  # [k], synthetic only
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None

    @classmethod
    def from_user(cls, value: dict[str, Any] | str) -> SpeculativeConfig:
        """From a dict or its JSON text (`--speculative-config '<json>'`); ValueError naming
        the key at fault."""
        raw = _as_dict(value)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        return cls(**_normalised(raw))

    def __post_init__(self) -> None:
        _check_choice("method", self.method, METHODS)
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPEC_TOKENS)
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative_config.model: method draft_model needs a draft model")
        if self.method != "draft_model" and self.model is not None:
            raise ValueError(f"speculative_config.model: not used by method {self.method}")
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, None)
        _check_int("prompt_lookup_max", self.prompt_lookup_max, 1, None)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        _check_choice("draft_sample_method", self.draft_sample_method, DRAFT_SAMPLE_METHODS)
        _check_choice(
            "rejection_sample_method", self.rejection_sample_method, REJECTION_SAMPLE_METHODS
        )
        self._check_synthetic()
        self._check_per_batch_size()

    def num_spec_tokens_for_batch(self, batch_size: int) -> int:
        """k for a step of `batch_size` requests; 0: plain decoding."""
        ranges = self.num_speculative_tokens_per_batch_size
        if ranges is None:
            k = self.num_speculative_tokens
            for last, most in DEFAULT_K_BY_BATCH:
                if batch_size <= last:
                    return k if most is None else min(k, most)
            return 0
        for first, last, k in ranges:
            if first <= batch_size <= last:
                return k
        return self.num_speculative_tokens

    def max_logits_rows(self, max_num_seqs: int) -> int:
        """The most logits rows a step of up to max_num_seqs requests has: 1 + k a request."""
        return max(b * (1 + self.num_spec_tokens_for_batch(b)) for b in range(1, max_num_seqs + 1))

    def expected_acceptance_length(self) -> float | None:
        """1 + the expected accepted drafts a step under the synthetic rates (None: standard)."""
        if self.synthetic_acceptance_rates is None:
            return None
        length, reach = 1.0, 1.0
        for rate in self.synthetic_acceptance_rates:
            reach *= rate
            length += reach
        return length

    def _check_synthetic(self) -> None:
        rates = self.synthetic_acceptance_rates
        if self.rejection_sample_method != "synthetic":
            if rates is not None:
                raise ValueError(
                    "speculative_config.synthetic_acceptance_rates: needs "
                    "rejection_sample_method synthetic"
                )
            return
        if rates is None:
            raise ValueError(
                "speculative_config.synthetic_acceptance_rates: required by "
                "rejection_sample_method synthetic"
            )
        if len(rates) != self.num_speculative_tokens:
            raise ValueError(
                f"speculative_config.synthetic_acceptance_rates: {len(rates)} rates for "
                f"num_speculative_tokens {self.num_speculative_tokens} (give one, or one a position)"
            )
        for rate in rates:
            if not 0.0 <= rate <= 1.0:
                raise ValueError(
                    f"speculative_config.synthetic_acceptance_rates: {rate} is not in [0, 1]"
                )

    def _check_per_batch_size(self) -> None:
        ranges = sorted(self.num_speculative_tokens_per_batch_size or ())
        key = "speculative_config.num_speculative_tokens_per_batch_size"
        for first, last, k in ranges:
            if not 1 <= first <= last:
                raise ValueError(f"{key}: range [{first}, {last}] must have 1 <= first <= last")
            if not 0 <= k <= self.num_speculative_tokens:
                raise ValueError(
                    f"{key}: k {k} must be in [0, num_speculative_tokens "
                    f"{self.num_speculative_tokens}]"
                )
        for (_, last, _), (first, _, _) in zip(ranges, ranges[1:], strict=False):
            if first <= last:
                raise ValueError(f"{key}: ranges overlap at batch size {first}")


def _as_dict(value: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config: must be a JSON object, got {type(value).__name__}")
    return dict(value)


def _normalised(raw: dict[str, Any]) -> dict[str, Any]:
    """Types checked and vLLM's defaults applied: the lookup bounds mirror each other, one
    synthetic rate broadcasts to every position."""
    if "method" not in raw:
        raise ValueError(f"speculative_config.method: required, one of {', '.join(METHODS)}")
    if "num_speculative_tokens" not in raw:
        raise ValueError("speculative_config.num_speculative_tokens: required")
    low, high = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
    if low is None and high is None:
        low = high = DEFAULT_PROMPT_LOOKUP
    raw["prompt_lookup_min"] = high if low is None else low
    raw["prompt_lookup_max"] = low if high is None else high
    k = raw["num_speculative_tokens"]
    rates = raw.get("synthetic_acceptance_rates")
    if rates is not None:
        rates = (
            [rates] if isinstance(rates, (int, float)) and not isinstance(rates, bool) else rates
        )
        if not isinstance(rates, (list, tuple)) or not all(_is_number(r) for r in rates):
            raise ValueError(
                "speculative_config.synthetic_acceptance_rates: must be a number or a list of numbers"
            )
        if len(rates) == 1 and isinstance(k, int):
            rates = list(rates) * k
        raw["synthetic_acceptance_rates"] = tuple(float(r) for r in rates)
    ranges = raw.get("num_speculative_tokens_per_batch_size")
    if ranges is not None:
        raw["num_speculative_tokens_per_batch_size"] = _ranges(ranges)
    for key in ("method", "draft_sample_method", "rejection_sample_method", "model"):
        if key in raw and raw[key] is not None and not isinstance(raw[key], str):
            raise ValueError(f"speculative_config.{key}: must be a string, got {raw[key]!r}")
    return raw


def _ranges(value: Any) -> tuple[tuple[int, int, int], ...]:
    key = "speculative_config.num_speculative_tokens_per_batch_size"
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{key}: must be a list of [first, last, k]")
    out = []
    for item in value:
        if not (
            isinstance(item, (list, tuple))
            and len(item) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise ValueError(f"{key}: each entry must be [first, last, k] integers, got {item!r}")
        out.append((item[0], item[1], item[2]))
    return tuple(out)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(
            f"speculative_config.{key}: must be one of {', '.join(allowed)}; got {value!r}"
        )


def _check_int(key: str, value: Any, low: int, high: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"speculative_config.{key}: must be an integer {bound}; got {value!r}")
