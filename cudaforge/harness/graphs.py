"""CUDA-graph timing of short forwards. Under ~50 us a forward's time is mostly the host launching
it (Python, the launches), which jitters; a graph replay launches the same kernels at once, so
its time is the GPU's. Where either side's eager forward is that short, both sides are captured
and their replays timed by the same rule as the eager runs (fresh values into the graph's static
inputs and the L2 flush before each, outside the events); the speedup uses the graph times only
where both sides were captured, the eager times otherwise, and the result says which.

Capture follows torch's rules: the forward is first warmed up on a side stream (lazy module
loads, cuBLAS workspaces and the caching allocator's first blocks happen outside the capture),
captured on that stream (never the legacy default one), the inputs live in static buffers that
every replay reads, and the capture is thread-local (a call that cannot be captured fails the
capture, not the process). Any failure, and a replay
whose outputs on new values differ from the reference's eager forward on the same values (a
forward that did something else while captured), leaves that side "not capturable", with the
reason in timing["graph"]; only a failure that kills the CUDA context ends the evaluation."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .compare import check_outputs
from .evaluation import Evaluation, _context_alive, cloned, one_line, refill
from .interleave import time_fixed, time_interleaved
from .stopping import StoppingRule, TimeSummary
from .timed_sides import GraphSide

WARMUP_CALLS = 3  # eager calls on a side stream before the capture


@dataclass
class CapturedForward:
    """A forward captured in a CUDA graph: replaying `graph` reads `inputs` (refilled in place
    between replays) and writes `output`."""

    graph: Any
    inputs: list
    output: Any


def capture_forward(torch, model, inputs: list, device, warmup: int = WARMUP_CALLS):
    """`model(*inputs)` captured in a CUDA graph on static copies of `inputs`. Raises what the
    warm-up or the capture raised."""
    static = cloned(inputs)
    graph, output = capture_call(torch, lambda: model(*static), device, warmup)
    return CapturedForward(graph, static, output)


def capture_call(torch, call, device, warmup: int = WARMUP_CALLS):
    """(graph, output) of `call()` captured in a CUDA graph as it stands: its replays read the
    tensors the call reads, where they are. Raises what the warm-up or the capture raised. The
    capture is begun and ended directly, on a side stream, rather than with torch.cuda.graph(),
    which also collects Python garbage and empties the allocator's cache first (tens of ms per
    capture, twice per evaluation)."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        for _ in range(warmup):
            out = call()
            del out
        side.synchronize()
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            try:
                output = call()
            finally:
                graph.capture_end()  # raises when a call in the forward invalidated the capture
        except BaseException:
            _end_generator_capture(torch)
            raise
    current.wait_stream(side)
    torch.cuda.synchronize(device)
    return graph, output


def warm_capture(torch, device) -> None:
    """A tiny forward captured and replayed once, for a worker to start with (its first capture
    and replay of a graph are done before the evaluation's)."""
    x = torch.zeros(16, device=device)
    captured = capture_forward(torch, lambda t: t * 2 + 1, [x], device, warmup=1)
    captured.graph.replay()
    torch.cuda.synchronize(device)
    captured.graph.reset()


def _end_generator_capture(torch) -> None:
    """After a failed capture, put the CUDA random generators back out of capture mode.

    capture_begin() puts the default generator in capture mode, and capture_end() takes it out
    only after cudaStreamEndCapture succeeded; a forward that invalidated the capture leaves it
    in, and every random draw after it (the next check's inputs) raises "Offset increment outside
    graph capture encountered unexpectedly". An empty capture, begun and ended on the current
    (side) stream, ends the generator's capture mode cleanly; its graph is dropped."""
    import warnings

    empty = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "The CUDA Graph is empty ..."
        empty.capture_begin(capture_error_mode="thread_local")
        empty.capture_end()
    empty.reset()


