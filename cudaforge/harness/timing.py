"""The phases of an evaluation that measure a candidate: warm-up, the timed runs (fresh inputs and
an L2 flush before each, on a harness stream outside the CUDA events), the CUPTI-traced runs, the
checked runs; the guards read from those times (unmeasured work, own kernels, bandwidth floor);
and the extras: torch.compile of the reference, the profile hook.

The timed runs follow one of two rules (EvalOptions.timing_rule): "adaptive" interleaves the
candidate's and the reference's runs (interleave.py) until the median's confidence interval of
each is within `precision` (stopping.py), the time budget is spent or `max_runs` ran, then times
CUDA-graph replays of both where a forward is short (graphs.py); "fixed" runs `timed_runs` of
the candidate, then of the reference (the rule before adaptive timing). The traced and checked
runs are the same under both."""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ..profiling.l2_flush import l2_flush
from .evaluation import _Stop, one_line, refill
from .graphs import GraphTiming
from .guards import is_own_kernel
from .interleave import block_for, time_fixed, time_interleaved
from .reference import check_seed
from .results import KernelTime
from .stopping import StoppingRule, TimeSummary
from .timed_sides import EagerSide
from .tracer import _Tracer

# torch.cuda._sleep spins for clock cycles: at 2 GHz, above the boost clocks of the GPUs this
# runs on (H200: 1.98 GHz), a spin lasts at least the ns asked for
SPIN_CYCLES_PER_NS = 2.0

# memory bandwidth (bytes/s, datasheet) by device name: the floor no honest forward beats
DATASHEET_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "H800": 3.35e12,
    "GH200": 4.0e12,
    "B200": 8.0e12,
    "B100": 8.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "L4": 0.3e12,
    "A10": 0.6e12,
}


@dataclass
class _Measurement:
    times: list[float]  # ms per timed run
    records: list[dict] | None  # CUPTI kernel records of the traced runs (harness stream removed)
    checked: list  # [(input buffer index, output)] of the checked runs (candidate only)
    synced: list[float]  # wall ms of the synchronized checked runs
    checked_events: list[float]  # event ms of the same runs
    traced: list[float] = field(default_factory=list)  # event ms of the traced runs
    summary: TimeSummary | None = None  # of `times`: median, interval, runs, why they stopped
    host_ms: float | None = None  # median ms the host took to issue one timed forward

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def spread(self) -> float:
        if len(self.times) < 2 or self.median <= 0:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times, n=4, method="inclusive")
        return (q3 - q1) / self.median


