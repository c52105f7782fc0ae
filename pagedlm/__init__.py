"""pagedlm: a high-throughput LLM inference engine.

The exports load on first use (PEP 562), so that `import pagedlm.core.scheduler` (pure Python)
does not pay for torch. Importing pagedlm configures no logging: the entry points do (LLM(), the
`pagedlm` command)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedlm.beam_search import BeamSearchParams as BeamSearchParams
    from pagedlm.config import EngineArgs as EngineArgs
    from pagedlm.errors import InvalidRequest as InvalidRequest
    from pagedlm.llm import LLM as LLM
    from pagedlm.outputs import CompletionOutput as CompletionOutput
    from pagedlm.outputs import RequestOutput as RequestOutput
    from pagedlm.sampling_params import SamplingParams as SamplingParams

_EXPORTS = {
    "LLM": "pagedlm.llm",
    "SamplingParams": "pagedlm.sampling_params",
    "StructuredOutputsParams": "pagedlm.sampling_params",
    "BeamSearchParams": "pagedlm.beam_search",
    "EngineArgs": "pagedlm.config",
    "RequestOutput": "pagedlm.outputs",
    "CompletionOutput": "pagedlm.outputs",
    "InvalidRequest": "pagedlm.errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pagedlm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
