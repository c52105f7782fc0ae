"""structured_outputs_cost.py with the bitmask fill run inline on the engine thread (the A/B
against the filling thread): `python3 inline_fill.py <the cost bench's arguments>`."""

import runpy
import sys
from concurrent.futures import Future
from pathlib import Path

import pagedlm.structured_outputs.manager as manager


class Inline:
    def submit(self, fn, *args):  # noqa: ANN001, ANN002, ANN201
        done = Future()
        done.set_result(fn(*args))
        return done

    def shutdown(self, wait: bool = True) -> None:
        pass


_init = manager.StructuredOutputManager.__init__


def _inline_init(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
    _init(self, *args, **kwargs)
    self._filling = Inline()


manager.StructuredOutputManager.__init__ = _inline_init
bench = Path(__file__).resolve().parents[3] / "structured_outputs_cost.py"
sys.argv[0] = str(bench)
sys.path.insert(0, str(bench.parent))  # its gpu_workloads import
runpy.run_path(str(bench), run_name="__main__")
