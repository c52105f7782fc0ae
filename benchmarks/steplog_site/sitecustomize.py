"""On the path (PYTHONPATH) with PAGEDLM_BENCH_STEP_LOG=PREFIX set: every EngineCore built in a
process of this Python (the server's core process too) logs its steps to PREFIX.<pid>.csv
(benchmarks/step_log.py; one line a step, with the core's cumulative seconds sending outputs to
the front end). For benchmarks only: it changes nothing else."""

import os

_PREFIX = os.environ.get("PAGEDLM_BENCH_STEP_LOG")


def _install(prefix: str) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from step_log import StepLog

    from pagedlm.engine import core_process, engine_core

    init = engine_core.EngineCore.__init__

    def logged_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        sink = open(f"{prefix}.{os.getpid()}.csv", "w", buffering=1)  # noqa: SIM115 - line-buffered: the core exits by os._exit
        self.bench_step_log = StepLog.attach(self, sink)

    engine_core.EngineCore.__init__ = logged_init
    send = core_process.CoreLoop._send

    def timed_send(self, *args, **kwargs):
        log = getattr(self.core, "bench_step_log", None)
        if log is None:
            return send(self, *args, **kwargs)
        return log.timed("send", send)(self, *args, **kwargs)

    core_process.CoreLoop._send = timed_send


if _PREFIX:
    _install(_PREFIX)
