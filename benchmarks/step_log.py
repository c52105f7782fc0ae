"""A per-step log of an EngineCore's schedule, host clock only (no profiler, no device sync):
for each step its launch and collection times, rows, tokens and kind (prefill: prompt chunks
only; decode: one-token decode rows only; mixed: both), and each request's prompt length, first
schedule, finish and output length. Offline: `StepLog.attach(llm.llm_engine.engine_core)`.
In the server's core process: benchmarks/steplog_site/sitecustomize.py attaches one that writes
a CSV line per step (`PAGEDLM_BENCH_STEP_LOG`). `summarize` prints the timeline.

A step's wall time is the gap between its collection and the previous one's: with async
scheduling the host collects a step while the next one runs, so in a device-bound run that gap
is the device's time for the step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import IO, Any

KINDS = ("prefill", "mixed", "decode")


@dataclass
class StepRecord:
    step_id: int
    launched: float  # perf_counter seconds
    rows: int  # requests in the step
    tokens: int
    prompt_tokens: int  # tokens of prompt chunks
    decode_rows: int
    sampled: int  # rows that sample (LM-head rows)
    decode_kv_tokens: int  # context tokens the decode rows read
    prefill_visible: int  # sum over prompt-chunk query tokens of the keys each sees
    done: float = 0.0  # when its output was collected

    @property
    def kind(self) -> str:
        if self.decode_rows == self.rows:
            return "decode"
        return "prefill" if self.decode_rows == 0 else "mixed"


@dataclass
class RequestRecord:
    prompt_len: int
    first_scheduled: float
    finished: float = 0.0
    output_len: int = 0


@dataclass
class StepLog:
    steps: list[StepRecord] = field(default_factory=list)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    sink: IO[str] | None = None  # a CSV line per collected step, when set
    pending: dict[int, StepRecord] = field(default_factory=dict)
    seconds_in: dict[str, float] = field(default_factory=dict)  # timed() phases

    @classmethod
    def attach(cls, core: Any, sink: IO[str] | None = None) -> StepLog:
        """Wraps the core's scheduler.schedule and update_from_output (instance attributes)."""
        log = cls(sink=sink)
        scheduler = core.scheduler
        schedule, update = scheduler.schedule, scheduler.update_from_output

        def logged_schedule() -> Any:
            plan = schedule()
            log.on_schedule(scheduler, plan)
            return plan

        def logged_update(plan: Any, runner_output: Any) -> Any:
            outputs = update(plan, runner_output)
            log.on_update(plan, outputs)
            return outputs

        scheduler.schedule, scheduler.update_from_output = logged_schedule, logged_update
        if sink is not None:
            sink.write("step,launched,done,rows,tokens,prompt_tokens,decode_rows,send_s\n")
        return log

    def on_schedule(self, scheduler: Any, plan: Any) -> None:
        now = time.perf_counter()
        prompt_tokens = decode_rows = decode_kv = visible = 0
        for req_id, num in plan.num_scheduled_tokens.items():
            request = scheduler.requests[req_id]
            context = request.num_computed_tokens - num  # schedule() has counted this step's
            if context < request.num_prompt_tokens:
                prompt_tokens += num
                visible += num * context + num * (num + 1) // 2
            else:
                decode_rows += 1
                decode_kv += context + num
        for new in plan.new_reqs:
            if new.req_id not in self.requests:  # a preempted request comes back: keep the first
                self.requests[new.req_id] = RequestRecord(len(new.prompt_token_ids), now)
        if plan.num_scheduled_tokens:
            self.pending[plan.step_id] = StepRecord(
                plan.step_id,
                now,
                len(plan.num_scheduled_tokens),
                plan.total_num_scheduled_tokens,
                prompt_tokens,
                decode_rows,
                len(plan.sampling_req_ids),
                decode_kv,
                visible,
            )

    def on_update(self, plan: Any, outputs: list[Any]) -> None:
        now = time.perf_counter()
        for out in outputs:
            record = self.requests.get(out.req_id)
            if record is not None:
                record.output_len += len(out.new_token_ids)
                if out.finish_reason is not None:
                    record.finished = now
        step = self.pending.pop(plan.step_id, None)
        if step is None:
            return
        step.done = now
        self.steps.append(step)
        if self.sink is not None:
            self.sink.write(
                f"{step.step_id},{step.launched:.6f},{step.done:.6f},{step.rows},{step.tokens},"
                f"{step.prompt_tokens},{step.decode_rows},{self.seconds_in.get('send', 0.0):.6f}\n"
            )

    def timed(self, name: str, fn: Any) -> Any:
        """fn, its host seconds added to seconds_in[name]."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds_in[name] = self.seconds_in.get(name, 0.0) + time.perf_counter() - start

        return wrapper


def step_seconds(steps: list[StepRecord]) -> list[float]:
    """Each step's wall time: from the previous collection (or its own launch) to its own."""
    return [s.done - (steps[i - 1].done if i else s.launched) for i, s in enumerate(steps)]


