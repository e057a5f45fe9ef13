"""cudaforge/harness/stopping.py and ties.py: the median's interval from order statistics, the
adaptive stopping rule on simulated samples (seeded), and the tie rule."""

from __future__ import annotations

import math
import random
from math import comb
from types import SimpleNamespace

import pytest

from cudaforge.harness.interleave import block_for, time_interleaved
from cudaforge.harness.stopping import (
    StoppingRule,
    TimeSummary,
    compare_times,
    median_interval,
    median_ranks,
    ratio_interval,
    spread,
)
from cudaforge.harness.ties import candidate_time, compare_results


def test_the_ranks_are_the_widest_binomial_bound_at_the_confidence():
    for n in (6, 7, 10, 20, 33, 100, 257):
        expected = None
        for j in range(1, n // 2 + 1):  # coverage of [x(j), x(n + 1 - j)], ranks from 1
            if 1 - 2 * sum(comb(n, i) for i in range(j)) / 2**n >= 0.95:
                expected = (j - 1, n - j)
        assert median_ranks(n) == expected, n
    assert median_ranks(5) is None and median_ranks(0) is None  # 1 - 2/32 < 0.95
    assert median_ranks(5, confidence=0.9) == (0, 4)
    lo, hi = median_ranks(20_000)  # no underflow at large n (the pmf is summed in logs)
    assert 9_850 < lo < 10_000 < hi < 10_150


def test_the_interval_is_order_statistics_of_the_sorted_runs():
    times = [5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 9.0, 8.0, 7.0, 10.0]
    assert median_interval(times) == (2.0, 9.0)  # ranks (1, 8) of 10
    assert median_interval(times[:5]) is None
    s = TimeSummary.of(times, "fixed")
    assert (s.median_ms, s.low_ms, s.high_ms, s.runs, s.min_ms) == (5.5, 2.0, 9.0, 10, 1.0)
    assert s.half_width == pytest.approx(3.5 / 5.5)
    assert s.spread == pytest.approx(spread(times)) and s.spread == pytest.approx(4.5 / 5.5)
    few = TimeSummary.of([1.0, 2.0], "budget")
    assert few.low_ms is None and few.half_width is None and few.to_dict()["stop"] == "budget"
    with pytest.raises(ValueError, match="no timed runs"):
        TimeSummary.of([], "fixed")
    with pytest.raises(ValueError, match="stop 'soon'"):
        TimeSummary.of([1.0], "soon")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"precision": 0}, "precision"),
        ({"budget_s": -1}, "budget_s"),
        ({"min_runs": 30, "max_runs": 10}, "min_runs <= max_runs"),
        ({"min_runs": 0}, "min_runs"),
        ({"confidence": 1.0}, "confidence"),
    ],
)
def test_a_rule_no_run_could_meet_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        StoppingRule(**fields)


class Simulated:
    """A side whose runs are drawn from a lognormal of median `median` ms and log-sd `sigma`,
    each advancing a simulated clock by its own time plus 0.1 ms of preparation."""

    def __init__(self, rng: random.Random, median: float, sigma: float, clock: list):
        self.rng, self.median, self.sigma, self.clock = rng, median, sigma, clock

    def queue(self, index: int) -> float:
        ms = self.median * math.exp(self.rng.gauss(0.0, self.sigma))
        self.clock[0] += (ms + 0.1) / 1e3
        return ms

    def read(self, handle: float) -> float:
        return handle


def run_rule(rule: StoppingRule, sigma: float, seed: int = 0, median: float = 1.0, block=8):
    clock = [0.0]
    side = Simulated(random.Random(seed), median, sigma, clock)
    (times,), (stop,) = time_interleaved([side], rule, clock=lambda: clock[0], block=block)
    return times, stop, clock[0]


@pytest.mark.parametrize("block", [1, 3, 8])
def test_tight_runs_stop_at_the_minimum_with_the_precision_met(block):
    rule = StoppingRule(precision=0.01, budget_s=2.0, min_runs=20, max_runs=250)
    times, stop, _ = run_rule(rule, sigma=0.002, block=block)
    assert stop == "precision"
    # checked once min_runs are read: at most a block past it, plus the block in flight
    assert rule.min_runs <= len(times) <= rule.min_runs + 2 * block
    summary = rule.summary(times, stop)
    assert summary.half_width <= 0.01 and summary.low_ms <= summary.median_ms <= summary.high_ms


def test_blocks_are_short_for_long_forwards():
    assert block_for(0.010) == 1 and block_for(0.0005) == 4 and block_for(1e-6) == 8
    assert block_for(0.0) == 8


