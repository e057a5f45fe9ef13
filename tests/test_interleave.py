"""cudaforge/harness/interleave.py on a simulated clock: the order of the runs, and why it matters.
A drifting clock (a GPU warming up, or throttling) inflates every run by a factor that grows with
time; interleaved, the candidate and the reference see the same drift and the ratio of their
medians stays true, where timing one side after the other biases it."""

from __future__ import annotations

import statistics

import pytest

from cudaforge.harness.interleave import time_fixed, time_interleaved
from cudaforge.harness.stopping import StoppingRule


class DriftingGPU:
    """A clock in s. A run of true length `ms` reads ms * (1 + drift * t) at its time t, and
    takes that long plus 0.05 ms of preparation; every run is logged (side, start time)."""

    def __init__(self, drift: float):
        self.now = 0.0
        self.drift = drift
        self.log: list[tuple[str, float]] = []

    def side(self, name: str, ms: float) -> Side:
        return Side(self, name, ms)


class Side:
    def __init__(self, gpu: DriftingGPU, name: str, ms: float):
        self.gpu, self.name, self.ms = gpu, name, ms
        self.queued = 0

    def queue(self, index: int) -> float:
        assert index == self.queued  # each side's runs are queued in order, once
        self.queued += 1
        gpu = self.gpu
        gpu.log.append((self.name, gpu.now))
        measured = self.ms * (1 + gpu.drift * gpu.now)
        gpu.now += (measured + 0.05) / 1e3
        return measured

    def read(self, handle: float) -> float:
        return handle


class Noisy(Side):
    """Runs alternately half and one and a half times as long: never within 1%."""

    def queue(self, index: int) -> float:
        return super().queue(index) * (1.5 if index % 2 else 0.5)


RULE = StoppingRule(precision=1e-9, budget_s=100.0, min_runs=10, max_runs=200)  # runs to the cap


def test_sequential_timing_is_biased_by_drift_and_interleaved_is_not():
    true_ratio = 2.0 / 1.0  # reference 2 ms, candidate 1 ms
    # 20%/s of drift: the sequential reference runs ~0.2 s after the candidate's
    gpu = DriftingGPU(drift=0.2)
    cand = time_fixed(gpu.side("candidate", 1.0), 200)
    ref = time_fixed(gpu.side("reference", 2.0), 200)
    sequential = statistics.median(ref) / statistics.median(cand)
    gpu = DriftingGPU(drift=0.2)
    (cand, ref), stops = time_interleaved(
        [gpu.side("candidate", 1.0), gpu.side("reference", 2.0)], RULE, clock=lambda: gpu.now
    )
    interleaved = statistics.median(ref) / statistics.median(cand)
    assert stops == ["max_runs", "max_runs"] and len(cand) == len(ref) == 200
    assert abs(sequential / true_ratio - 1) > 0.03  # biased by the drift between the sides
    assert abs(interleaved / true_ratio - 1) < 0.002  # the drift cancels
    # both sides met the same drift: the mean time of their runs is the same to a run
    starts = {name: [t for n, t in gpu.log if n == name] for name in ("candidate", "reference")}
    gap = statistics.fmean(starts["reference"]) - statistics.fmean(starts["candidate"])
    assert abs(gap) < 3.05e-3  # one pair of runs


def test_the_order_alternates_a_b_b_a():
    gpu = DriftingGPU(drift=0.0)
    rule = StoppingRule(precision=1e-9, budget_s=100.0, min_runs=1, max_runs=4)
    time_interleaved([gpu.side("A", 1.0), gpu.side("B", 1.0)], rule, clock=lambda: gpu.now,
                     block=2)  # fmt: skip
    assert [name for name, _ in gpu.log] == ["A", "B", "B", "A", "A", "B", "B", "A"]


def test_runs_are_read_a_block_after_they_are_queued():
    events = []

    class Logged:
        def __init__(self, name):
            self.name = name

        def queue(self, index):
            events.append(("queue", self.name, index))
            return index

        def read(self, handle):
            events.append(("read", self.name, handle))
            return 1.0

    rule = StoppingRule(precision=1.0, budget_s=100.0, min_runs=2, max_runs=100)
    times, stops = time_interleaved([Logged("A")], rule, clock=lambda: 0.0, block=2)
    assert stops == ["precision"] and len(times[0]) == 8  # met once 6 were read; 2 in flight
    # block 0 (runs 0, 1) is read only after block 1 (runs 2, 3) is queued
    assert events[:6] == [("queue", "A", 0), ("queue", "A", 1), ("queue", "A", 2),
                          ("queue", "A", 3), ("read", "A", 0), ("read", "A", 1)]  # fmt: skip
    assert [e for e in events if e[0] == "read"][-1] == ("read", "A", 7)


def test_a_side_that_met_the_rule_keeps_pace_with_the_other():
    gpu = DriftingGPU(drift=0.0)
    tight = gpu.side("tight", 1.0)  # no noise at all: met at once
    rule = StoppingRule(precision=0.01, budget_s=100.0, min_runs=10, max_runs=64)
    (a, b), stops = time_interleaved([tight, Noisy(gpu, "noisy", 1.0)], rule,
                                     clock=lambda: gpu.now)  # fmt: skip
    assert len(a) == len(b) == 64
    assert stops == ["precision", "max_runs"]


def test_the_budget_counts_every_side():
    gpu = DriftingGPU(drift=0.0)
    rule = StoppingRule(precision=1e-9, budget_s=0.05, min_runs=1, max_runs=10_000)
    (a, b), stops = time_interleaved([Noisy(gpu, "A", 1.0), Noisy(gpu, "B", 1.0)], rule,
                                     clock=lambda: gpu.now, block=1)  # fmt: skip
    assert stops == ["budget", "budget"] and len(a) == len(b)
    assert 0.1 <= gpu.now < 0.1 + 4 * 1.05e-3  # 2 sides x 0.05 s, then the pending pair
    with pytest.raises(ValueError, match="no sides"):
        time_interleaved([], rule)


def test_a_short_forward_stops_after_the_least_runs_when_graphs_will_decide():
    rule = StoppingRule(precision=0.01, budget_s=100.0, min_runs=10, max_runs=200)
    gpu = DriftingGPU(drift=0.0)
    sides = [Noisy(gpu, "candidate", 0.010), Noisy(gpu, "reference", 0.200)]  # 10 us, 200 us
    (a, b), stops = time_interleaved(sides, rule, clock=lambda: gpu.now, block=2,
                                     short_ms=0.05)  # fmt: skip
    assert stops == ["short", "short"] and len(a) == len(b)
    assert 10 <= len(a) <= 10 + 2  # min_runs, and the block queued meanwhile
    # and such a side's runs summarize like any other (the harness records them so)
    summary = rule.summary(a, stops[0])
    assert summary.stop == "short" and summary.runs == len(a) and summary.settled
    # without short_ms, or where every side takes longer, the rule runs its course
    gpu = DriftingGPU(drift=0.0)
    sides = [Noisy(gpu, "candidate", 0.010), Noisy(gpu, "reference", 0.200)]
    (a, _), stops = time_interleaved(sides, rule, clock=lambda: gpu.now, block=2)
    assert stops == ["max_runs", "max_runs"] and len(a) == 200
    gpu = DriftingGPU(drift=0.0)
    sides = [Noisy(gpu, "candidate", 0.1), Noisy(gpu, "reference", 0.2)]
    (a, _), stops = time_interleaved(sides, rule, clock=lambda: gpu.now, block=2, short_ms=0.05)
    assert stops == ["max_runs", "max_runs"] and len(a) == 200