def summarize(log: StepLog, start: float, tail_rows: int = 16) -> dict[str, Any]:
    """Prints the timeline of a run that began at `start` (perf_counter) and returns its figures."""
    steps, requests = log.steps, log.requests
    wall = steps[-1].done - start
    durations = step_seconds(steps)
    print(f"{len(steps)} steps, {len(requests)} requests, {wall:.2f} s")
    print(f"{'kind':8} {'steps':>6} {'tokens':>9} {'rows/step':>10} {'seconds':>8} {'ms/step':>8}")
    by_kind = {}
    for kind in KINDS:
        picked = [(s, d) for s, d in zip(steps, durations) if s.kind == kind]
        seconds = sum(d for _, d in picked)
        tokens = sum(s.tokens for s, _ in picked)
        rows = sum(s.rows for s, _ in picked) / max(len(picked), 1)
        by_kind[kind] = {"steps": len(picked), "tokens": tokens, "seconds": seconds}
        ms = 1e3 * seconds / max(len(picked), 1)
        print(f"{kind:8} {len(picked):6d} {tokens:9d} {rows:10.1f} {seconds:8.2f} {ms:8.2f}")
    print(
        f"{'tenth':>5} {'t0 s':>6} {'steps':>6} {'rows':>6} {'tok/step':>9} {'ms/step':>8} "
        f"{'prefill tok':>11} {'out tok':>8}"
    )
    width = wall / 10
    for i in range(10):
        part = [
            (s, d)
            for s, d in zip(steps, durations)
            if i * width <= s.done - start < (i + 1) * width
        ]
        if not part:
            continue
        n = len(part)
        print(
            f"{i + 1:5d} {i * width:6.2f} {n:6d} {sum(s.rows for s, _ in part) / n:6.1f} "
            f"{sum(s.tokens for s, _ in part) / n:9.0f} {1e3 * sum(d for _, d in part) / n:8.2f} "
            f"{sum(s.prompt_tokens for s, _ in part):11d} "
            f"{sum(s.decode_rows for s, _ in part):8d}"
        )
    tail = _tail(steps, durations, tail_rows)
    print(
        f"tail (from the last step with > {tail_rows} rows): {tail['steps']} steps, "
        f"{tail['seconds']:.2f} s ({100 * tail['seconds'] / wall:.0f}% of the run), "
        f"{tail['tokens']} tokens, median {tail['median_ms']:.2f} ms/step"
    )
    figures = {"wall_s": wall, "steps": len(steps), "by_kind": by_kind, "tail": tail}
    figures["requests"] = _notable_requests(requests, start)
    return figures


def _tail(steps: list[StepRecord], durations: list[float], tail_rows: int) -> dict[str, Any]:
    last_big = max((i for i, s in enumerate(steps) if s.rows > tail_rows), default=-1)
    part = list(zip(steps[last_big + 1 :], durations[last_big + 1 :]))
    return {
        "steps": len(part),
        "seconds": sum(d for _, d in part),
        "tokens": sum(s.tokens for s, _ in part),
        "median_ms": 1e3 * statistics.median([d for _, d in part]) if part else 0.0,
    }


def _notable_requests(requests: dict[str, RequestRecord], start: float) -> dict[str, Any]:
    """The longest prompt, the longest output and the last to finish: their start and end."""
    picks = {
        "longest prompt": max(requests.items(), key=lambda kv: kv[1].prompt_len),
        "longest output": max(requests.items(), key=lambda kv: kv[1].output_len),
        "last to finish": max(requests.items(), key=lambda kv: kv[1].finished),
    }
    out = {}
    for label, (req_id, r) in picks.items():
        out[label] = {
            "id": req_id,
            "prompt_len": r.prompt_len,
            "output_len": r.output_len,
            "first_scheduled_s": r.first_scheduled - start,
            "finished_s": r.finished - start,
        }
        print(
            f"{label:15} {req_id:>8}: prompt {r.prompt_len:5d}, output {r.output_len:5d}, "
            f"first scheduled {r.first_scheduled - start:6.2f} s, finished {r.finished - start:6.2f} s"
        )
    late = sorted(requests.values(), key=lambda r: r.first_scheduled)
    admitted_at = [r.first_scheduled - start for r in late]
    out["all_admitted_s"] = admitted_at[-1]
    print(f"every request scheduled once by {admitted_at[-1]:.2f} s")
    return out
