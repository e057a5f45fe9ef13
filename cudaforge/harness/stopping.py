"""How many timed runs are enough, and when two times differ: the adaptive stopping rule and the
tie rule. Pure Python (no torch): it runs on recorded times and on simulated ones.

The interval is the median's distribution-free confidence interval from order statistics: of n
runs, the number that fall below the true median is Binomial(n, 1/2) whatever the distribution
of the times, so the sorted runs x(j) and x(n+1-j) bound the median with probability
1 - 2 P(B <= j - 1); j is the largest rank that keeps that at or above the confidence. The rule
stops once the interval's half-width is within `precision` of the median, or when the time
budget is spent, but not before `min_runs`; and at `max_runs` whatever else holds. Two times
whose intervals overlap are a tie."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

CONFIDENCE = 0.95
# a side whose runs ended without reaching the precision, with a spread above this, did not
# settle: something else ran on the GPU or the host meanwhile (benchmarks/RESULTS.md, issue 20:
# on the H200 such an evaluation put an attention reference at 0.197 ms against 0.049 ms in the
# evaluation before, and its speedup at 2.52x where it was below 1)
UNSETTLED_SPREAD = 0.05
# ... and from this median (ms) up, a spread above it did not settle even where the precision
# was met: on the H200 at 2026-12-04 08:08, a 2.24 ms and a 2.49 ms forward met the 1% interval
# with spreads of 12.7% in one evaluation and 0.27% / 0.07% in the other (a quarter of the runs
# slowed by another process's work on the GPU). Shorter forwards spread 2-6% of their own
# (launch and replay jitter of a few us), which another attempt would not change.
UNSETTLED_FROM_MS = 0.02

# why a side's timed runs ended
STOPS = (
    "precision",  # the interval's half-width came within `precision` of the median
    "budget",  # the time budget was spent first
    "max_runs",  # the run cap was reached first
    "fixed",  # a fixed number of runs (the old rule): no stopping rule applied
    "short",  # min_runs ran and the forward is short enough for its graph replays to decide
)


@functools.lru_cache(maxsize=1024)
def median_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """(lo, hi): 0-based indexes into n sorted runs whose values bound the median with at
    least `confidence`; None when n runs are too few for any (n < 6 at 95%)."""
    if n < 1:
        return None
    tail = (1.0 - confidence) / 2.0
    log_pmf = n * math.log(0.5)  # P(B = 0)
    below = 0.0  # P(B <= i - 1)
    rank = 0  # x(rank) .. x(n + 1 - rank), 1-based; 0: none
    for i in range(n // 2 + 1):
        p = math.exp(log_pmf)
        if below + p > tail:
            break
        below += p
        rank = i + 1
        log_pmf += math.log(n - i) - math.log(i + 1)  # P(B = i + 1)
    if rank == 0:
        return None
    return rank - 1, n - rank


def median_interval(
    times: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """(low, high) bounding the median of the distribution `times` were drawn from, with at
    least `confidence`; None when there are too few runs (fewer than 6 at 95%)."""
    ranks = median_ranks(len(times), confidence)
    if ranks is None:
        return None
    ordered = sorted(times)
    return ordered[ranks[0]], ordered[ranks[1]]


def spread(times: Sequence[float]) -> float:
    """(p75 - p25) / median; 0 for fewer than two runs."""
    if len(times) < 2:
        return 0.0
    median = statistics.median(times)
    if median <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / median


@dataclass
class TimeSummary:
    """One side's timed runs: median, the median's interval (None with too few runs), the run
    count, why the runs stopped (STOPS) and the spread ((p75 - p25) / median). Times in ms."""

    median_ms: float
    low_ms: float | None
    high_ms: float | None
    runs: int
    stop: str
    spread: float
    mean_ms: float
    min_ms: float

    @classmethod
    def of(cls, times: Sequence[float], stop: str, confidence: float = CONFIDENCE) -> TimeSummary:
        if not times:
            raise ValueError("no timed runs to summarize")
        if stop not in STOPS:
            raise ValueError(f"stop {stop!r} is not one of {', '.join(STOPS)}")
        bounds = median_interval(times, confidence)
        return cls(
            median_ms=statistics.median(times),
            low_ms=bounds[0] if bounds else None,
            high_ms=bounds[1] if bounds else None,
            runs=len(times),
            stop=stop,
            spread=spread(times),
            mean_ms=statistics.fmean(times),
            min_ms=min(times),
        )

    @property
    def settled(self) -> bool:
        """False when the spread is above UNSETTLED_SPREAD and the runs ended on the budget or
        the run cap, not the precision, or the forward takes UNSETTLED_FROM_MS or more: a
        disturbed measurement rather than a noisy kernel."""
        if self.spread <= UNSETTLED_SPREAD:
            return True
        return self.stop not in ("budget", "max_runs") and self.median_ms < UNSETTLED_FROM_MS

    @property
    def half_width(self) -> float | None:
        """Half the interval's width over the median (0.01: within 1%); None without one."""
        if self.low_ms is None or self.high_ms is None or self.median_ms <= 0:
            return None
        return (self.high_ms - self.low_ms) / 2 / self.median_ms

    def to_dict(self) -> dict:
        return {**asdict(self), "settled": self.settled}


