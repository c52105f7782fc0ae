"""What the start-up warm-up (worker/kernel_warmup.py) runs, declared by each kernel module next to the
dispatch rule that makes it necessary, so that every Triton specialisation serving can launch is
compiled before the first request (ops/jit_watch.py logs any compile while serving).

Two kinds: a WarmUpRequest is run as steps of a made-up request (its prompt of zeros in chunks of the
step budget, then one decode step); a WarmUpCall is called directly with the WarmUpTarget, for a
kernel no short request reaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class WarmUpRequest:
    num_prompt_tokens: int  # cut to max_model_len - 1
    why: str  # the specialisation it launches
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    # its decode step also runs a new prompt of this many tokens (a mixed step, the decode first)
    mixed_with: int = 0


@dataclass(frozen=True, slots=True)
class WarmUpTarget:
    """What a WarmUpCall gets: the loaded model and the runner's limits."""

    model: torch.nn.Module
    device: torch.device
    vocab_size: int
    max_num_tokens: int  # the step budget
    kv_caches: Sequence[torch.Tensor] = ()  # the runner's, one per layer in the model's order


WarmUpCall = Callable[[WarmUpTarget], None]