def copied_output(torch, out):
    """`out` with every tensor cloned (a graph's output is overwritten by the next replay)."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (list, tuple)):
        return type(out)(copied_output(torch, v) for v in out)
    return out


class GraphTiming(Evaluation):
    """graph_timing() of an evaluation (TimingPhases inherits it)."""

    def graph_timing(self, cand: TimeSummary, ref: TimeSummary, rule: StoppingRule | None):
        """(candidate, reference) summaries of graph replays, or None when not timed (why in
        timing["graph"]). `rule`: the adaptive rule, or None for the fixed one."""
        r, opts = self.result, self.opts
        if not self.cuda:
            r.timing["graph"] = "not tried: needs a CUDA GPU"
            return None
        if not opts.cuda_graphs:
            r.timing["graph"] = "off (cuda_graphs=False)"
            return None
        shortest = min(cand.median_ms, ref.median_ms)
        if shortest >= opts.graph_below_ms:
            r.timing["graph"] = (
                f"not tried: the shorter forward takes {shortest:.4g} ms eagerly (graphs are "
                f"timed under {opts.graph_below_ms:g} ms)"
            )
            return None
        captured: list[CapturedForward] = []
        began = time.perf_counter()
        try:
            for model, who in ((self.candidate, "candidate"), (self.reference, "reference")):
                got = self.capture_side(model, who)
                if isinstance(got, str):
                    r.timing["graph"] = f"not capturable: {got}"
                    return None
                captured.append(got)
            r.timing["graph_capture_s"] = round(time.perf_counter() - began, 4)
            base = opts.seed + 500_000
            sides = [
                GraphSide(self, captured[0], "candidate", base),
                GraphSide(self, captured[1], "reference", base + 100_000),
            ]
            if rule is None:
                times = [time_fixed(side, opts.timed_runs) for side in sides]
                stops = ["fixed", "fixed"]
            else:
                times, stops = time_interleaved(sides, rule)
            self.sync("candidate")
            r.timing["graph"] = "on: both sides captured and their replays timed"
            for who, t in zip(("candidate", "reference"), times):
                r.timing[f"{who}_graph_runs_ms"] = [round(v, 6) for v in t]
            confidence = rule.confidence if rule is not None else StoppingRule().confidence
            return tuple(TimeSummary.of(t, s, confidence) for t, s in zip(times, stops))
        finally:
            for c in captured:
                c.graph.reset()
            captured.clear()

    def capture_side(self, model, who: str) -> CapturedForward | str:
        """The side's forward captured and checked (module docstring), or why it could not be."""
        torch, opts = self.torch, self.opts
        parts = self.result.timing.setdefault("graph_capture_parts", {}).setdefault(who, {})
        began = time.perf_counter()
        inputs = self.problem.make_inputs(opts.seed + 450_000, self.device, self.ref_module)
        self.settings.apply()
        parts["inputs_s"] = round(time.perf_counter() - began, 4)
        try:
            began = time.perf_counter()
            captured = capture_forward(torch, model, inputs, self.device)
            parts["capture_s"] = round(time.perf_counter() - began, 4)
        except Exception as e:  # noqa: BLE001 - any failure means "not capturable"
            if not _context_alive(torch, self.device):
                self.fail_from_exception(e, where=f"{who}'s graph capture")
            return f"the {who}'s forward: {_first_cause(e)}"
        # new values the forward has not seen: the replay against the reference's eager forward
        began = time.perf_counter()
        try:
            fresh = self.problem.make_inputs(opts.seed + 460_000, self.device, self.ref_module)
            refill(captured.inputs, fresh)
            captured.graph.replay()
            got = copied_output(torch, captured.output)
            self.settings.apply()
            expected = self.reference(*cloned(captured.inputs))
            torch.cuda.synchronize(self.device)
        except Exception as e:  # noqa: BLE001
            captured.graph.reset()
            if not _context_alive(torch, self.device):
                self.fail_from_exception(e, where=f"{who}'s graph replay")
            return f"the {who}'s graph replay failed: {_first_cause(e)}"
        failure = check_outputs(got, expected, opts, trial=0, phase="timed_output")
        parts["check_s"] = round(time.perf_counter() - began, 4)
        if failure is not None:
            captured.graph.reset()
            return (
                f"the {who}'s graph replay on new values differs from the reference's eager "
                f"forward ({' '.join(failure.message.split())[:300]})"
            )
        return captured


def _first_cause(e: BaseException) -> str:
    """The exception that started it: a call refused during the capture raises, then ending the
    invalidated capture raises again over it."""
    first = e
    while first.__context__ is not None and first.__context__ is not first:
        first = first.__context__
    said = f"{type(first).__name__}: {one_line(first, 300)}"
    return said if first is e else f"{said} (then {type(e).__name__}: {one_line(e, 120)})"


__all__ = [
    "CapturedForward",
    "GraphTiming",
    "capture_call",
    "capture_forward",
    "copied_output",
    "warm_capture",
]
