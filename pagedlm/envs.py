"""The environment variables pagedlm reads, in one registry (as vLLM's vllm/envs.py): each with
its default, its parser and what it does. `pagedlm.envs.PAGEDLM_PDL` reads the variable when it
is accessed; modules that need a value on a hot path read it once, at their import.

Settings that change what the engine computes are engine arguments (EngineArgs), not variables:
these are switches for A/B measurements, logging and an escape hatch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_TRITON_TRUE = ("1", "true", "yes", "on", "y")  # Triton's own rule (its getenv_bool)


def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"must be one of {', '.join(_TRUE + _FALSE)}")


def _triton_flag(text: str) -> bool:
    """Anything Triton does not read as true is false to Triton, so to us too."""
    return text.lower() in _TRITON_TRUE


def _positive_seconds(text: str) -> float:
    seconds = float(text)
    if not seconds > 0:
        raise ValueError("must be a positive number of seconds")
    return seconds


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in logging.getLevelNamesMapping():
        raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
    return level


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str  # also what an empty value means
    parse: Callable[[str], Any]  # raises ValueError on a value it does not accept
    doc: str

    def read(self) -> Any:
        text = os.environ.get(self.name) or self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ValueError(f"environment variable {self.name}={text!r}: {exc}") from None


ENVIRONMENT_VARIABLES = {
    var.name: var
    for var in (
        EnvVar(
            "PAGEDLM_LOGGING_LEVEL",
            "INFO",
            _log_level,
            "level of the `pagedlm` logger (DEBUG, INFO, WARNING, ERROR, CRITICAL)",
        ),
        EnvVar(
            "PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN",
            "0",
            _flag,
            "1: max_model_len may exceed the model's trained context (as vLLM's "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN); outputs past it may be wrong",
        ),
        EnvVar(
            "PAGEDLM_FUSE_NORMS",
            "1",
            _flag,
            "0: the residual adds and RMSNorms run in the norm kernel instead of being folded into "
            "the GEMVs around them (for A/B measurements); read at import",
        ),
        EnvVar(
            "PAGEDLM_PDL",
            "1",
            _flag,
            "0: kernels launch without programmatic dependent launch on sm_90+ (for A/B "
            "measurements); read at import",
        ),
        EnvVar(
            "PAGEDLM_FREE_SLIDING_WINDOW",
            "1",
            _flag,
            "0: requests of a sliding-window model keep every KV block, as under full attention, "
            "instead of freeing those below the window (for A/B measurements)",
        ),
        EnvVar(
            "PAGEDLM_SPLIT_LARGE_DECODE",
            "1",
            _flag,
            "0: decode batches with at least as many (sequence, KV head) pairs as SMs take the "
            "varlen kernel instead of splitting their longest sequences (T4 1.11x faster with "
            "the split, T2's attention 1.000x; for A/B measurements); read at import",
        ),
        EnvVar(
            "PAGEDLM_PREFILL_SPREAD",
            "0",
            _flag,
            "1: the scheduler spreads prompts over the run by slack (core/prefill_spread.py) "
            "instead of spending each step's budget on them in arrival order (T4 1.13x slower on "
            "the H200 while mixed steps decode without the split: off; for A/B measurements)",
        ),
        EnvVar(
            "PAGEDLM_SLEEP_KEEP_ADDRESSES",
            "1",
            _flag,
            "0: sleep mode frees the weights and the KV cache through torch and captures the CUDA "
            "graphs again on wake, instead of keeping their virtual addresses (worker/cumem.py; "
            "for A/B measurements)",
        ),
        EnvVar(
            "PAGEDLM_DRAFT_GRAPHS",
            "1",
            _flag,
            "0: the draft model of speculative decoding runs eagerly instead of replaying CUDA "
            "graphs (spec_decode/draft_graphs.py; for A/B measurements); read when the runner "
            "captures its graphs",
        ),
        EnvVar(
            "PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
            "300",
            _positive_seconds,
            "tensor parallelism: how long the engine waits for a step's output from its workers "
            "before it reports them hung and stops them (vLLM's "
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS); read when the engine starts",
        ),
        EnvVar(
            "PAGEDLM_TP_ONE_DEVICE",
            "0",
            _flag,
            '1: every TP rank of an "mp" engine on the first GPU, over gloo (NCCL refuses two ranks '
            "on one device): the workers' CUDA path tested on one GPU; slow, for tests only",
        ),
        EnvVar(
            "TRITON_INTERPRET",
            "0",
            _triton_flag,
            "Triton's: 1 runs kernels in its interpreter (on the CPU); pagedlm then launches "
            "without PDL, which the interpreter cannot run; read at import",
        ),
    )
}

__doc__ += "\nVariables:\n" + "\n".join(
    f"  {v.name} (default {v.default}): {v.doc}" for v in ENVIRONMENT_VARIABLES.values()
)

if TYPE_CHECKING:
    PAGEDLM_LOGGING_LEVEL: str
    PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN: bool
    PAGEDLM_FUSE_NORMS: bool
    PAGEDLM_PDL: bool
    PAGEDLM_FREE_SLIDING_WINDOW: bool
    PAGEDLM_SPLIT_LARGE_DECODE: bool
    PAGEDLM_PREFILL_SPREAD: bool
    PAGEDLM_SLEEP_KEEP_ADDRESSES: bool
    PAGEDLM_DRAFT_GRAPHS: bool
    PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS: float
    PAGEDLM_TP_ONE_DEVICE: bool
    TRITON_INTERPRET: bool


def __getattr__(name: str) -> Any:
    if name not in ENVIRONMENT_VARIABLES:
        raise AttributeError(f"module 'pagedlm.envs' has no attribute {name!r}")
    return ENVIRONMENT_VARIABLES[name].read()


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(ENVIRONMENT_VARIABLES))