def test_noisy_runs_go_to_the_cap_or_the_budget():
    rule = StoppingRule(precision=0.01, budget_s=100.0, min_runs=20, max_runs=250)
    times, stop, _ = run_rule(rule, sigma=0.5)
    assert stop == "max_runs" and len(times) == 250
    assert rule.summary(times, stop).half_width > 0.01
    # long runs: the budget (2 s per side of simulated time) ends them first
    rule = StoppingRule(precision=0.01, budget_s=2.0, min_runs=20, max_runs=10_000)
    times, stop, elapsed = run_rule(rule, sigma=0.5, median=10.0)
    assert stop == "budget" and 2.0 <= elapsed < 2.0 + 8 * 0.0101 * 3
    assert 150 < len(times) < 250


def test_the_interval_holds_the_true_median_at_the_stated_rate():
    rng = random.Random(20)
    # a fixed count: exponential runs (skewed, median ln 2); the exact coverage at n = 50 is
    # 1 - 2 P(B <= 16) = 0.9672
    hits = 0
    for _ in range(2000):
        low, high = median_interval([rng.expovariate(1.0) for _ in range(50)])
        hits += low <= math.log(2) <= high
    assert 0.95 <= hits / 2000 <= 0.985
    # stopping when the interval is narrow enough leaves it at about its confidence
    rule = StoppingRule(precision=0.01, budget_s=1e9, min_runs=20, max_runs=5000)
    hits, runs = 0, []
    for seed in range(400):
        times, _, _ = run_rule(rule, sigma=0.05, seed=seed)
        low, high = median_interval(times)
        hits += low <= 1.0 <= high
        runs.append(len(times))
    assert hits / 400 >= 0.92, hits / 400
    assert 80 < sorted(runs)[200] < 400  # (1.96 * 1.25 * 0.05 / 0.01)^2 ~ 150 runs


def test_the_tie_rule():
    assert compare_times(1.0, (0.98, 1.01), 1.1, (1.05, 1.12)) == "faster"
    assert compare_times(1.1, (1.05, 1.12), 1.0, (0.98, 1.01)) == "slower"
    assert compare_times(1.0, (0.98, 1.06), 1.05, (1.05, 1.12)) == "tie"  # touching: a tie
    # no interval on either side (old records): the medians decide
    assert compare_times(1.0, None, 1.1, (1.05, 1.12)) == "faster"
    assert compare_times(1.0, (None, None), 1.0, None) == "tie"
    assert ratio_interval((2.0, 2.2), (1.0, 1.1)) == pytest.approx((2.0 / 1.1, 2.2))
    assert ratio_interval((2.0, 2.2), None) is None


def result(ms, low=None, high=None, **sides):
    timing = {f"candidate_{k}": v for k, v in sides.items()}
    return SimpleNamespace(candidate_ms=ms, candidate_low_ms=low, candidate_high_ms=high,
                           timing=timing)  # fmt: skip


def side(median, low, high):
    return {"median_ms": median, "low_ms": low, "high_ms": high, "runs": 40, "stop": "precision"}


def test_results_are_compared_on_times_of_the_same_kind():
    a = result(
        0.030, 0.029, 0.031, eager=side(0.050, 0.049, 0.051), graph=side(0.030, 0.029, 0.031)
    )
    b = result(
        0.032, 0.0315, 0.033, eager=side(0.049, 0.048, 0.050), graph=side(0.032, 0.0315, 0.033)
    )
    assert compare_results(a, b) == ("faster", "graph")
    # b was not captured: eager against eager, where the two overlap
    b_eager = result(0.049, 0.048, 0.050, eager=side(0.049, 0.048, 0.050))
    assert compare_results(a, b_eager) == ("tie", "eager")
    assert candidate_time(b_eager, "graph") is None
    # records without intervals: medians
    old_a, old_b = result(1.0), result(1.2)
    assert compare_results(old_a, old_b) == ("faster", "recorded")
    assert compare_results(old_b, old_a) == ("slower", "recorded")
    assert compare_results(result(None), old_a) == ("slower", "recorded")
    with pytest.raises(ValueError, match="basis"):
        candidate_time(old_a, "wall")


def test_the_timing_options_are_checked_and_cross_to_the_workers():
    from cudaforge.harness.options import make_options, options_dict, options_from_dict

    for bad, message in [({"timing_rule": "fast"}, "timing_rule 'fast'"),
                         ({"precision": 0.0}, "precision"), ({"time_budget_s": -1}, "time_budget"),
                         ({"min_runs": 50, "max_runs": 10}, "min_runs <= max_runs"),
                         ({"graph_below_ms": -1}, "graph_below_ms"),
                         ({"replay_gap_us": -2}, "replay_gap_us")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            make_options(**bad)
    opts = make_options(timing_rule="fixed", precision=0.02, max_runs=400, cuda_graphs=False,
                        replay_gap_us=5.0)  # fmt: skip
    assert options_from_dict(options_dict(opts)) == opts and opts.replay_gap_us == 5.0
    assert make_options().timing_rule == "auto" and make_options().precision == 0.01
