"""AsyncRunnerOutput: a launched step whose results come back to the host on demand. Reading them
changes no state: the runner records the sampled tokens into their rows itself (sampled())."""

from __future__ import annotations

import numpy as np
import torch

from pagedlm.core.sched_output import Logprobs, ModelRunnerOutput
from pagedlm.worker.batch_layout import BatchLayout
from pagedlm.worker.prompt_logprobs import logprobs_row, to_logprobs_lists
from pagedlm.worker.spec_step import SpecOutput

HostTensors = tuple[torch.Tensor, ...]


class AsyncRunnerOutput:
    """A launched step. get_output() waits for this step's event (after its work and its
    device->host copies) and nothing else."""

    def __init__(
        self,
        step_id: int,
        layout: BatchLayout | None = None,
        # [>= num_samples] int64, (a view of) pinned memory: the first num_samples
        # are the step's sampled ids
        sampled_np: np.ndarray | None = None,
        logprobs_cpu: HostTensors | None = None,
        event: torch.cuda.Event | None = None,
        prompt_logprobs_cpu: HostTensors | None = None,
        spec: SpecOutput | None = None,  # speculative decoding: replaces sampled_np
    ) -> None:
        self._step_id = step_id
        self._layout = layout
        self._sampled_np = sampled_np
        self._logprobs_cpu = logprobs_cpu
        self._prompt_logprobs_cpu = prompt_logprobs_cpu
        self._event = event
        self._spec = spec
        self._result: ModelRunnerOutput | None = None

    def get_output(self) -> ModelRunnerOutput:
        """The step's results; the first call waits for the step's event. Idempotent."""
        if self._result is None:
            self._result = self._build()
        return self._result

    def is_done(self) -> bool:
        """Whether the step's work and host copies are complete: get_output() would not wait
        (asks the device, never waits for it)."""
        return self._event is None or self._event.query()

    @property
    def is_read(self) -> bool:
        """Whether get_output() was called (the step's host copies are complete)."""
        return self._result is not None

    def sampled(
        self,
    ) -> tuple[BatchLayout, np.ndarray] | tuple[BatchLayout, np.ndarray, np.ndarray] | None:
        """Once read: the step's layout and its sampled ids [num_samples] int64 (host memory, valid
        until the runner reuses the step's staging set); None when no request sampled. With
        speculative decoding: the layout, the tokens [num_samples, k + 1] and how many of each
        row were emitted [num_samples]."""
        assert self.is_read, "the output was not read"
        layout = self._layout
        if layout is None or layout.num_samples == 0:
            return None
        if self._spec is not None:
            return layout, self._spec.emitted_np, self._spec.num_accepted_np + 1
        return layout, self._sampled_np[: layout.num_samples]

    def _build(self) -> ModelRunnerOutput:
        result = ModelRunnerOutput(req_ids=[], sampled_token_ids=[], step_id=self._step_id)
        layout = self._layout
        if layout is None:
            return result
        if self._event is not None:
            self._event.synchronize()  # sync-ok: waits for this step (and its copies) only
        if layout.prompt_logprobs is not None:
            result.prompt_logprobs = to_logprobs_lists(
                layout.prompt_logprobs, self._prompt_logprobs_cpu
            )
        if layout.num_samples == 0:
            return result
        result.req_ids = layout.sampling_req_ids
        if self._spec is not None:
            self._build_spec(result, self._spec)
            return result
        token_ids_np = self._sampled_np[: layout.num_samples]  # host memory, copy complete
        result.sampled_token_ids = [[t] for t in token_ids_np.tolist()]  # sync-ok: host memory
        result.logprobs = self._logprobs()
        return result

    def _build_spec(self, result: ModelRunnerOutput, spec: SpecOutput) -> None:
        """spec.host_np [N, 2k + 3]: the emitted tokens, the accepted drafts, the drafts held
        next and their ids."""
        k = spec.k
        rows = spec.host_np.tolist()  # sync-ok: host memory, event waited
        result.sampled_token_ids = [row[: row[k + 1] + 1] for row in rows]
        result.num_draft_tokens = [row[k + 2] for row in rows]
        result.draft_token_ids = [row[k + 3 : k + 3 + row[k + 2]] for row in rows]
        if self._logprobs_cpu is None:
            return
        ids_np, logprobs_np, ranks_np = (t.numpy() for t in self._logprobs_cpu)  # sync-ok: host
        starts = self._spec.logits_start_np.tolist()  # sync-ok: numpy
        result.logprobs = [
            []
            if num < 0
            else [
                logprobs_row(ids_np, logprobs_np, ranks_np, start + j, 1 + num)
                for j in range(len(tokens))
            ]
            for num, start, tokens in zip(
                self._layout.sample_num_logprobs_np.tolist(),  # sync-ok: numpy
                starts,
                result.sampled_token_ids,
            )
        ]

    def _logprobs(self) -> list[list[Logprobs]] | None:
        """Per sampling request, the sampled token and its top-N (N as it asked; [] if it did
        not ask while others did)."""
        if self._logprobs_cpu is None:
            return None
        ids_np, logprobs_np, ranks_np = (
            t.numpy() for t in self._logprobs_cpu
        )  # sync-ok: host copies, event waited
        result: list[list[Logprobs]] = []
        for i, num in enumerate(self._layout.sample_num_logprobs_np.tolist()):  # sync-ok: numpy
            if num < 0:
                result.append([])
                continue
            result.append([logprobs_row(ids_np, logprobs_np, ranks_np, i, 1 + num)])
        return result
