"""pagedlm: a high-throughput LLM inference engine."""
from __future__ import annotations

from pagedlm.beam_search import BeamSearchParams
from pagedlm.config import EngineArgs
from pagedlm.logger import configure_logging
from pagedlm.llm import LLM
from pagedlm.outputs import CompletionOutput, RequestOutput
from pagedlm.sampling_params import SamplingParams

configure_logging()

__all__ = ["LLM", "SamplingParams", "BeamSearchParams", "EngineArgs", "RequestOutput", "CompletionOutput"]
