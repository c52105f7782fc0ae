"""Prometheus metrics with vLLM's names under the `pagedlm:` prefix, and the periodic log line.

Gauges and the scheduler's cumulative counters come from the engine core's stats; per-request
latencies are observed by the front end when a request finishes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from pagedlm.engine.wire import CoreStats

logger = logging.getLogger("pagedlm.server")

FINISH_REASONS = ("stop", "length", "abort")
REJECT_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_TOKEN_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


@dataclass(slots=True)
class FinishedRequestTimes:
    """Wall-clock times (time.time()) of one engine request, observed when it finishes."""

    arrival: float
    first_scheduled: float | None
    first_token: float | None
    finished: float
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str


class _WithoutCreated:
    """The registry's families without the `<name>_created` samples prometheus_client adds to
    counters and histograms (creation times, one more series each; vLLM turns them off too).
    Dropped here, for this registry only: the library's switch, disable_created_metrics(), is
    process-global and would change every other registry in the process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            created = family.name + "_created"
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if s.name != created]
            yield kept


SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # by sleep level (vLLM's labels)


class ServerMetrics:
    def __init__(self, model_name: str, num_engines: int = 1) -> None:
        """num_engines: the engine cores (data_parallel_size); their stats come summed."""
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.num_engines = num_engines
        self._last = CoreStats()
        self._init_gauges_and_counters()
        self._init_histograms()
        # observed per request and step: the labelled series looked up once
        self._generation_tokens = self._m(self.generation_tokens)
        self._itl = self._m(self.itl)
        self._log_prompt_tokens = 0
        self._log_generation_tokens = 0
        self._log_time = time.monotonic()

    def _init_gauges_and_counters(self) -> None:
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"pagedlm:{name}", doc, labels, registry=self.registry)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"pagedlm:{name}", doc, labels + list(extra), registry=self.registry)

        self.num_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("num_preemptions", "Requests preempted by the scheduler.")
        self.kernel_compiles = counter(
            "kernel_compiles_while_serving",
            "Triton kernel compiles a step waited for (0 when start-up covered all).",
        )
        self.grammar_compiles = counter("grammar_compiles", "Structured-output grammars compiled.")
        self.grammar_compile_seconds = counter(
            "grammar_compile_seconds", "Seconds spent compiling structured-output grammars."
        )
        self.grammar_compile_waits = counter(
            "grammar_compile_waits",
            "Steps the engine loop blocked on a grammar compile (nothing else could run).",
        )
        self.spec_drafts = counter(
            "spec_decode_num_drafts", "Speculative steps of requests (steps that verified drafts)."
        )
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted = counter(
            "spec_decode_num_accepted_tokens", "Draft tokens the target accepted."
        )
        self.spec_accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft (0 first).",
            ("position",),
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.request_success = counter(
            "request_success", "Finished requests by reason.", ("finished_reason",)
        )
        self.rejected = counter(
            "num_requests_rejected", "Requests refused by admission control.", ("reason",)
        )
        self.routed = counter(
            "engine_requests_routed",
            "Core requests (one per sample) the front end sent to each engine core (dp rank).",
            ("engine",),
        )
        self.sleep_state = Gauge(
            "pagedlm:engine_sleep_state",
            "1 for the engine's sleep state now (vLLM's: awake, weights_offloaded = level 1, "
            "discard_all = level 2), 0 for the others.",
            labels + ["sleep_state"],
            registry=self.registry,
        )
        self.set_sleep_level(0)
        # Every series exists from the start (at 0), so dashboards and rates see it.
        for metric in (
            self.num_running,
            self.num_waiting,
            self.kv_usage,
            self.prefix_queries,
            self.prefix_hits,
            self.preemptions,
            self.kernel_compiles,
            self.grammar_compiles,
            self.grammar_compile_seconds,
            self.grammar_compile_waits,
            self.spec_drafts,
            self.spec_draft_tokens,
            self.spec_accepted,
            self.prompt_tokens,
            self.generation_tokens,
        ):
            metric.labels(model_name=self.model_name)
        for reason in FINISH_REASONS:
            self.request_success.labels(model_name=self.model_name, finished_reason=reason)
        for reason in REJECT_REASONS:
            self.rejected.labels(model_name=self.model_name, reason=reason)
        for engine in range(self.num_engines):
            self.routed.labels(model_name=self.model_name, engine=str(engine))

    def _init_histograms(self) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                f"pagedlm:{name}", doc, ["model_name"], buckets=buckets, registry=self.registry
            )

        self.ttft = histogram(
            "time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Time between two output tokens.", _TOKEN_LATENCY_BUCKETS
        )
        self.tpot = histogram(
            "request_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            _TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS)
        self.queue = histogram(
            "request_queue_time_seconds", "Arrival to first schedule.", _LATENCY_BUCKETS
        )

    def _m(self, metric):  # noqa: ANN001, ANN202 - any labelled metric
        return metric.labels(model_name=self.model_name)

    def update_core_stats(self, stats: CoreStats) -> None:
        self._m(self.num_running).set(stats.num_running)
        self._m(self.num_waiting).set(stats.num_waiting)
        self._m(self.kv_usage).set(stats.kv_cache_usage)
        for counter, now, before in (
            (self.prefix_queries, stats.prefix_cache_queries, self._last.prefix_cache_queries),
            (self.prefix_hits, stats.prefix_cache_hits, self._last.prefix_cache_hits),
            (self.preemptions, stats.num_preemptions, self._last.num_preemptions),
            (self.kernel_compiles, stats.num_kernel_compiles, self._last.num_kernel_compiles),
            (self.grammar_compiles, stats.num_grammar_compiles, self._last.num_grammar_compiles),
            (
                self.grammar_compile_seconds,
                stats.grammar_compile_seconds,
                self._last.grammar_compile_seconds,
            ),
            (
                self.grammar_compile_waits,
                stats.num_grammar_compile_waits,
                self._last.num_grammar_compile_waits,
            ),
            (self.spec_drafts, stats.spec_num_drafts, self._last.spec_num_drafts),
            (self.spec_draft_tokens, stats.spec_num_draft_tokens, self._last.spec_num_draft_tokens),
            (
                self.spec_accepted,
                stats.spec_num_accepted_tokens,
                self._last.spec_num_accepted_tokens,
            ),
        ):
            if now > before:
                self._m(counter).inc(now - before)
        before_per_pos = self._last.spec_accepted_per_pos
        for position, now in enumerate(stats.spec_accepted_per_pos):
            before = before_per_pos[position] if position < len(before_per_pos) else 0
            if now > before:
                self.spec_accepted_per_pos.labels(
                    model_name=self.model_name, position=str(position)
                ).inc(now - before)
        self._last = stats

    def observe_routed(self, engine: int) -> None:
        self.routed.labels(model_name=self.model_name, engine=str(engine)).inc()

    def set_sleep_level(self, level: int) -> None:
        """0: awake; 1 or 2: the level of the sleep now."""
        for index, state in enumerate(SLEEP_STATES):
            series = self.sleep_state.labels(model_name=self.model_name, sleep_state=state)
            series.set(1 if index == level else 0)

    def clear_core_state(self) -> None:
        """The core is dead: its running/waiting requests and KV blocks are gone (the counters
        keep what it did)."""
        self.update_core_stats(
            replace(self._last, num_running=0, num_waiting=0, kv_cache_usage=0.0)
        )

    def observe_token_gap(self, seconds: float, num_new_tokens: int) -> None:
        """A batch of output tokens that came `seconds` after the previous one (not the first)."""
        self._generation_tokens.inc(num_new_tokens)
        self._log_generation_tokens += num_new_tokens
        self._itl.observe(seconds)

    def observe_first_tokens(self, num_new_tokens: int) -> None:
        self._generation_tokens.inc(num_new_tokens)
        self._log_generation_tokens += num_new_tokens

    def observe_finished(self, times: FinishedRequestTimes) -> None:
        self.request_success.labels(
            model_name=self.model_name, finished_reason=times.finish_reason
        ).inc()
        self._m(self.prompt_tokens).inc(times.num_prompt_tokens)
        self._log_prompt_tokens += times.num_prompt_tokens
        self._m(self.e2e).observe(times.finished - times.arrival)
        if times.first_scheduled is not None:
            self._m(self.queue).observe(max(0.0, times.first_scheduled - times.arrival))
        if times.first_token is None:
            return
        self._m(self.ttft).observe(times.first_token - times.arrival)
        if times.num_output_tokens > 1:
            decode_time = times.finished - times.first_token
            self._m(self.tpot).observe(decode_time / (times.num_output_tokens - 1))

    def observe_rejected(self, reason: str) -> None:
        self.rejected.labels(model_name=self.model_name, reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))

    def log_line(self) -> None:
        """One line: load, KV usage, token throughput since the last line, prefix-cache hit rate."""
        now = time.monotonic()
        elapsed = max(now - self._log_time, 1e-6)
        stats = self._last
        hit_rate = (
            stats.prefix_cache_hits / stats.prefix_cache_queries
            if stats.prefix_cache_queries
            else 0.0
        )
        if (
            stats.num_running
            or stats.num_waiting
            or self._log_prompt_tokens
            or self._log_generation_tokens
        ):
            logger.info(
                "running: %d reqs, waiting: %d reqs, KV cache usage: %.1f%%, prompt: %.1f tokens/s, "
                "generation: %.1f tokens/s, prefix cache hit rate: %.1f%%",
                stats.num_running,
                stats.num_waiting,
                100 * stats.kv_cache_usage,
                self._log_prompt_tokens / elapsed,
                self._log_generation_tokens / elapsed,
                100 * hit_rate,
            )
        self._log_prompt_tokens = 0
        self._log_generation_tokens = 0
        self._log_time = now
