"""The engine core as LLMEngine calls it (add_request / abort_requests / finish_requests), living in
other processes: every call becomes a message. At data_parallel_size N there are N core
processes (dp ranks): a new core request goes to the rank with the fewest core requests in flight
(the first on ties, as vLLM's queue-length balancer), its abort or stop-string finish to that
rank. The samples of one request (n > 1) go to one rank together (`one_rank`), where they share
the prompt's KV blocks. It also keeps, per core request, what admission control and the latency metrics need: its
rank, in flight or not, still in prefill or not, and its times."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pagedlm.engine import wire
from pagedlm.request import Request
from pagedlm.server.metrics import FinishedRequestTimes, ServerMetrics


@dataclass(slots=True)
class _CoreRequest:
    rank: int
    num_prompt_tokens: int
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_output_tokens: int = 0


class RemoteCore:
    def __init__(self, sends: list[Callable[[bytes], None]], metrics: ServerMetrics) -> None:
        """sends: per dp rank, how a message reaches that core."""
        self._sends = sends
        self._metrics = metrics
        self._encoder = wire.encoder()
        self._requests: dict[str, _CoreRequest] = {}  # core requests in flight
        self.num_in_flight_per_rank = [0] * len(sends)
        self._pinned_rank: int | None = None  # inside one_rank(): where every add goes
        self.num_prefill_tokens = 0  # prompt tokens of in-flight requests without a first token

    @property
    def num_ranks(self) -> int:
        return len(self._sends)

    @property
    def num_in_flight(self) -> int:
        return len(self._requests)

    def send_to_all(self, msg: wire.ToCore) -> None:
        data = self._encoder.encode(msg)
        for send in self._sends:
            send(data)

    @contextmanager
    def one_rank(self) -> Iterator[None]:
        """The requests added inside go to one rank: the least loaded as it begins."""
        counts = self.num_in_flight_per_rank
        self._pinned_rank = counts.index(min(counts))
        try:
            yield
        finally:
            self._pinned_rank = None

    def add_request(self, request: Request) -> None:
        counts = self.num_in_flight_per_rank
        rank = counts.index(min(counts)) if self._pinned_rank is None else self._pinned_rank
        self._sends[rank](
            self._encoder.encode(
                wire.AddRequest(
                    request_id=request.request_id,
                    prompt_token_ids=request.prompt_token_ids,
                    sampling_params=request.sampling_params,
                    max_tokens=request.max_tokens,
                    arrival_time=request.arrival_time,
                    priority=request.priority,
                    cache_salt=request.cache_salt,
                )
            )
        )
        self._requests[request.request_id] = _CoreRequest(
            rank, request.num_prompt_tokens, request.arrival_time
        )
        counts[rank] += 1
        self.num_prefill_tokens += request.num_prompt_tokens
        self._metrics.observe_routed(rank)

    def abort_requests(self, request_ids: list[str]) -> None:
        self._send_by_rank(request_ids, stopped=False)
        for req_id in request_ids:
            self._finish(req_id, "abort", time.time())

    def finish_requests(self, request_ids: list[str]) -> None:
        """Requests a stop string ended in the front end."""
        self._send_by_rank(request_ids, stopped=True)
        for req_id in request_ids:
            self._finish(req_id, "stop", time.time())

    def _send_by_rank(self, request_ids: list[str], stopped: bool) -> None:
        """An AbortRequests to each rank that owns some of `request_ids` (the others are done)."""
        by_rank: dict[int, list[str]] = {}
        for req_id in request_ids:
            request = self._requests.get(req_id)
            if request is not None:
                by_rank.setdefault(request.rank, []).append(req_id)
        for rank, ids in by_rank.items():
            self._sends[rank](self._encoder.encode(wire.AbortRequests(ids, stopped=stopped)))

    def on_outputs(self, msg: wire.CoreOutputs) -> None:
        now = time.time()
        for req_id, when in msg.first_scheduled.items():
            if req_id in self._requests:
                self._requests[req_id].first_scheduled = when
        for out in msg.outputs:
            request = self._requests.get(out.req_id)
            if request is None:  # finished here already (stop string, abort)
                continue
            if out.new_token_ids:
                self._on_tokens(request, len(out.new_token_ids), now)
            if out.finished:
                self._finish(out.req_id, out.finish_reason, now)
        for req_id in msg.errors:
            self._finish(req_id, "abort", now)

    def _on_tokens(self, request: _CoreRequest, num_new: int, now: float) -> None:
        if request.first_token is None:
            request.first_token = now
            self.num_prefill_tokens -= request.num_prompt_tokens
            self._metrics.observe_first_tokens(num_new)
        else:
            self._metrics.observe_token_gap(now - request.last_token, num_new)
        request.last_token = now
        request.num_output_tokens += num_new

    def _finish(self, req_id: str, reason: str, now: float) -> None:
        request = self._requests.pop(req_id, None)
        if request is None:
            return
        self.num_in_flight_per_rank[request.rank] -= 1
        if request.first_token is None:
            self.num_prefill_tokens -= request.num_prompt_tokens
        self._metrics.observe_finished(
            FinishedRequestTimes(
                arrival=request.arrival,
                first_scheduled=request.first_scheduled,
                first_token=request.first_token,
                finished=now,
                num_prompt_tokens=request.num_prompt_tokens,
                num_output_tokens=request.num_output_tokens,
                finish_reason=reason,
            )
        )
