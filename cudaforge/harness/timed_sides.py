"""The sides that interleave.py's drivers time, in an evaluation: one model's eager forwards, or
the replays of its CUDA graph. Before every run, on the harness stream and outside the CUDA
events: the persisting-L2 check, fresh values into the input buffers, the L2 flush; then the
forward (or the replay) between two CUDA events, read once the end event has completed. On a CPU
a run is timed by the wall clock as it runs."""

from __future__ import annotations

import time
from typing import Any


class EagerSide:
    """Runs of `model` on `buffers` (rotating), run i filling its buffer with values from
    seed + i + 1 and flushing with index first + i. `settings`: put the harness's torch settings
    back before every run (interleaved sides: what one side changes must not reach the other)."""

    def __init__(self, run, model, who: str, buffers: list, seed: int, first: int = 0, *,
                 settings: bool = False, where: str | None = None):  # fmt: skip
        self.run = run
        self.model = model
        self.who = who
        self.buffers = buffers
        self.seed = seed
        self.first = first
        self.settings = settings
        # whose fault a failure found while waiting is (see Evaluation.fail_from_exception)
        self.where = where or ("forward" if who == "candidate" else who)

    def queue(self, index: int) -> Any:
        run = self.run
        k = (self.first + index) % len(self.buffers)
        if run.cuda:
            run.check_l2()
        if self.settings:
            run.settings.apply()
        fresh = self.seed + index + 1 if run.opts.fresh_inputs else None
        run.prepare_run(self.buffers[k], fresh, self.first + index)
        if not run.cuda:
            started = time.perf_counter_ns()
            out = run.call(self.model, self.buffers[k], self.who)
            del out
            return (time.perf_counter_ns() - started) / 1e6
        start, end = _events(run.torch)
        start.record()
        out = run.call(self.model, self.buffers[k], self.who)
        end.record()
        del out
        return start, end

    def read(self, handle: Any) -> float:
        return _read(self.run, handle, self.where)


class GraphSide:
    """Replays of a CapturedForward (graphs.py), its static inputs refilled before each."""

    def __init__(self, run, captured, who: str, seed: int, first: int = 0):
        self.run = run
        self.captured = captured
        self.who = who
        self.seed = seed
        self.first = first

    def queue(self, index: int) -> Any:
        run = self.run
        run.check_l2()
        fresh = self.seed + index + 1 if run.opts.fresh_inputs else None
        run.prepare_run(self.captured.inputs, fresh, self.first + index)
        start, end = _events(run.torch)
        start.record()
        self.captured.graph.replay()
        end.record()
        return start, end

    def read(self, handle: Any) -> float:
        return _read(self.run, handle, "graph replay")


def _events(torch):
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _read(run, handle: Any, where: str) -> float:
    """The ms of a queued run: a float as is (CPU), else the CUDA events' time, once the end
    event completed; a CUDA error met while waiting becomes the result."""
    if not isinstance(handle, tuple):
        return handle
    start, end = handle
    try:
        end.synchronize()
    except Exception as e:  # noqa: BLE001 - a fault in the queued work, found here
        run.fail_from_exception(e, where=where)
    return start.elapsed_time(end)


__all__ = ["EagerSide", "GraphSide"]
