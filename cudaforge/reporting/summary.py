"""The benchmark summary in the CudaForge paper's terms.

From a results file of `cudaforge.cli.bench` (one JSON record per problem): the correctness rate,
fast_p (the share of ALL problems whose kernel is correct and more than p times faster than
PyTorch eager, p = 0, 1, 1.5, 2; fast_0 is the correctness rate), the mean and geometric-mean
speedup over the correct problems, the same with a problem without a correct kernel counted as 1x,
and the cost and time per kernel, per level and overall; and fast_p, geomean and median against
eager, torch.compile and the faster of the two (cudaforge.reporting.speedups). A `Summary` also says what its tables
and notes hold; cudaforge.reporting.markdown and cudaforge.reporting.html lay them out.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli.bench import BenchRecord, read_results
from .formatting import duration, percent, times, usable_speedup, usd
from .html import summary_page
from .markdown import summary_markdown
from .speedups import BaselineStats, all_baselines, geomean, median

FAST_P = (0.0, 1.0, 1.5, 2.0)
# what the paper reports (arXiv 2511.01884, abstract), shown beside our numbers for orientation
PAPER_NOTE = (
    "For orientation, the CudaForge paper reports 97.6% correct kernels and a 1.68x average "
    "speedup over PyTorch on KernelBench with OpenAI o3, at about $0.3 of API cost and 26.5 "
    "minutes (on one RTX 6000) per kernel."
)


# ---------------------------------------------------------------- numbers


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def fast_p_label(p: float) -> str:
    """fast_1, fast_1.5, ..."""
    return f"fast_{p:g}"


@dataclass
class GroupSummary:
    """The summary of one level (or of all problems). Rates are shares of `problems` (0..1);
    speedups are PyTorch eager time / the best kernel's time; seconds and USD per kernel are
    means over the problems whose time or cost is known."""

    label: str  # "level 1", "all"
    level: int | None
    problems: int
    correct: int
    correct_rate: float
    fast_p: dict[str, float]  # fast_p_label(p) -> share of problems
    speedup_n: int  # correct problems with a measured speedup: the population of the means
    mean_speedup: float | None
    geomean_speedup: float | None
    median_speedup: float | None
    mean_speedup_all: float | None  # every problem, one without a correct kernel counted as 1x
    geomean_speedup_all: float | None
    compile_n: int  # correct problems timed against torch.compile
    mean_speedup_vs_compile: float | None
    geomean_speedup_vs_compile: float | None
    cost_usd_total: float
    cost_usd_per_kernel: float | None
    cost_known: int  # problems whose cost is known (an exception leaves it unknown)
    unpriced: int  # problems that called a model without a known price (not in the cost)
    seconds_total: float
    seconds_per_kernel: float | None
    statuses: dict[str, int] = field(default_factory=dict)  # status -> problems
    baselines: list[BaselineStats] = field(default_factory=list)  # eager, compile, faster

    @property
    def errors(self) -> int:
        return self.statuses.get("error", 0)


def summarize_group(label: str, level: int | None, records: list[BenchRecord]) -> GroupSummary:
    """The numbers of GroupSummary for these records (one per problem)."""
    n = len(records)
    if n == 0:
        raise ValueError(f"{label}: no problems to summarize")
    correct = [r for r in records if r.correct]
    speedups = [s for s in (usable_speedup(r.speedup) for r in correct) if s is not None]
    fast = {
        fast_p_label(p): (
            len(correct) if p == 0 else sum((usable_speedup(r.speedup) or 0.0) > p for r in correct)
        )
        / n
        for p in FAST_P
    }
    with_fallback = [(usable_speedup(r.speedup) if r.correct else None) or 1.0 for r in records]
    vs_compile = [
        s for s in (usable_speedup(r.speedup_vs_compile) for r in correct) if s is not None
    ]
    costs = [r.cost_usd for r in records if isinstance(r.cost_usd, (int, float))]
    times = [r.seconds for r in records if isinstance(r.seconds, (int, float))]
    return GroupSummary(
        label=label,
        level=level,
        problems=n,
        correct=len(correct),
        correct_rate=len(correct) / n,
        fast_p=fast,
        speedup_n=len(speedups),
        mean_speedup=_mean(speedups),
        geomean_speedup=geomean(speedups),
        median_speedup=median(speedups),
        mean_speedup_all=_mean(with_fallback),
        geomean_speedup_all=geomean(with_fallback),
        compile_n=len(vs_compile),
        mean_speedup_vs_compile=_mean(vs_compile),
        geomean_speedup_vs_compile=geomean(vs_compile),
        cost_usd_total=float(sum(costs)),
        cost_usd_per_kernel=_mean(costs),
        cost_known=len(costs),
        unpriced=sum(bool(r.unpriced_calls) for r in records),
        seconds_total=float(sum(times)),
        seconds_per_kernel=_mean(times),
        statuses=dict(Counter(r.status for r in records).most_common()),
        baselines=all_baselines([(r.speedup, r.speedup_vs_compile) for r in correct], n),
    )


# ---------------------------------------------------------------- the summary


@dataclass
class Summary:
    """A benchmark's summary: one GroupSummary per level (ascending), then "all" (groups[-1]).
    records: one per problem, ordered by level and id (a problem recorded twice, e.g. retried
    after an error, counts once, by its last record; `superseded` counts the earlier ones)."""

    sources: list[str]
    groups: list[GroupSummary]
    records: list[BenchRecord]
    superseded: int = 0
    torn_lines: int = 0  # unfinished last lines left out (a run still writing, or killed)
    settings: dict[str, list[Any]] = field(default_factory=dict)  # meta key -> values seen

    @property
    def overall(self) -> GroupSummary:
        return self.groups[-1]

    def level(self, level: int) -> GroupSummary:
        for group in self.groups[:-1]:
            if group.level == level:
                return group
        raise KeyError(f"no problems of level {level} in this summary")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self, problems: bool = True) -> str:
        """The summary table, what its numbers mean, and (problems=True) one row per problem."""
        return summary_markdown(self, problems)

    def to_html(self) -> str:
        """A self-contained HTML page (well-formed XML too): the tables, and inline SVG plots of
        the speedup distribution, the speedup of each problem, and its time and cost."""
        return summary_page(self)

    # ------------------------------------------------------------ what the renderings show

    def source_names(self) -> str:
        """The results files' names, 'a.jsonl, b.jsonl'."""
        return ", ".join(Path(s).name for s in self.sources)

    def source_line(self) -> str:
        """How many problems, from which files, and what was left out."""
        o = self.overall
        levels = ", ".join(f"{g.label}: {g.problems}" for g in self.groups[:-1])
        text = f"{o.problems} problems" + (f" ({levels})" if len(self.groups) > 2 else "")
        text += f", from {', '.join(self.sources)}."
        if self.superseded:
            text += f" {self.superseded} earlier records of re-run problems are superseded."
        if self.torn_lines:
            text += f" {self.torn_lines} unfinished last line left out."
        return text

    def settings_text(self) -> str:
        """The run settings seen in the records ('coder o3; rounds mixed (5, 10)'); '' if none."""
        parts = []
        for key, values in self.settings.items():
            shown = ", ".join(str(v) for v in values)
            parts.append(f"{key} {shown}" if len(values) == 1 else f"{key} mixed ({shown})")
        return "; ".join(parts)

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The summary table: one row per level, then all problems (the last row)."""
        header = ["", "problems", "correct (fast_0)"]
        header += [fast_p_label(p) for p in FAST_P if p > 0]
        header += ["mean speedup", "geomean speedup", "mean, failed = 1x", "cost / kernel"]
        header += ["time / kernel"]
        rows = []
        for g in self.groups:
            row = [g.label, str(g.problems), f"{percent(g.correct_rate)} ({g.correct})"]
            row += [percent(g.fast_p[fast_p_label(p)]) for p in FAST_P if p > 0]
            row += [times(g.mean_speedup), times(g.geomean_speedup), times(g.mean_speedup_all)]
            row += [usd(g.cost_usd_per_kernel), duration(g.seconds_per_kernel)]
            rows.append(row)
        return header, rows

    def baseline_table(self) -> tuple[list[str], list[list[str]]]:
        """fast_p, geomean and median against eager, torch.compile and the faster of the two:
        one row per level and baseline, then all problems."""
        header = ["", "against", "timed"]
        header += list(self.overall.baselines[0].fast_p) + ["geomean speedup", "median speedup"]
        rows = []
        for g in self.groups:
            for b in g.baselines:
                row = [g.label, b.label, f"{b.n} of {b.problems}"]
                row += [percent(share) for share in b.fast_p.values()]
                rows.append(row + [times(b.geomean), times(b.median)])
        return header, rows

    def notes(self) -> list[str]:
        """What the numbers of the table mean, with the ones that do not fit in it."""
        o = self.overall
        notes = [
            "correct (fast_0): share of all problems for which a correct kernel was found.",
            (
                "fast_p: share of all problems whose kernel is correct and more than p times "
                "faster than PyTorch eager (a problem without a correct kernel counts as not fast)."
            ),
            (
                "speedup: PyTorch eager time / the best kernel's time. Mean, geomean (and median "
                f"{times(o.median_speedup)}) are over the correct problems with a measured "
                f"speedup (n = {o.speedup_n} of {o.problems}); 'mean, failed = 1x' is over all "
                "problems, one without a correct kernel counted as 1x (PyTorch kept); its "
                f"geomean is {times(o.geomean_speedup_all)}."
            ),
            (
                "cost / kernel: API cost in USD, mean over problems (total "
                f"{usd(o.cost_usd_total)}); time / kernel: wall time of the agents' loop, mean "
                f"over problems (total {duration(o.seconds_total)})."
            ),
        ]
        if o.compile_n:
            notes.append(
                f"vs torch.compile: mean {times(o.mean_speedup_vs_compile)}, geomean "
                f"{times(o.geomean_speedup_vs_compile)} over the {o.compile_n} correct problems "
                "timed against torch.compile of the reference. In the baseline table, "
                "max(eager, compile) is the speedup over the faster of the two (a problem whose "
                "torch.compile was not timed counts against eager alone); 'timed' counts the "
                "correct problems with a time for that baseline."
            )
        if o.cost_known < o.problems:
            notes.append(
                f"{o.problems - o.cost_known} problems ended in an error with an unknown cost; the "
                "cost per kernel is over the other problems."
            )
        if o.unpriced:
            notes.append(
                f"{o.unpriced} problems called a model without a known price; those calls are not "
                "in the cost."
            )
        counts = ", ".join(f"{status} {n}" for status, n in o.statuses.items())
        notes.append(f"outcomes: {counts}.")
        notes.append(PAPER_NOTE)
        return notes

    def problem_table(self) -> tuple[list[str], list[list[str]]]:
        """One row per problem, in the order of `records`."""
        header = ["problem", "level", "status", "speedup", "vs compile", "rounds", "cost", "time"]
        header.append("error")
        rows = []
        for r in self.records:
            rows.append(
                [
                    r.key,
                    "-" if r.level is None else str(r.level),
                    r.status,
                    times(usable_speedup(r.speedup)) if r.correct else "-",
                    times(usable_speedup(r.speedup_vs_compile)) if r.correct else "-",
                    str(r.rounds),
                    usd(r.cost_usd),
                    duration(r.seconds),
                    r.error if len(r.error) <= 120 else r.error[:117] + "...",
                ]
            )
        return header, rows


def summarize(
    records: Iterable[BenchRecord | dict[str, Any]], sources: Iterable[str] = ()
) -> Summary:
    """The Summary of these records; a problem key seen twice counts by its last record."""
    latest: dict[str, BenchRecord] = {}
    total = 0
    for item in records:
        record = item if isinstance(item, BenchRecord) else BenchRecord.from_dict(item)
        latest.pop(record.key, None)
        latest[record.key] = record
        total += 1
    if not latest:
        raise ValueError("no benchmark records to summarize")
    ordered = sorted(
        latest.values(),
        key=lambda r: (r.level is None, r.level or 0, r.problem_id or 0, r.key),
    )
    levels = sorted({r.level for r in ordered if r.level is not None})
    groups = [
        summarize_group(f"level {lv}", lv, [r for r in ordered if r.level == lv]) for lv in levels
    ]
    unleveled = [r for r in ordered if r.level is None]
    if unleveled and levels:
        groups.append(summarize_group("no level", None, unleveled))
    groups.append(summarize_group("all", None, ordered))
    settings: dict[str, list[Any]] = {}
    for record in ordered:
        for key, value in record.meta.items():
            seen = settings.setdefault(key, [])
            if value not in seen:
                seen.append(value)
    return Summary(list(sources), groups, ordered, total - len(latest), 0, settings)


def report(path: str | os.PathLike, *more: str | os.PathLike) -> Summary:
    """The Summary of one or more results files (read in order; a problem in several counts by
    its last record). Raises FileNotFoundError for a missing file and ValueError for a file with
    no records or a line that is not a record."""
    records: list[dict[str, Any]] = []
    torn = 0
    paths = [Path(p) for p in (path, *more)]
    for one in paths:
        if not one.is_file():
            raise FileNotFoundError(f"results file {one} does not exist")
        read = read_results(one)
        if not read.records:
            detail = " (only an unfinished line)" if read.torn_bytes else ""
            raise ValueError(
                f"results file {one} holds no benchmark records{detail}; `cudaforge bench` "
                "appends one line per finished problem"
            )
        records += read.records
        torn += bool(read.torn_bytes)
    summary = summarize(records, [str(p) for p in paths])
    summary.torn_lines = torn
    return summary


__all__ = [
    "FAST_P",
    "PAPER_NOTE",
    "GroupSummary",
    "Summary",
    "fast_p_label",
    "report",
    "summarize",
    "summarize_group",
]
