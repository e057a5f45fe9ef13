"""Speedups against the three baselines a benchmark reports: PyTorch eager, torch.compile of the
reference, and the faster of the two (max(eager, compile): the kernel must beat both).

Per baseline, over a set of problems: fast_p (the share of ALL problems whose kernel is correct
and more than p times faster than the baseline; a problem without a correct kernel, or without a
time for that baseline, is not fast), and the geometric mean and median speedup over the correct
problems with a time for it. A problem whose torch.compile was not timed counts against eager
alone for max(eager, compile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .formatting import usable_speedup

BASELINES = ("eager", "compile", "faster")
BASELINE_LABELS = {"eager": "eager", "compile": "torch.compile", "faster": "max(eager, compile)"}
FAST_P_OVER_BASELINES = (1.0, 1.5, 2.0)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered, middle = sorted(values), len(values) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def speedup_over(
    baseline: str, speedup: float | None, speedup_vs_compile: float | None
) -> float | None:
    """A kernel's speedup against `baseline` from its speedups over eager and over compile."""
    eager, compiled = usable_speedup(speedup), usable_speedup(speedup_vs_compile)
    if baseline == "eager":
        return eager
    if baseline == "compile":
        return compiled
    if baseline == "faster":
        known = [s for s in (eager, compiled) if s is not None]
        return min(known) if known else None
    raise ValueError(f"unknown baseline {baseline!r}; baselines: {', '.join(BASELINES)}")


@dataclass
class BaselineStats:
    """The numbers of one baseline over `problems` problems (module docstring)."""

    baseline: str
    problems: int
    n: int  # correct problems with a speedup against this baseline
    fast_p: dict[str, float] = field(default_factory=dict)  # "fast_1" -> share of all problems
    geomean: float | None = None
    median: float | None = None

    @property
    def label(self) -> str:
        return BASELINE_LABELS[self.baseline]


def baseline_stats(
    baseline: str,
    kernels: list[tuple[float | None, float | None]],
    problems: int,
    fast_p: tuple[float, ...] = FAST_P_OVER_BASELINES,
) -> BaselineStats:
    """BaselineStats from the (speedup, speedup_vs_compile) of each problem's correct kernel;
    `problems` counts every problem, those without a correct kernel too."""
    values = [v for v in (speedup_over(baseline, *k) for k in kernels) if v is not None]
    shares = {f"fast_{p:g}": (sum(v > p for v in values) / problems if problems else 0.0)
              for p in fast_p}  # fmt: skip
    return BaselineStats(baseline, problems, len(values), shares, geomean(values), median(values))


def all_baselines(
    kernels: list[tuple[float | None, float | None]], problems: int
) -> list[BaselineStats]:
    """baseline_stats for eager, compile and the faster of the two, in that order."""
    return [baseline_stats(b, kernels, problems) for b in BASELINES]


__all__ = [
    "BASELINES",
    "BASELINE_LABELS",
    "FAST_P_OVER_BASELINES",
    "BaselineStats",
    "all_baselines",
    "baseline_stats",
    "geomean",
    "median",
    "speedup_over",
]
