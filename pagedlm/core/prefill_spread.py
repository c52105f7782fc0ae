"""Prefill spreading: how many prompt tokens a step computes, and in what order waiting requests
are admitted, when outputs differ in length (issue 31, workload T4).

A run cannot end before its longest output has decoded, one token a step. Spending every step's
whole budget on prompts front-loads the prefill: the first steps are 16k-token prompt steps, and
the run ends in a long thin tail where a few long outputs decode alone, each step paying the
weight read for a handful of rows. Spread over the run instead, prompt tokens ride on decode steps
whose GEMMs have spare compute under that weight read. Three rules:

- Order. A request's slack is how many steps its start can wait before its outputs would end
  after the longest one: horizon - its outputs still allowed (max_tokens), the horizon being the
  most outputs still allowed to any unfinished request. Waiting requests are admitted by slack
  (longest outputs first; ties in arrival order).
- Budget. A step's prompt tokens are what keeps every request on time, the most over k of (tokens
  to compute of the k least-slack requests) / (the k-th slack + 1), and at least what fills the
  step to `target_rows` rows beside its decodes.
- Bound. A request that has waited `max_wait_steps` steps has no slack left, nor has a preempted
  one: both are admitted at once, whatever budget that takes. No request is held longer.

When outputs are all alike (T0, T2, T3, serving with one max_tokens) every slack is 0 and the
budget is the step's whole budget: the schedule is the plain one. The slack trusts max_tokens as
the output's length (exact under ignore_eos; an EOS only ends a request sooner). The priority
policy keeps its own order (the scheduler builds no spread for it).

Off by default (PAGEDLM_PREFILL_SPREAD=1 turns it on): the cost model gives T4 12.64 s against
13.83, but on the H200 it took 17.52 s against 15.55 (s22). Its ~1,000 steps are all mixed steps,
each 4.75 ms over the model (decode steps: 1.66): a mixed step runs the piecewise graphs with
eager attention, and its decode rows take the varlen kernel, unsplit (triton_backend.py). It can
pay once a mixed step's decode rows take the split decode and small prompt chunks cost what the
model says (benchmarks/results/2026-12-02-h200-s22/t4/NOTES.md).
"""

from __future__ import annotations

import math

from pagedlm.request import Request

TARGET_ROWS = 256  # a step's rows (decodes + prompt tokens) the spread fills up to
MAX_WAIT_STEPS = 1024  # the most steps a waiting request is held for the spread


class PrefillSpread:
    def __init__(
        self,
        max_num_batched_tokens: int,
        target_rows: int = TARGET_ROWS,
        max_wait_steps: int = MAX_WAIT_STEPS,
    ) -> None:
        self.max_num_batched_tokens = max_num_batched_tokens
        self.target_rows = target_rows
        self.max_wait_steps = max_wait_steps
        self._waiting_since: dict[str, int] = {}  # request id -> the step it was first seen waiting
        self._step = 0

    def plan(self, running: list[Request], waiting: list[Request]) -> int:
        """Once a step, before scheduling: sorts `waiting` into admission order (stable) and
        returns the step's budget of prompt tokens (tokens of requests not yet decoding)."""
        self._step += 1
        self._waiting_since = {
            r.request_id: self._waiting_since.get(r.request_id, self._step) for r in waiting
        }
        if not waiting and not any(_tokens_to_catch_up(r) > 1 for r in running):
            return self.max_num_batched_tokens
        horizon = max(map(_outputs_left, running + waiting))
        slack = {r.request_id: self._slack(r, horizon) for r in waiting}
        waiting.sort(key=lambda r: slack[r.request_id])
        # requests still computing their prompt, least slack first (running ones come first in
        # the step, so they are counted first at equal slack)
        catching_up = [r for r in running if _tokens_to_catch_up(r) > 1]
        owed = sorted(
            [(max(horizon - _outputs_left(r), 0), _tokens_to_catch_up(r)) for r in catching_up]
            + [(slack[r.request_id], _tokens_to_catch_up(r)) for r in waiting],
            key=lambda item: item[0],
        )
        needed, cumulative = 0, 0
        for request_slack, tokens in owed:
            cumulative += tokens
            needed = max(needed, math.ceil(cumulative / (request_slack + 1)))
        num_decodes = len(running) - len(catching_up)
        budget = max(needed, self.target_rows - num_decodes)
        return min(budget, self.max_num_batched_tokens)

    def _slack(self, request: Request, horizon: int) -> int:
        if request.num_preemptions:
            return 0
        waited = self._step - self._waiting_since[request.request_id]
        return max(min(horizon - _outputs_left(request), self.max_wait_steps - waited), 0)


def _outputs_left(request: Request) -> int:
    """Outputs still allowed: max_tokens less those sampled (received or in flight)."""
    return request.max_tokens - len(request.output_token_ids) - request.num_output_placeholders


def _tokens_to_catch_up(request: Request) -> int:
    """Known tokens (prompt and received outputs) whose KV is not computed: 1 for a decode."""
    return request.num_tokens - request.num_computed_tokens