@dataclass(frozen=True)
class StoppingRule:
    """When a side's timed runs may stop: `precision` (half-width of the median's interval over
    the median), `budget_s` (seconds of timed runs per side), `min_runs` and `max_runs` per side,
    `confidence` of the interval."""

    precision: float = 0.01
    budget_s: float = 2.0
    min_runs: int = 20
    max_runs: int = 250
    confidence: float = CONFIDENCE

    def __post_init__(self):
        if not self.precision > 0:
            raise ValueError(f"precision must be > 0, not {self.precision}")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s must be > 0 (seconds), not {self.budget_s}")
        if not 1 <= self.min_runs <= self.max_runs:
            raise ValueError(
                f"need 1 <= min_runs <= max_runs, got min_runs={self.min_runs}, "
                f"max_runs={self.max_runs}"
            )
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be between 0 and 1, not {self.confidence}")

    def met(self, times: Sequence[float]) -> bool:
        """Whether `times` are enough: at least min_runs, and an interval within precision."""
        if len(times) < self.min_runs:
            return False
        bounds = median_interval(times, self.confidence)
        if bounds is None:
            return False
        median = statistics.median(times)
        return median > 0 and (bounds[1] - bounds[0]) / 2 <= self.precision * median

    def summary(self, times: Sequence[float], stop: str) -> TimeSummary:
        return TimeSummary.of(times, stop, self.confidence)


# ---------------------------------------------------------------- the tie rule

VERDICTS = ("faster", "slower", "tie")


def compare_times(
    a_ms: float,
    a_interval: tuple[float | None, float | None] | None,
    b_ms: float,
    b_interval: tuple[float | None, float | None] | None,
) -> str:
    """Whether time `a` is "faster", "slower" or a "tie" with time `b` (ms, smaller is faster).
    With both intervals: faster only when a's interval lies wholly below b's, a tie when they
    overlap. Without them (old records): the medians decide, a tie only when equal."""
    if _complete(a_interval) and _complete(b_interval):
        (a_low, a_high), (b_low, b_high) = a_interval, b_interval
        if a_high < b_low:
            return "faster"
        if a_low > b_high:
            return "slower"
        return "tie"
    if a_ms < b_ms:
        return "faster"
    return "slower" if a_ms > b_ms else "tie"


def _complete(interval) -> bool:
    return interval is not None and None not in interval


def ratio_interval(
    numerator: tuple[float | None, float | None], denominator: tuple[float | None, float | None]
) -> tuple[float, float] | None:
    """Bounds of numerator / denominator from the bounds of each (e.g. a speedup, reference
    over candidate): (low / high, high / low); None without both intervals."""
    if not (_complete(numerator) and _complete(denominator)) or min(denominator) <= 0:
        return None
    return numerator[0] / denominator[1], numerator[1] / denominator[0]


__all__ = [
    "CONFIDENCE",
    "STOPS",
    "VERDICTS",
    "StoppingRule",
    "TimeSummary",
    "compare_times",
    "median_interval",
    "median_ranks",
    "ratio_interval",
    "spread",
]
