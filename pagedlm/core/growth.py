"""How many KV blocks admission keeps free for the tokens running requests will still add.

Admitting a request only because its prompt fits fills the pool with prompts; as the batch decodes,
the pool runs out and requests are preempted by recompute, their prefill thrown away (the CPU
simulation of the 1000 x 1000/1000 workload: 410 preemptions, 28% of all computed tokens redone).
So a waiting request is admitted only if, after its prompt, the pool still holds the expected
growth of every running request and its own:
    growth(r) = prompt tokens not yet computed + fraction x outputs still allowed (max_tokens)
`fraction` estimates how much of max_tokens requests really use: the moving average of
outputs / max_tokens over finished requests, starting at 1 (nothing known: assume they run to
max_tokens). Requests stopped early by EOS or a stop string pull it down, so a chat workload with a
large max_tokens soon reserves little. An allowance counts at most MAX_ESTIMATED_OUTPUTS tokens
(SGLang clips its estimate the same way), so requests that leave max_tokens to the context length
(up to max_model_len: 40k tokens on Qwen3) do not each hold a context's worth of blocks while the
fraction is still being learned. Preemption stays the safety net when the estimate is short.
"""
from __future__ import annotations

from collections.abc import Iterable

from pagedlm.request import Request

INITIAL_FRACTION = 1.0
AVERAGE_WEIGHT = 0.05  # of each finished request in the moving average (~the last 20-40 count)
MAX_ESTIMATED_OUTPUTS = 4096


class GrowthEstimate:
    """enabled=False reserves nothing (admission by the prompt alone; tests of preemption use it)."""

    def __init__(self, max_model_len: int, enabled: bool = True) -> None:
        self.max_model_len = max_model_len
        self.enabled = enabled
        self.fraction = INITIAL_FRACTION

    def observe_finished(self, request: Request) -> None:
        """A request stopped (not aborted): how much of its allowance it used."""
        allowance = self._output_allowance(request.max_tokens, len(request.prompt_token_ids))
        if allowance > 0:
            used = min(len(request.output_token_ids) / allowance, 1.0)
            self.fraction += AVERAGE_WEIGHT * (used - self.fraction)

    def tokens(self, request: Request) -> float:
        """Tokens the request will still add to the KV cache (expected)."""
        if not self.enabled:
            return 0.0
        num_outputs = len(request.output_token_ids) + request.num_output_placeholders
        allowance = self._output_allowance(request.max_tokens, len(request.prompt_token_ids))
        num_uncomputed = max(request.num_tokens - request.num_computed_tokens, 0)
        return num_uncomputed + self.fraction * max(allowance - num_outputs, 0)

    def total_tokens(self, requests: Iterable[Request]) -> float:
        return sum(self.tokens(request) for request in requests)

    def _output_allowance(self, max_tokens: int, num_prompt: int) -> int:
        return min(max_tokens, self.max_model_len - num_prompt, MAX_ESTIMATED_OUTPUTS)
