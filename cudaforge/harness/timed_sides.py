"""The sides that interleave.py's drivers time, in an evaluation: one model's eager forwards, or
the replays of its CUDA graph. Before every run, on the harness stream and outside the CUDA
events: the persisting-L2 check, a spin that keeps the GPU busy while the host issues the run,
fresh values into the input buffers, the L2 flush; then the forward (or the
replay) between two CUDA events, read once the end event has completed. On a CPU a run is timed
by the wall clock as it runs.

The spin: a forward whose host work (Python, launches) takes longer than its GPU work leaves an
idle GPU waiting for the host between the events, and the events then time the host, with the
host's jitter. On the H200 the evaluations that spread 10-40% were those whose event time was
1.7-4x the GPU time CUPTI saw (RESULTS.md, "Timings users can trust"). Queued behind a spin of
1.5x the host's time to issue the run, the forward's launches are all in the queue before the
start event is reached, and the events time the GPU's work, as inside a model whose GPU is ahead
of the host. The host's time is kept (`host_ms`) and reported beside it."""

from __future__ import annotations

import statistics
import time
from typing import Any

AHEAD_FACTOR = 1.5  # spin this many times the host's time to issue a run
AHEAD_MARGIN_NS = 20_000  # plus this
AHEAD_MAX_NS = 5_000_000  # at most (a forward that syncs inside is host-timed regardless)
AHEAD_RECENT = 8  # the spin follows the slowest of this many recent issues


class _HostAhead:
    """What a side knows of the host's time to issue its runs, and the spin that follows it."""

    def __init__(self, host_s: float = 0.0):
        # ns the host took to issue each run (prepare + forward), and to issue the forward alone
        self.issue_ns: list[int] = [int(host_s * 1e9)] if host_s > 0 else []
        self.forward_ns: list[int] = []

    def ahead_ns(self) -> int:
        """The spin before the next run (module docstring); 0 with host_ahead=False."""
        if not getattr(self.run.opts, "host_ahead", True):
            return 0
        if not self.issue_ns:
            return AHEAD_MAX_NS // 5
        slowest = max(self.issue_ns[-AHEAD_RECENT:])
        return int(min(AHEAD_MAX_NS, AHEAD_FACTOR * slowest + AHEAD_MARGIN_NS))

    def host_ms(self) -> float | None:
        """Median ms the host took to issue one forward (its Python and launches)."""
        return statistics.median(self.forward_ns) / 1e6 if self.forward_ns else None

    def issued(self, issued: int, called: int, done: int) -> None:
        self.forward_ns.append(done - called)
        self.issue_ns.append(done - issued)


class EagerSide(_HostAhead):
    """Runs of `model` on `buffers` (rotating), run i filling its buffer with values from
    seed + i + 1 and flushing with index first + i. `settings`: put the harness's torch settings
    back before every run (interleaved sides: what one side changes must not reach the other)."""

    def __init__(self, run, model, who: str, buffers: list, seed: int, first: int = 0, *,
                 settings: bool = False, where: str | None = None,
                 host_s: float = 0.0):  # fmt: skip
        self.run = run
        self.model = model
        self.who = who
        self.buffers = buffers
        self.seed = seed
        self.first = first
        self.settings = settings
        # whose fault a failure found while waiting is (see Evaluation.fail_from_exception)
        self.where = where or ("forward" if who == "candidate" else who)
        super().__init__(host_s)

    def queue(self, index: int) -> Any:
        run = self.run
        k = (self.first + index) % len(self.buffers)
        if run.cuda:
            run.check_l2()
        if self.settings:
            run.settings.apply()
        fresh = self.seed + index + 1 if run.opts.fresh_inputs else None
        issued = time.perf_counter_ns()
        if not run.cuda:
            run.prepare_run(self.buffers[k], fresh, self.first + index)
            started = time.perf_counter_ns()
            out = run.call(self.model, self.buffers[k], self.who)
            del out
            return (time.perf_counter_ns() - started) / 1e6
        run.prepare_run(self.buffers[k], fresh, self.first + index, ahead_ns=self.ahead_ns())
        start, end = _events(run.torch)
        start.record()
        called = time.perf_counter_ns()
        out = run.call(self.model, self.buffers[k], self.who)
        end.record()
        del out
        self.issued(issued, called, time.perf_counter_ns())
        return start, end

    def read(self, handle: Any) -> float:
        return _read(self.run, handle, self.where)


class GraphSide(_HostAhead):
    """Replays of a CapturedForward (graphs.py), its static inputs refilled before each. The
    spin covers the replay's launch too: on an idle GPU the start event runs at once and the
    few us the host takes to launch the graph fell inside the window (a 10 us forward's replays
    spread 9-60% on the H200)."""

    def __init__(self, run, captured, who: str, seed: int, first: int = 0):
        super().__init__()
        self.run = run
        self.captured = captured
        self.who = who
        self.seed = seed
        self.first = first

    def queue(self, index: int) -> Any:
        run = self.run
        run.check_l2()
        fresh = self.seed + index + 1 if run.opts.fresh_inputs else None
        issued = time.perf_counter_ns()
        run.prepare_run(self.captured.inputs, fresh, self.first + index,
                        ahead_ns=self.ahead_ns())  # fmt: skip
        start, end = _events(run.torch)
        start.record()
        called = time.perf_counter_ns()
        gap_ns = int(getattr(run.opts, "replay_gap_us", 0.0) * 1000)
        while gap_ns and time.perf_counter_ns() - called < gap_ns:
            pass  # opts.replay_gap_us: the host waits before launching the replay
        self.captured.graph.replay()
        end.record()
        self.issued(issued, called, time.perf_counter_ns())
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
