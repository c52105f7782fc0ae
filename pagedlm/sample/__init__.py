"""Sampling: per-request parameters in persistent rows, one batched, sync-free step."""

from __future__ import annotations

from pagedlm.sample.sampler import SamplerOutput
from pagedlm.sample.state import SamplingState

__all__ = ["SamplerOutput", "SamplingState"]
