"""SamplingParams: how one request samples and when it stops (vLLM's names and defaults)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from pagedlm.errors import InvalidRequest

MAX_LOGPROBS = 20
_INT_FIELDS = ("n", "top_k", "min_tokens")
_OPTIONAL_INT_FIELDS = ("max_tokens", "logprobs", "prompt_logprobs")


# The constraint fields of StructuredOutputsParams: exactly one is set per request.
CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """A constraint on a request's output (vLLM's names), enforced by xgrammar: exactly one of
    `json` (a JSON schema, str or dict), `regex`, `choice` (one of these strings), `grammar`
    (EBNF in xgrammar's dialect), `json_object` (any JSON object) or `structural_tag` (xgrammar's
    structural tag, a JSON string or dict). Checked here for shape only; the engine boundary
    parses the constraint itself (pagedlm/structured_outputs/grammars.py)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    # JSON only: no whitespace between tokens beyond what the separators hold.
    disable_any_whitespace: bool = False
    # JSON only: keys not in the schema are refused. xgrammar's strict mode already refuses them,
    # so this holds either way; accepted for vLLM's interface.
    disable_additional_properties: bool = False
    # vLLM's guidance/outlines option; xgrammar has no equivalent, so a value is refused.
    whitespace_pattern: str | None = None

    def __post_init__(self) -> None:
        set_fields = [name for name in CONSTRAINT_FIELDS if _is_set(getattr(self, name))]
        _check(
            len(set_fields) == 1,
            "structured_outputs",
            f"needs exactly one of {', '.join(CONSTRAINT_FIELDS)}; got "
            f"{', '.join(set_fields) if set_fields else 'none'}",
        )
        self._check_types()
        _check(
            self.whitespace_pattern is None,
            "structured_outputs.whitespace_pattern",
            "is not supported by the xgrammar backend; use disable_any_whitespace",
        )

    def _check_types(self) -> None:
        for name, types in (
            ("json", (str, dict)),
            ("regex", (str,)),
            ("grammar", (str,)),
            ("structural_tag", (str, dict)),
            ("json_object", (bool,)),
            ("disable_any_whitespace", (bool,)),
            ("disable_additional_properties", (bool,)),
        ):
            value = getattr(self, name)
            _check(
                value is None or isinstance(value, types),
                f"structured_outputs.{name}",
                f"must be {' or '.join(t.__name__ for t in types)}, got {type(value).__name__}",
            )
        if self.choice is not None:
            _check(
                isinstance(self.choice, (list, tuple))
                and len(self.choice) > 0
                and all(isinstance(c, str) for c in self.choice),
                "structured_outputs.choice",
                "must be a non-empty list of strings",
            )
            self.choice = list(self.choice)

    @property
    def kind(self) -> str:
        """The one constraint field that is set."""
        return next(name for name in CONSTRAINT_FIELDS if _is_set(getattr(self, name)))


def _is_set(value: object) -> bool:
    """json_object=False counts as unset, as an empty string or list does."""
    return value is not None and value is not False and value != "" and value != []


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # A constraint on the output (a StructuredOutputsParams, or a dict of its fields).
    structured_outputs: StructuredOutputsParams | None = None
    # Filled by the engine from bad_words once a tokenizer is known: token-id sequences to forbid.
    bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name)
            _check(
                value is None or isinstance(value, (list, tuple)),
                name,
                f"must be a list, got {type(value).__name__}",
            )
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check(all(_is_int(t) for t in self.stop_token_ids), "stop_token_ids", "must be integers")
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError) as exc:
                raise InvalidRequest(
                    f"logit_bias must map token ids to numbers: {exc}", param="logit_bias"
                ) from exc
            _check(
                not any(math.isnan(v) for v in self.logit_bias.values()),
                "logit_bias",
                "values must be numbers, got NaN",
            )
        self.structured_outputs = _structured_outputs(self.structured_outputs)
        self._validate()

    def _validate(self) -> None:
        for name in _INT_FIELDS + _OPTIONAL_INT_FIELDS:
            value = getattr(self, name)
            optional = name in _OPTIONAL_INT_FIELDS
            _check(
                _is_int(value) or (optional and value is None),
                name,
                f"must be an integer{' or None' if optional else ''}, got {value!r}",
            )
        if self.allowed_token_ids is not None:
            _check(
                all(_is_int(t) for t in self.allowed_token_ids),
                "allowed_token_ids",
                "must be integers",
            )
        _check(self.n >= 1, "n", f"must be at least 1, got {self.n}")
        _check(
            self.temperature >= 0.0, "temperature", f"must be non-negative, got {self.temperature}"
        )
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(
            self.top_k >= 0,
            "top_k",
            f"must be 0 or -1 (off) or a positive integer, got {self.top_k}",
        )
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty}",
        )
        _check(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty}",
        )
        _check(
            self.repetition_penalty > 0.0,
            "repetition_penalty",
            f"must be greater than 0, got {self.repetition_penalty}",
        )
        if self.max_tokens is not None:
            _check(self.max_tokens >= 1, "max_tokens", f"must be at least 1, got {self.max_tokens}")
        _check(self.min_tokens >= 0, "min_tokens", f"must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens,
                "min_tokens",
                f"must be at most max_tokens={self.max_tokens}, got {self.min_tokens}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check(
                    0 <= value <= MAX_LOGPROBS, name, f"must be in [0, {MAX_LOGPROBS}], got {value}"
                )
        _check(
            all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings"
        )
        _check(
            all(t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be non-negative token ids",
        )
        if self.seed is not None:
            _check(isinstance(self.seed, int), "seed", f"must be an integer, got {self.seed!r}")
        if self.allowed_token_ids is not None:
            _check(len(self.allowed_token_ids) > 0, "allowed_token_ids", "must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids in the parameters must exist in the model's vocabulary."""
        bad_word_ids = [t for word in self.bad_words_token_ids or [] for t in word]
        for name, param, ids in (
            ("stop_token_ids", "stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", "allowed_token_ids", self.allowed_token_ids or []),
            ("logit_bias", "logit_bias", list(self.logit_bias or {})),
            ("bad_words_token_ids", "bad_words", bad_word_ids),
        ):  # derived from bad_words
            bad = [t for t in ids if not 0 <= t < vocab_size]
            _check(not bad, name, f"token ids must be in [0, {vocab_size}), got {bad[:5]}", param)


def _structured_outputs(value: object) -> StructuredOutputsParams | None:
    if value is None or isinstance(value, StructuredOutputsParams):
        return value
    if isinstance(value, dict):
        unknown = set(value) - set(StructuredOutputsParams.__dataclass_fields__)
        _check(not unknown, "structured_outputs", f"has unknown keys {sorted(unknown)}")
        return StructuredOutputsParams(**value)
    raise InvalidRequest(
        "structured_outputs must be a StructuredOutputsParams or a dict, got "
        f"{type(value).__name__}",
        param="structured_outputs",
    )


def _is_int(value: object) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check(ok: bool, name: str, message: str, param: str | None = None) -> None:
    """Raises InvalidRequest("<name> <message>") naming `param` (default: `name`), the API's
    name for the field at fault."""
    if not ok:
        raise InvalidRequest(f"{name} {message}", param=param or name)