class TimingPhases(GraphTiming):
    """timing(), compile_reference() and run_profile() of an evaluation."""

    def timing_rule(self) -> str:
        """The rule in force, "adaptive" or "fixed" ("auto": adaptive on a GPU)."""
        rule = self.opts.timing_rule
        if rule == "auto":
            return "adaptive" if self.cuda else "fixed"
        return rule

    def stopping_rule(self) -> StoppingRule:
        o = self.opts
        return StoppingRule(o.precision, o.time_budget_s, o.min_runs, o.max_runs)

    def timing(self) -> None:
        opts, r = self.opts, self.result
        adaptive = self.timing_rule() == "adaptive"
        sets = self.input_set_count(sides=2 if adaptive else 1)
        r.timing.update(
            method="cuda_events" if self.cuda else "wall_clock",
            rule="adaptive" if adaptive else "fixed",
            traced_runs=opts.traced_runs if self.cuda else 0,
            warmup=opts.warmup,
            warmup_s=opts.warmup_s if self.cuda else 0.0,
            input_sets=sets,
            fresh_inputs=opts.fresh_inputs,
            tf32=opts.allow_tf32,
        )
        if adaptive:
            rule = self.stopping_rule()
            r.timing.update(precision=rule.precision, time_budget_s=rule.budget_s,
                            min_runs=rule.min_runs, max_runs=rule.max_runs,
                            confidence=rule.confidence, order="interleaved")  # fmt: skip
        else:
            r.timing.update(order="sequential")
        if self.cuda:
            self.make_flush_buffer()
        tracer = _Tracer(self) if self.cuda and opts.traced_runs > 0 else None
        if self.cuda and tracer is None:
            r.timing["cupti"] = "off (traced_runs=0)"
        if adaptive:  # a short forward's eager runs stop early: its graph replays decide
            cand, ref = self.measure_interleaved(sets, tracer, short=True)
        else:
            cand = self.measure(self.candidate, "candidate", sets, tracer)
            self.check_tampering("the candidate's timed runs")
            ref = self.measure(self.reference, "reference", sets, tracer)
        began = time.perf_counter()
        graph = self.graph_timing(cand.summary, ref.summary, self.stopping_rule() if adaptive
                                  else None)  # fmt: skip
        self.spent("graphs", began)
        if graph is not None:
            self.check_tampering("the graph captures")
        elif adaptive:  # the eager runs decide: timed in full, and again when disturbed
            if "short" in (cand.summary.stop, ref.summary.stop):
                cand, ref = self.measure_interleaved(sets, tracer)
            if not (cand.summary.settled and ref.summary.settled):
                cand, ref = self.time_again(sets, tracer, cand, ref)
        self.record_times(cand, ref, graph)
        # the guards read from the times first, so that they are all on record even when a
        # checked run below turns out wrong
        if self.cuda:
            self.unmeasured_check(cand, ref)
            self.kernel_breakdown(cand, ref)
            self.timing_cross_check()
        self.bandwidth_check()
        # the checked runs: the candidate's outputs, judged on the reference's side against
        # the reference on the same values (regenerated there from the same seeds)
        for j, (_, out) in enumerate(cand.checked):
            judgement = self.judge.check("timed_output", j, 0, out, of=len(cand.checked))
            if judgement.error:
                self.stop("runtime_error", judgement.error)
            if judgement.failure is not None:
                self.incorrect(judgement.failure)
        cand.checked = []
        self.passed_guard("timed_output")

    def record_times(self, cand: _Measurement, ref: _Measurement, graph) -> None:
        """The result's times: the graph replays' where both sides were captured, else the
        eager runs'; both kinds in timing[], per side."""
        r = self.result
        used = graph if graph is not None else (cand.summary, ref.summary)
        summaries = [s for s in used if s is not None]  # of the times the speedup uses
        if summaries:
            r.timing["settled"] = all(s.settled for s in summaries)
        for who, summary in zip(("candidate", "reference"), used):
            setattr(r, f"{who}_ms", summary.median_ms)
            setattr(r, f"{who}_spread", summary.spread)
            setattr(r, f"{who}_low_ms", summary.low_ms)
            setattr(r, f"{who}_high_ms", summary.high_ms)
        r.timing.update(
            runs=cand.summary.runs,
            speedup_basis="graph" if graph is not None else "eager",
            candidate_eager=cand.summary.to_dict(),
            reference_eager=ref.summary.to_dict(),
            candidate_mean_ms=cand.mean,
            candidate_min_ms=min(cand.times),
            reference_mean_ms=ref.mean,
            candidate_runs_ms=[round(t, 6) for t in cand.times],
            reference_runs_ms=[round(t, 6) for t in ref.times],
        )
        if graph is not None:
            r.timing.update(candidate_graph=graph[0].to_dict(), reference_graph=graph[1].to_dict())
        if self.cuda:
            r.timing.update(
                queued=("each run (eager or graph replay) queued behind a spin of 1.5x the "
                        "host's time to issue it: the events time the GPU's work, the host's is "
                        "in *_host_ms")
                if self.opts.host_ahead else "off (host_ahead=False): the GPU may wait for the host",
                candidate_host_ms=cand.host_ms,
                reference_host_ms=ref.host_ms,
            )
            gpu_ms = cand.summary.median_ms if cand.summary is not None else None
            if cand.host_ms and gpu_ms and cand.host_ms > 1.5 * gpu_ms:
                r.notes.append(
                    f"the candidate's forward takes longer to issue ({cand.host_ms:.3g} ms of host "
                    f"work) than to run ({gpu_ms:.3g} ms on the GPU): where the GPU waits for the "
                    "host, its launches, not its kernels, set the pace"
                )

    def spent(self, part: str, began: float) -> None:
        """Add the seconds since `began` to timing["phase_s"][part]: where the timing phase's
        time goes (warm-up, timed runs, traced and checked runs, graphs), per evaluation."""
        parts = self.result.timing.setdefault("phase_s", {})
        parts[part] = round(parts.get(part, 0.0) + time.perf_counter() - began, 4)

    def input_set_count(self, sides: int = 1) -> int:
        """At most opts.input_sets buffers per side, fewer when they would not fit (a quarter of
        free GPU memory for the buffers of `sides` sides and their checked-run copies)."""
        want = self.opts.input_sets
        if not self.cuda or self.input_bytes == 0:
            return want
        free, _ = self.torch.cuda.mem_get_info(self.device)
        fit = int(free // 4 // max(1, sides * (2 * self.input_bytes + self.output_bytes)))
        return max(1, min(want, fit))

    def make_flush_buffer(self) -> None:
        self.flush = l2_flush(self.device)  # one per worker process, kept
        self.result.timing["l2_bytes"] = self.flush.l2_bytes
        self.result.timing["l2_flush_bytes"] = self.flush.bytes
        self.result.timing["l2_flush"] = self.flush.description
        if self.flush.fallback:
            self.result.notes.append(f"L2 flush: {self.flush.fallback}")

    def prepare_run(self, buffers: list, seed: int | None, index: int, ahead_ns: int = 0) -> None:
        """Before a run, on the harness stream (outside the events): a spin of `ahead_ns` (the
        host issues the run meanwhile: timed_sides.py), fresh values into the buffers, then the
        L2 flush. The forward's stream waits for it."""
        torch = self.torch
        if not self.cuda:
            if seed is not None:
                refill(buffers, self.problem.make_inputs(seed, self.device, self.ref_module))
            return
        main = torch.cuda.current_stream(self.device)
        side = self.harness_stream
        side.wait_stream(main)
        with torch.cuda.stream(side):
            if ahead_ns > 0:
                torch.cuda._sleep(int(ahead_ns * SPIN_CYCLES_PER_NS))
            if seed is not None:
                refill(buffers, self.problem.make_inputs(seed, self.device, self.ref_module))
            self.flush(index)
        main.wait_stream(side)

    # ------------------------------------------------------------------ the runs of one side

    @staticmethod
    def timed_seed(who: str, opts) -> int:
        """The first seed of a side's runs (its input buffers draw from the ones below it)."""
        return opts.seed + (100_000 if who == "candidate" else 200_000)

    def side_buffers(self, who: str, sets: int) -> list:
        base = self.timed_seed(who, self.opts)
        return [self.problem.make_inputs(base + k, self.device, self.ref_module)
                for k in range(sets)]  # fmt: skip

    def warm_up(self, model, who: str, buffers: list) -> float:
        """opts.warmup calls, and on a GPU at least opts.warmup_s of them (the clocks rise).
        Seconds per call (wall clock, synchronized; 0 without a call). The host's median time
        to issue one call (not synchronized) goes to self.warm_host_s[who]."""
        opts, sets = self.opts, len(buffers)
        started, i = time.perf_counter(), 0
        issue: list[float] = []
        while i < opts.warmup or (self.cuda and time.perf_counter() - started < opts.warmup_s):
            called = time.perf_counter()
            self.call(model, buffers[i % sets], who)
            issue.append(time.perf_counter() - called)
            i += 1
            if self.cuda and i % 64 == 0:
                self.sync(who)  # time the GPU's work, not the queueing of it
        self.sync(who)
        self.warm_host_s[who] = statistics.median(issue) if issue else 0.0
        return (time.perf_counter() - started) / i if i else 0.0

    def measure(self, model, who: str, sets: int, tracer, adaptive: bool = False) -> _Measurement:
        """One side alone: warm-up, the timed runs (opts.timed_runs, or the adaptive rule),
        then the traced and the checked runs."""
        buffers = self.side_buffers(who, sets)
        if self.cuda:
            self.settings.apply()
        per_call = self.warm_up(model, who, buffers)
        seed = self.timed_seed(who, self.opts) + 1000
        side = EagerSide(self, model, who, buffers, seed, host_s=self.warm_host_s.get(who, 0.0))
        if adaptive:
            rule = self.stopping_rule()
            (times,), (stop,) = time_interleaved([side], rule, block=block_for(per_call))
            summary = rule.summary(times, stop)
        else:
            times = time_fixed(side, self.opts.timed_runs)
            summary = TimeSummary.of(times, "fixed")
        self.sync(who)
        m = self.traced_and_checked(model, who, buffers, seed + len(times), len(times), tracer)
        m.times, m.summary, m.host_ms = times, summary, side.host_ms()
        return m

    def time_again(self, sets: int, tracer, cand: _Measurement, ref: _Measurement):
        """The interleaved runs once more, after a side did not settle (stopping.TimeSummary.
        settled); the attempt whose worse side spread less is kept, the other is on record in
        timing["first_attempt"], and a result that did not settle twice says so (its speedup
        is uncertain: timing["settled"] False, and a note)."""
        r = self.result
        first = {"candidate": cand.summary.to_dict(), "reference": ref.summary.to_dict()}
        again_cand, again_ref = self.measure_interleaved(sets, tracer)

        def worst(pair):
            return max(pair[0].summary.spread, pair[1].summary.spread)

        kept = min(((cand, ref), (again_cand, again_ref)), key=worst)
        r.timing["first_attempt"] = first
        r.timing["retimed"] = "kept the " + ("first" if kept[0] is cand else "second") + " attempt"
        if not (kept[0].summary.settled and kept[1].summary.settled):
            r.notes.append(
                "the timing did not settle in two attempts (spreads "
                f"{kept[0].summary.spread:.1%} and {kept[1].summary.spread:.1%}, runs ended on "
                f"{kept[0].summary.stop} / {kept[1].summary.stop}): the speedup is uncertain"
            )
        return kept

    def measure_interleaved(self, sets: int, tracer, short: bool = False
                            ) -> tuple[_Measurement, _Measurement]:  # fmt: skip
        """Both sides: each warmed up, then their timed runs interleaved under the adaptive rule
        (interleave.py), then each side's traced and checked runs. short: stop after min_runs
        when a side's median is under graph_below_ms (its graph replays are timed next)."""
        sides, per_round = [], 0.0
        began = time.perf_counter()
        for model, who in ((self.candidate, "candidate"), (self.reference, "reference")):
            buffers = self.side_buffers(who, sets)
            if self.cuda:
                self.settings.apply()
            per_round += self.warm_up(model, who, buffers)
            if who == "candidate":
                self.check_tampering("the candidate's warm-up")
            seed = self.timed_seed(who, self.opts) + 1000
            # a fault found while waiting for either side's events is charged to the candidate:
            # the reference's forward ran these same operations in every trial
            sides.append(EagerSide(self, model, who, buffers, seed, settings=True, where="forward",
                                   host_s=self.warm_host_s.get(who, 0.0)))  # fmt: skip
        rule = self.stopping_rule()
        graphs = self.cuda and self.opts.cuda_graphs and short
        self.spent("warm-up", began)
        began = time.perf_counter()
        times, stops = time_interleaved(sides, rule, block=block_for(per_round),
                                        short_ms=self.opts.graph_below_ms if graphs else None)
        self.sync("candidate")
        self.spent("timed runs", began)
        self.check_tampering("the timed runs")
        began = time.perf_counter()
        found = []
        for side, t, stop in zip(sides, times, stops):
            m = self.traced_and_checked(side.model, side.who, side.buffers, side.seed + len(t),
                                        len(t), tracer)  # fmt: skip
            m.times, m.summary, m.host_ms = t, rule.summary(t, stop), side.host_ms()
            found.append(m)
        self.spent("traced and checked runs", began)
        return found[0], found[1]

    def traced_and_checked(self, model, who: str, buffers: list, seed: int, first: int,
                           tracer) -> _Measurement:  # fmt: skip
        """The runs after the timed ones: opts.traced_runs traced by CUPTI (when `tracer`), then
        one checked run per buffer (synchronized, fresh values, outputs kept)."""
        torch, opts, sets = self.torch, self.opts, len(buffers)
        records, traced = None, []
        if tracer is not None:
            tracer.start()
            traced = self.timed_loop(model, who, buffers, opts.traced_runs, seed, first)
            records = tracer.stop(who)
            seed += opts.traced_runs
        checked, synced, checked_events = [], [], []
        for k in range(sets):
            seed += 1
            # the candidate's: the seed the reference's side regenerates these inputs from
            fill = check_seed(opts, "timed_output", k) if who == "candidate" else seed
            self.prepare_run(buffers[k], fill, first + k)
            self.sync(who)
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter_ns()
                start.record()
                out = self.call(model, buffers[k], who)
                end.record()
                self.sync(who)
                synced.append((time.perf_counter_ns() - t0) / 1e6)
                checked_events.append(start.elapsed_time(end))
            else:
                out = self.call(model, buffers[k], who)
            if who == "candidate":
                checked.append((k, out))
            del out
        if who == "candidate":
            self.timed_buffers = buffers
        return _Measurement([], records, checked, synced, checked_events, traced)

    def timed_loop(self, model, who: str, buffers: list, runs: int, seed: int, first: int):
        """`runs` runs rotating among `buffers`, each prepared (fresh values from seed + 1, +2, ...,
        flush) on the harness stream; ms per run (CUDA events, or the wall clock on a CPU)."""
        times = time_fixed(EagerSide(self, model, who, buffers, seed, first), runs)
        self.sync(who)
        return times

    def unmeasured_check(self, cand: _Measurement, ref: _Measurement) -> None:
        """Work the events did not see: a synchronized run that takes much longer than its events
        (another stream, deferred work), and, with CUPTI, kernels busier than the event window."""
        r = self.result
        if not cand.synced:
            return
        synced = statistics.median(cand.synced)
        events = statistics.median(cand.checked_events)
        ref_gap = max(0.0, statistics.median(ref.synced) - statistics.median(ref.checked_events))
        gap = synced - events
        r.timing.update(candidate_synced_ms=synced, candidate_checked_events_ms=events)
        if gap > 0.1 + 0.25 * events + 2 * ref_gap:
            self.fire(
                "unmeasured_work",
                f"a synchronized run took {synced:.4f} ms of which the CUDA events saw {events:.4f}"
                " ms: work ran outside the timed window (another stream, or deferred)",
            )
        busy = r.timing.get("cupti_busy_ms")
        if busy is not None and cand.traced:
            mean = statistics.fmean(cand.traced)
            r.timing["candidate_traced_mean_ms"] = mean
            if busy > 1.2 * mean + 0.005:
                self.fire(
                    "unmeasured_work",
                    f"CUPTI saw the GPU busy {busy:.4f} ms per forward with the candidate's "
                    f"kernels, but the CUDA events measured {mean:.4f} ms: kernels ran outside "
                    "the timed window (another stream, or deferred)",
                )
        self.passed_guard("unmeasured_work")

    def kernel_breakdown(self, cand: _Measurement, ref: _Measurement) -> None:
        r, runs = self.result, self.opts.traced_runs
        if cand.records is None:
            reason = r.timing.get("cupti", "CUPTI tracing unavailable")
            r.notes.append(f"no per-kernel times: {reason}")
            self.static_own_check()
            return
        ref_names = {rec["name"] for rec in ref.records or ()}
        names = {rec["name"] for rec in cand.records}
        own = {name for name in names if is_own_kernel(name, self.own_names)}
        borrowed = own & ref_names
        own -= ref_names
        if borrowed:
            r.notes.append(
                "kernel(s) named like the reference's own were not counted as the candidate's: "
                + ", ".join(sorted(borrowed))
            )
        r.kernels = KernelTime.from_records(cand.records, runs, own)
        total = sum(k.total_us for k in r.kernels)
        own_total = sum(k.total_us for k in r.kernels if k.own)
        r.own_kernel_share = own_total / total if total > 0 else 0.0
        r.timing["cupti_kernel_ms"] = total / 1e3
        if ref.records:
            ref_total = sum(rec["duration_ns"] for rec in ref.records)
            r.timing["reference_cupti_kernel_ms"] = ref_total / runs / 1e6
        if own_total == 0:
            names = ", ".join(k.name[:60] for k in r.kernels[:4]) or "no kernels at all"
            self.fire(
                "no_own_kernels",
                f"none of the GPU time is in the candidate's own kernels (ran: {names})",
            )
        self.passed_guard("no_own_kernels")

    def fastest_candidate_ms(self) -> float | None:
        """The lowest of the candidate's medians (eager runs, graph replays): what the guards
        hold against their floors, so that neither kind of time hides an impossible one."""
        r = self.result
        found = [r.candidate_ms]
        for key in ("candidate_eager", "candidate_graph"):
            side = r.timing.get(key)
            found.append(side.get("median_ms") if isinstance(side, dict) else None)
        found = [ms for ms in found if isinstance(ms, (int, float))]
        return min(found) if found else None

    def timing_cross_check(self) -> None:
        """The figure that decides the speedup, held against one the candidate's Python cannot
        bend as easily: the timed runs' median event time (the lower of the eager and the graph
        one) against the GPU time CUPTI recorded for its kernels per forward. Honest runs differ
        by CUPTI's overhead and clock drift (percents); a forged or skipped timing differs by
        far more."""
        r = self.result
        busy = r.timing.get("cupti_busy_ms")
        ms = self.fastest_candidate_ms()
        if busy is None or ms is None:
            reason = r.timing.get("cupti", "CUPTI tracing unavailable")
            self.skipped.setdefault("timing_mismatch", f"no CUPTI kernel records ({reason})")
            return
        if ms < 0.5 * busy - 0.002:
            self.fire(
                "timing_mismatch",
                f"the timed runs' median is {ms:.4f} ms, but CUPTI recorded "
                f"{busy:.4f} ms of GPU time per forward for its kernels",
            )
        self.passed_guard("timing_mismatch")

    def static_own_check(self) -> None:
        """Without CUPTI: does the candidate at least compile kernels of its own?"""
        if not self.own_names or not (self.hooks.sources or self.hooks.compiled_modules):
            self.fire(
                "no_own_kernels",
                "the candidate compiles no CUDA kernels (static check: CUPTI was unavailable)",
            )
        else:
            self.result.notes.append(
                "no_own_kernels checked statically (the candidate compiles kernels "
                f"{', '.join(sorted(self.own_names))}); CUPTI was unavailable to see them run"
            )
            self.passed_guard("no_own_kernels")

    def bandwidth_check(self) -> None:
        r, torch = self.result, self.torch
        ceiling = self.opts.bandwidth_ceiling
        source = "given"
        if ceiling is None and self.cuda:
            ceiling, source = _datasheet_bandwidth(torch, self.device)
        if ceiling is None:
            self.skipped["bandwidth_floor"] = "no memory bandwidth known for a CPU; pass " \
                "bandwidth_ceiling (bytes/s) to check"  # fmt: skip
            return
        l2 = self.flush.l2_bytes if self.flush is not None else 0
        floor_bytes = self.input_bytes + max(0, self.output_bytes - l2)
        floor_ms = floor_bytes / ceiling * 1e3
        r.timing.update(
            bandwidth_ceiling=ceiling,
            bandwidth_ceiling_source=source,
            floor_bytes=floor_bytes,
            floor_ms=floor_ms,
        )
        ms = self.fastest_candidate_ms()
        if ms is not None and ms < floor_ms:
            self.fire(
                "bandwidth_floor",
                f"{ms:.4f} ms is below the {floor_ms:.4f} ms that moving "
                f"{floor_bytes} bytes (inputs + outputs) takes at {ceiling / 1e12:.2f} TB/s",
            )
        self.passed_guard("bandwidth_floor")

    # ------------------------------------------------------------------ extras

    def compile_reference(self) -> None:
        torch, r = self.torch, self.result
        try:
            compiled = torch.compile(self.reference)
            adaptive = self.timing_rule() == "adaptive"
            sets = self.input_set_count()
            m = self.measure(compiled, "compiled reference", sets, None, adaptive=adaptive)
            r.compiled_reference_ms = m.median
            r.timing["compiled_reference_spread"] = m.spread
            r.timing["compiled_reference_eager"] = m.summary.to_dict()
        except _Stop:
            raise
        except Exception as e:  # noqa: BLE001 - torch.compile failing is a note, not a failure
            r.notes.append(f"torch.compile of the reference failed: {one_line(e)}")

    def run_profile(self) -> None:
        r = self.result
        target = self.opts.profile
        spec = target if isinstance(target, str) else "cudaforge.profiling.profiler:profile_forward"
        try:
            module_name, _, func_name = spec.partition(":")
            hook = getattr(__import__(module_name, fromlist=[func_name]), func_name)
        except (ImportError, AttributeError) as e:
            r.notes.append(f"profile: {spec} is not available ({one_line(e)})")
            return
        inputs = self.problem.make_inputs(self.opts.seed + 400_000, self.device, self.ref_module)

        def forward():
            return self.candidate(*inputs)

        extra: dict[str, Any] = {}
        if spec.endswith(":profile_forward"):
            # what profile_forward can use from the candidate's cudaforge.compile modules
            resources, kernels = {}, {}
            for mod in self.hooks.compiled_modules if self.hooks else ():
                with contextlib.suppress(Exception):
                    resources.update(mod.resources)
                    kernels.update({name: mod.kernel(name) for name in mod.kernels})
            extra = {"resources": resources or None, "kernels": kernels or None}
        try:
            got = hook(
                forward,
                own=sorted(self.own_names),
                min_bytes=self.input_bytes + self.output_bytes,
                **extra,
            )
            r.profile = got.to_dict() if hasattr(got, "to_dict") else dict(got)
        except Exception as e:  # noqa: BLE001 - profiling is best effort; the reason is kept
            r.notes.append(f"profile failed: {type(e).__name__}: {one_line(e)}")


def _datasheet_bandwidth(torch, device) -> tuple[float | None, str]:
    props = torch.cuda.get_device_properties(device)
    name = props.name
    for key in sorted(DATASHEET_BANDWIDTH, key=len, reverse=True):
        if key in name:
            return DATASHEET_BANDWIDTH[key], f"datasheet ({key})"
    clock = getattr(props, "memory_clock_rate", 0)  # kHz
    width = getattr(props, "memory_bus_width", 0)  # bits
    if clock and width:
        return 2.0 * clock * 1e3 * width / 8, "memory clock x bus width"
    return None, "unknown"
