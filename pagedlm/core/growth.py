"""How many KV blocks admission keeps free for the tokens running requests will still add.

Admitting a request only because its prompt fits fills the pool with prompts; as the batch decodes,
the pool runs out and requests are preempted by recompute, their prefill thrown away (the CPU
simulation of the 1000 x 1000/1000 workload: 410 preemptions, 28% of all computed tokens redone).
So a waiting request is admitted only if, after its prompt, the pool still holds the blocks that
its own expected growth and that of every running request ranked before it need:
    growth(r) = known tokens not yet computed + fraction x outputs still allowed (max_tokens)
in whole blocks beyond the ones the request already fills (the free slots of its last block count).
Running requests ranked after the candidate (priority policy) are not reserved for: if the pool
runs out, they are the ones preempted, as without the reserve. With nothing running and nothing
admitted in the step, a request is admitted if it fits at all (`_check_fits` made sure it does
alone), so no request waits for a reserve that only its own growth makes too large.
`fraction` estimates how much of max_tokens requests really use: the moving average of
outputs / max_tokens over finished requests, starting at 1 (nothing known: assume they run to
max_tokens). Requests stopped early by EOS or a stop string pull it down, so a chat workload with a
large max_tokens soon reserves little. An allowance counts at most MAX_ESTIMATED_OUTPUTS tokens
(SGLang clips its estimate the same way), so requests that leave max_tokens to the context length
(up to max_model_len: 40k tokens on Qwen3) do not each hold a context's worth of blocks while the
fraction is still being learned. Preemption stays the safety net when the estimate is short.
With a sliding window (every layer) a request's blocks are capped (core/sliding_window.py): its
growth is the most it will hold (the rest of its prompt in one chunk beside its window, or its
window once decoding) less what it holds now. With several KV cache groups (core/kv_groups.py)
the growth is the sum of each group's, counting what a group holds from the request's tokens.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Hashable

from pagedlm.core.sliding_window import cdiv, num_held_blocks, num_skipped_blocks
from pagedlm.request import Request

INITIAL_FRACTION = 1.0
AVERAGE_WEIGHT = 0.05  # of each finished request in the moving average (~the last 20-40 count)
MAX_ESTIMATED_OUTPUTS = 4096


class GrowthEstimate:
    """enabled=False reserves nothing (admission by the prompt alone; tests of preemption use it)."""

    def __init__(
        self,
        max_model_len: int,
        enabled: bool = True,
        sliding_window: int | None = None,
        group_windows: tuple[int | None, ...] | None = None,
    ) -> None:
        """group_windows: each KV cache group's window (core/kv_groups.py), instead of the one
        sliding_window of every layer."""
        self.max_model_len = max_model_len
        self.enabled = enabled
        self.group_windows = (sliding_window,) if group_windows is None else group_windows
        self.fraction = INITIAL_FRACTION
        # speculative decoding's k: a request still generating may hold that many draft
        # positions past its known tokens (core/spec_plan.py)
        self.num_draft_positions = 0

    def observe_finished(self, request: Request) -> None:
        """A request stopped (not aborted): how much of its allowance it used."""
        allowance = self._output_allowance(request.max_tokens, len(request.prompt_token_ids))
        if allowance > 0:
            used = min(len(request.output_token_ids) / allowance, 1.0)
            self.fraction += AVERAGE_WEIGHT * (used - self.fraction)

    def tokens(self, request: Request, num_kv_tokens: int) -> float:
        """Tokens the request is expected to add to the KV cache beyond its first num_kv_tokens."""
        if not self.enabled:
            return 0.0
        num_outputs = len(request.output_token_ids) + request.num_output_placeholders
        allowance = self._output_allowance(request.max_tokens, len(request.prompt_token_ids))
        num_uncomputed = max(request.num_tokens - num_kv_tokens, 0)
        num_left = max(allowance - num_outputs, 0)
        drafts = self.num_draft_positions if num_left else 0
        return num_uncomputed + self.fraction * num_left + drafts

    def blocks(
        self, request: Request, num_kv_tokens: int, block_size: int, num_held: int | None = None
    ) -> int:
        """Blocks beyond the cdiv(num_kv_tokens, block_size) that hold its first num_kv_tokens.
        With a sliding window: beyond num_held, the blocks it holds, up to the most it will hold,
        during the rest of its prompt (in one chunk at worst) or once it has its expected tokens."""
        if len(self.group_windows) > 1:  # each group's, from its own capped footprint
            return sum(
                self._blocks(request, num_kv_tokens, block_size, None, window)
                for window in self.group_windows
            )
        return self._blocks(request, num_kv_tokens, block_size, num_held, self.group_windows[0])

    def _blocks(
        self,
        request: Request,
        num_kv_tokens: int,
        block_size: int,
        num_held: int | None,
        window: int | None,
    ) -> int:
        expected = math.ceil(num_kv_tokens + self.tokens(request, num_kv_tokens))
        if window is None:
            return max(cdiv(expected, block_size) - cdiv(num_kv_tokens, block_size), 0)
        peak = num_held_blocks(expected, window, block_size)
        num_uncomputed = max(request.num_tokens - num_kv_tokens, 0)
        if num_uncomputed and self.enabled:
            rest_of_prompt = cdiv(num_kv_tokens + num_uncomputed, block_size)
            peak = max(peak, rest_of_prompt - num_skipped_blocks(num_kv_tokens, window, block_size))
        if num_held is None:
            num_held = num_held_blocks(num_kv_tokens, window, block_size)
        return max(peak - num_held, 0)

    def _output_allowance(self, max_tokens: int, num_prompt: int) -> int:
        return min(max_tokens, self.max_model_len - num_prompt, MAX_ESTIMATED_OUTPUTS)


class AdmissionReserve:
    """One step's admission: the blocks each candidate must leave free, from the running requests
    (sorted by sort_key, as Scheduler.running is) and those admitted so far in the step."""

    def __init__(
        self,
        running: list[Request],
        growth: GrowthEstimate,
        block_size: int,
        sort_key: Callable[[Request], Hashable],
        num_held: Callable[[Request], int],
    ) -> None:
        """num_held: the blocks a running request holds."""
        self._growth = growth
        self._block_size = block_size
        self._keys = [sort_key(request) for request in running]
        growth_blocks = (
            growth.blocks(r, r.num_computed_tokens, block_size, num_held(r)) for r in running
        )
        self._prefix_sums = list(itertools.accumulate(growth_blocks, initial=0))
        self._admitted: list[tuple[Hashable, int]] = []  # (sort key, growth blocks)

    def blocks_to_keep(
        self, request: Request, key: Hashable, num_kv_tokens: int, num_held: int
    ) -> tuple[int, int]:
        """-> (blocks to leave free if `request` is admitted holding num_kv_tokens in num_held
        blocks, its own growth blocks): its growth plus that of everyone ranked before it; 0 when
        it would be alone."""
        own = self._growth.blocks(request, num_kv_tokens, self._block_size, num_held)
        if not self._keys and not self._admitted:
            return 0, own
        before = self._prefix_sums[bisect.bisect_left(self._keys, key)]
        before += sum(blocks for other, blocks in self._admitted if other < key)
        return own + before, own

    def admit(self, key: Hashable, own_blocks: int) -> None:
        self._admitted.append((key, own_blocks))
