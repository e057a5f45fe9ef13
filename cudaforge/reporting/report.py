"""The benchmark summary in the CudaForge paper's terms, as markdown and as one HTML page.

From a results file of `cudaforge.cli.bench` (one JSON record per problem): the correctness rate,
fast_p (the share of ALL problems whose kernel is correct and more than p times faster than
PyTorch eager, p = 0, 1, 1.5, 2; fast_0 is the correctness rate), the mean and geometric-mean
speedup over the correct problems, the same with a problem without a correct kernel counted as 1x,
and the cost and time per kernel, per level and overall. The HTML page draws its plots as inline
SVG, so it needs nothing but this module and opens anywhere.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import json
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli.bench import BenchRecord, read_results

FAST_P = (0.0, 1.0, 1.5, 2.0)
# what the paper reports (arXiv 2511.01884, abstract), shown beside our numbers for orientation
PAPER_NOTE = (
    "For orientation, the CudaForge paper reports 97.6% correct kernels and a 1.68x average "
    "speedup over PyTorch on KernelBench with OpenAI o3, at about $0.3 of API cost and 26.5 "
    "minutes (on one RTX 6000) per kernel."
)
LEVEL_COLORS = {1: "#4c78a8", 2: "#f58518", 3: "#54a24b", 4: "#b279a2"}
OTHER_COLOR = "#9d755d"
FAILED_COLOR = "#e45756"


# ---------------------------------------------------------------- numbers


def _speedup(value: Any) -> float | None:
    """A usable speedup: a positive finite number, else None."""
    usable = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if usable and math.isfinite(value) and value > 0 else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered, middle = sorted(values), len(values) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


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

    @property
    def errors(self) -> int:
        return self.statuses.get("error", 0)


def summarize_group(label: str, level: int | None, records: list[BenchRecord]) -> GroupSummary:
    """The numbers of GroupSummary for these records (one per problem)."""
    n = len(records)
    if n == 0:
        raise ValueError(f"{label}: no problems to summarize")
    correct = [r for r in records if r.correct]
    speedups = [s for s in (_speedup(r.speedup) for r in correct) if s is not None]
    fast = {
        fast_p_label(p): (
            len(correct) if p == 0 else sum((_speedup(r.speedup) or 0.0) > p for r in correct)
        )
        / n
        for p in FAST_P
    }
    with_fallback = [(_speedup(r.speedup) if r.correct else None) or 1.0 for r in records]
    vs_compile = [s for s in (_speedup(r.speedup_vs_compile) for r in correct) if s is not None]
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
        geomean_speedup=_geomean(speedups),
        median_speedup=_median(speedups),
        mean_speedup_all=_mean(with_fallback),
        geomean_speedup_all=_geomean(with_fallback),
        compile_n=len(vs_compile),
        mean_speedup_vs_compile=_mean(vs_compile),
        geomean_speedup_vs_compile=_geomean(vs_compile),
        cost_usd_total=float(sum(costs)),
        cost_usd_per_kernel=_mean(costs),
        cost_known=len(costs),
        unpriced=sum(bool(r.unpriced_calls) for r in records),
        seconds_total=float(sum(times)),
        seconds_per_kernel=_mean(times),
        statuses=dict(Counter(r.status for r in records).most_common()),
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
        title = f"# Benchmark summary: {', '.join(Path(s).name for s in self.sources)}"
        lines = [title, "", self._source_line(), ""]
        if self.settings:
            lines += [f"Settings: {_settings_text(self.settings)}", ""]
        header, rows = _summary_table(self)
        lines += _markdown_table(header, rows, bold_last=True)
        lines += [""] + [f"- {note}" for note in _notes(self)]
        if problems:
            lines += ["", "## Problems", ""]
            lines += _markdown_table(*_problem_table(self.records))
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        """A self-contained HTML page (well-formed XML too): the tables, and inline SVG plots of
        the speedup distribution, the speedup of each problem, and its time and cost."""
        return _html_page(self)

    def _source_line(self) -> str:
        o = self.overall
        levels = ", ".join(f"{g.label}: {g.problems}" for g in self.groups[:-1])
        text = f"{o.problems} problems" + (f" ({levels})" if len(self.groups) > 2 else "")
        text += f", from {', '.join(self.sources)}."
        if self.superseded:
            text += f" {self.superseded} earlier records of re-run problems are superseded."
        if self.torn_lines:
            text += f" {self.torn_lines} unfinished last line left out."
        return text


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


# ---------------------------------------------------------------- text


def _x(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:.2f}" if value >= 0.995 or value == 0 else f"${value:.3f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _settings_text(settings: dict[str, list[Any]]) -> str:
    parts = []
    for key, values in settings.items():
        shown = ", ".join(str(v) for v in values)
        parts.append(f"{key} {shown}" if len(values) == 1 else f"{key} mixed ({shown})")
    return "; ".join(parts)


def _summary_table(summary: Summary) -> tuple[list[str], list[list[str]]]:
    header = ["", "problems", "correct (fast_0)"]
    header += [fast_p_label(p) for p in FAST_P if p > 0]
    header += ["mean speedup", "geomean speedup", "mean, failed = 1x", "cost / kernel"]
    header += ["time / kernel"]
    rows = []
    for g in summary.groups:
        row = [g.label, str(g.problems), f"{_pct(g.correct_rate)} ({g.correct})"]
        row += [_pct(g.fast_p[fast_p_label(p)]) for p in FAST_P if p > 0]
        row += [_x(g.mean_speedup), _x(g.geomean_speedup), _x(g.mean_speedup_all)]
        row += [_usd(g.cost_usd_per_kernel), _duration(g.seconds_per_kernel)]
        rows.append(row)
    return header, rows


def _notes(summary: Summary) -> list[str]:
    o = summary.overall
    notes = [
        "correct (fast_0): share of all problems for which a correct kernel was found.",
        (
            "fast_p: share of all problems whose kernel is correct and more than p times faster "
            "than PyTorch eager (a problem without a correct kernel counts as not fast)."
        ),
        (
            "speedup: PyTorch eager time / the best kernel's time. Mean, geomean (and median "
            f"{_x(o.median_speedup)}) are over the correct problems with a measured speedup "
            f"(n = {o.speedup_n} of {o.problems}); 'mean, failed = 1x' is over all problems, one "
            "without a correct kernel counted as 1x (PyTorch kept); its geomean is "
            f"{_x(o.geomean_speedup_all)}."
        ),
        (
            f"cost / kernel: API cost in USD, mean over problems (total {_usd(o.cost_usd_total)}); "
            f"time / kernel: wall time of the agents' loop, mean over problems (total "
            f"{_duration(o.seconds_total)})."
        ),
    ]
    if o.compile_n:
        notes.append(
            f"vs torch.compile: mean {_x(o.mean_speedup_vs_compile)}, geomean "
            f"{_x(o.geomean_speedup_vs_compile)} over the {o.compile_n} correct problems timed "
            "against torch.compile of the reference."
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


def _problem_table(records: list[BenchRecord]) -> tuple[list[str], list[list[str]]]:
    header = ["problem", "level", "status", "speedup", "vs compile", "rounds", "cost", "time"]
    header.append("error")
    rows = []
    for r in records:
        rows.append(
            [
                r.key,
                "-" if r.level is None else str(r.level),
                r.status,
                _x(_speedup(r.speedup)) if r.correct else "-",
                _x(_speedup(r.speedup_vs_compile)) if r.correct else "-",
                str(r.rounds),
                _usd(r.cost_usd),
                _duration(r.seconds),
                r.error if len(r.error) <= 120 else r.error[:117] + "...",
            ]
        )
    return header, rows


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _markdown_table(header: list[str], rows: list[list[str]], bold_last: bool = False) -> list[str]:
    aligns = ["---"] + [
        "---:" if _numeric_column(rows, i) else "---" for i in range(1, len(header))
    ]
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
    lines.append("| " + " | ".join(aligns) + " |")
    for i, row in enumerate(rows):
        cells = [_md_cell(c) for c in row]
        if bold_last and i == len(rows) - 1:
            cells[0] = f"**{cells[0]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _numeric_column(rows: list[list[str]], index: int) -> bool:
    values = [row[index] for row in rows if row[index] not in ("-", "")]
    return bool(values) and all(v.lstrip("$")[:1].isdigit() for v in values)


# ---------------------------------------------------------------- SVG plots

_W, _H = 860, 280
# each chart carries its own style, so that it also reads right when saved on its own
_SVG_STYLE = (
    "text { font-family: system-ui, sans-serif; fill: #444; font-size: 11px; } "
    ".chart-title { font-size: 14px; font-weight: bold; fill: #222; } "
    ".axis-label { font-size: 12px; } "
    ".grid { stroke: #e4e4e4; stroke-width: 1; } "
    ".separator { stroke: #bbb; stroke-width: 1; stroke-dasharray: 3 3; } "
    ".baseline { stroke: #222; stroke-width: 1.2; stroke-dasharray: 5 3; }"
)
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 16, 34, 58


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _color(level: int | None) -> str:
    return LEVEL_COLORS.get(level, OTHER_COLOR) if level is not None else OTHER_COLOR


def _level_name(level: int | None) -> str:
    return f"level {level}" if level is not None else "no level"


def _nice_step(top: float, count: int = 5) -> float:
    raw = max(top, 1e-12) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if factor * magnitude >= raw:
            return factor * magnitude
    return 10 * magnitude


def _svg_open(chart_id: str, title: str, height: int = _H) -> list[str]:
    return [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" id="{_esc(chart_id)}" class="chart" '
            f'viewBox="0 0 {_W} {height}" width="{_W}" height="{height}" role="img" '
            f'aria-label="{_esc(title)}">'
        ),
        f"<title>{_esc(title)}</title>",
        f"<style>{_SVG_STYLE}</style>",
        f'<text x="{_LEFT}" y="18" class="chart-title">{_esc(title)}</text>',
    ]


def _legend(levels: list[int | None], extra: list[tuple[str, str]] = ()) -> list[str]:
    items = [(_level_name(lv), _color(lv)) for lv in levels] + list(extra)
    out, x = [], _W - _RIGHT
    for label, color in reversed(items):
        x -= 14 + 7 * len(label) + 12
        out.append(f'<rect x="{x}" y="8" width="11" height="11" fill="{color}"/>')
        out.append(f'<text x="{x + 15}" y="18" class="legend">{_esc(label)}</text>')
    return out


def _y_axis_linear(top: float, unit_format, label: str, height: int = _H) -> tuple[list[str], Any]:
    """Gridlines and labels for 0..top; returns them and the value -> y function."""
    step = _nice_step(top)
    axis_top = step * max(1, math.ceil(top / step - 1e-9))
    plot_h = height - _TOP - _BOTTOM

    def y(value: float) -> float:
        return height - _BOTTOM - plot_h * value / axis_top

    out = []
    ticks = round(axis_top / step)
    for i in range(ticks + 1):
        value = i * step
        out.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_num(y(value))}" y2="{_num(y(value))}" '
            'class="grid"/>'
        )
        out.append(
            f'<text x="{_LEFT - 6}" y="{_num(y(value) + 4)}" class="tick" text-anchor="end">'
            f"{_esc(unit_format(value))}</text>"
        )
    out.append(_y_label(label, height))
    return out, y


def _y_label(label: str, height: int = _H) -> str:
    middle = _TOP + (height - _TOP - _BOTTOM) / 2
    return (
        f'<text x="14" y="{_num(middle)}" class="axis-label" text-anchor="middle" '
        f'transform="rotate(-90 14 {_num(middle)})">{_esc(label)}</text>'
    )


# speedup bins (lo, hi]: their edges include the fast_p thresholds 1, 1.5 and 2
HISTOGRAM_EDGES = (0.0, 0.5, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, math.inf)


def _bin_label(lo: float, hi: float) -> str:
    if lo == 0:
        return f"\u2264{hi:g}x"
    if math.isinf(hi):
        return f">{lo:g}x"
    return f"{lo:g}\u2013{hi:g}x"


def speedup_histogram_svg(records: list[BenchRecord]) -> str:
    """Bars of how many problems fall in each speedup range, stacked by level, with a bar for the
    problems without a correct kernel."""
    levels = sorted({r.level for r in records}, key=lambda lv: (lv is None, lv or 0))
    bins = list(itertools.pairwise(HISTOGRAM_EDGES))
    columns: list[tuple[str, dict[int | None, int], str]] = []
    failed = Counter(r.level for r in records if not r.correct or _speedup(r.speedup) is None)
    columns.append(("no correct kernel", {None: sum(failed.values())}, FAILED_COLOR))
    for lo, hi in bins:
        inside = Counter(
            r.level
            for r in records
            if r.correct and (s := _speedup(r.speedup)) is not None and lo < s <= hi
        )
        columns.append((_bin_label(lo, hi), dict(inside), ""))
    top = max(sum(c.values()) for _, c, _ in columns) or 1
    out = _svg_open("speedup-histogram", "Speedup distribution (problems per speedup range)")
    grid, y = _y_axis_linear(top * 1.08, lambda v: f"{v:g}", "problems")  # room for the counts
    out += grid
    slot = (_W - _LEFT - _RIGHT) / len(columns)
    width = slot * 0.72
    for i, (label, counts, color) in enumerate(columns):
        x = _LEFT + i * slot + (slot - width) / 2
        base = 0
        for level in levels if not color else [None]:
            count = counts.get(level, 0)
            if not count:
                continue
            fill = color or _color(level)
            tip = f"{label}: {count} problems" + ("" if color else f" of {_level_name(level)}")
            out.append(
                f'<rect x="{_num(x)}" y="{_num(y(base + count))}" width="{_num(width)}" '
                f'height="{_num(y(base) - y(base + count))}" fill="{fill}" class="bar">'
                f"<title>{_esc(tip)}</title></rect>"
            )
            base += count
        if base:
            out.append(
                f'<text x="{_num(x + width / 2)}" y="{_num(y(base) - 4)}" class="value" '
                f'text-anchor="middle">{base}</text>'
            )
        out.append(
            f'<text x="{_num(x + width / 2)}" y="{_H - _BOTTOM + 16}" class="tick" '
            f'text-anchor="middle">{_esc(label if i else "failed")}</text>'
        )
    # the line between slower and faster than PyTorch: after the bin that ends at 1x
    one = 1 + HISTOGRAM_EDGES.index(1.0)
    x_one = _LEFT + one * slot
    out.append(
        f'<line x1="{_num(x_one)}" x2="{_num(x_one)}" y1="{_TOP}" y2="{_H - _BOTTOM}" '
        'class="baseline"/>'
    )
    out.append(
        f'<text x="{_num(x_one + 4)}" y="{_TOP - 4}" class="tick">faster than PyTorch \u2192</text>'
    )
    out.append(
        f'<text x="{_num(_LEFT + (_W - _LEFT - _RIGHT) / 2)}" y="{_H - 18}" class="axis-label" '
        'text-anchor="middle">speedup over PyTorch eager</text>'
    )
    out += _legend(levels, [("failed", FAILED_COLOR)])
    out.append("</svg>")
    return "\n".join(out)


def _problem_slots(records: list[BenchRecord]) -> tuple[float, list[str]]:
    """The width of each problem's slot and the level names under the axis."""
    slot = (_W - _LEFT - _RIGHT) / len(records)
    out, start = [], 0
    labelled = len(records) <= 40  # few enough to name each bar by its id under the axis
    if labelled:
        for i, r in enumerate(records):
            name = str(r.problem_id) if r.problem_id is not None else r.problem[:8]
            out.append(
                f'<text x="{_num(_LEFT + slot * (i + 0.5))}" y="{_H - _BOTTOM + 13}" '
                f'class="tick" text-anchor="middle">{_esc(name)}</text>'
            )
    for i in range(1, len(records) + 1):
        if i == len(records) or records[i].level != records[start].level:
            middle = _LEFT + slot * (start + i) / 2
            out.append(
                f'<text x="{_num(middle)}" y="{_H - _BOTTOM + (30 if labelled else 16)}" '
                f'class="tick" text-anchor="middle">'
                f"{_esc(_level_name(records[start].level))}</text>"
            )
            if start:
                x = _LEFT + slot * start
                out.append(
                    f'<line x1="{_num(x)}" x2="{_num(x)}" y1="{_TOP}" y2="{_H - _BOTTOM}" '
                    'class="separator"/>'
                )
            start = i
    return slot, out


def speedup_bars_svg(records: list[BenchRecord]) -> str:
    """One bar per problem on a log scale around 1x (up: faster than PyTorch, down: slower);
    a red mark on the 1x line for a problem without a correct kernel."""
    speedups = [s for s in (_speedup(r.speedup) for r in records if r.correct) if s is not None]
    low = 2.0 ** math.floor(math.log2(min(speedups + [0.5])))
    high = 2.0 ** math.ceil(math.log2(max(speedups + [2.0])))
    plot_h = _H - _TOP - _BOTTOM
    span = math.log2(high) - math.log2(low)

    def y(value: float) -> float:
        return _TOP + plot_h * (math.log2(high) - math.log2(value)) / span

    out = _svg_open("speedup-bars", "Speedup of each problem (log scale)")
    exponents = range(round(math.log2(low)), round(math.log2(high)) + 1)
    stride = max(1, math.ceil(len(exponents) / 8))
    for e in exponents:
        if e % stride:
            continue
        value = 2.0**e
        out.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_num(y(value))}" y2="{_num(y(value))}" '
            'class="grid"/>'
        )
        out.append(
            f'<text x="{_LEFT - 6}" y="{_num(y(value) + 4)}" class="tick" text-anchor="end">'
            f"{value:g}x</text>"
        )
    out.append(_y_label("speedup over PyTorch eager"))
    slot, axis = _problem_slots(records)
    width = min(max(slot * 0.8, 0.5), 36.0)
    for i, r in enumerate(records):
        x = _LEFT + i * slot + (slot - width) / 2
        s = _speedup(r.speedup) if r.correct else None
        if s is None:
            tip = f"{r.key}: {r.status}" + (f" ({r.error})" if r.error else "")
            out.append(
                f'<rect x="{_num(x)}" y="{_num(y(1.0) - 3)}" width="{_num(width)}" height="6" '
                f'fill="{FAILED_COLOR}" class="bar failed"><title>{_esc(tip)}</title></rect>'
            )
            continue
        top, bottom = min(y(s), y(1.0)), max(y(s), y(1.0))
        out.append(
            f'<rect x="{_num(x)}" y="{_num(top)}" width="{_num(width)}" '
            f'height="{_num(max(bottom - top, 1.0))}" fill="{_color(r.level)}" class="bar">'
            f"<title>{_esc(f'{r.key}: {s:.3g}x')}</title></rect>"
        )
    out += axis
    out.append(
        f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_num(y(1.0))}" y2="{_num(y(1.0))}" '
        'class="baseline"/>'
    )
    levels = sorted({r.level for r in records}, key=lambda lv: (lv is None, lv or 0))
    out += _legend(levels, [("no correct kernel", FAILED_COLOR)])
    out.append("</svg>")
    return "\n".join(out)


def per_problem_svg(records: list[BenchRecord], chart_id: str, title: str, what: str) -> str:
    """One bar per problem of a record field: what = "seconds" (drawn in seconds, minutes or
    hours, whichever fits) or "cost_usd"; a problem without a correct kernel is drawn paler."""
    raw = [getattr(r, what) for r in records]
    raw = [v if isinstance(v, (int, float)) and math.isfinite(v) else None for v in raw]
    longest = max([v for v in raw if v is not None] + [0.0])
    if what != "seconds":
        scale, label = 1.0, "USD"
    elif longest < 120:
        scale, label = 1.0, "seconds"
    else:
        scale, label = (60.0, "minutes") if longest < 7200 else (3600.0, "hours")
    values = [v / scale if v is not None else None for v in raw]
    top = max([v for v in values if v is not None] + [0.0]) or 1.0
    out = _svg_open(chart_id, title)

    def tick(v: float) -> str:
        return f"${v:g}" if what == "cost_usd" else f"{v:g}"

    grid, y = _y_axis_linear(top, tick, label)
    out += grid
    slot, axis = _problem_slots(records)
    width = min(max(slot * 0.8, 0.5), 36.0)
    for i, (r, v, original) in enumerate(zip(records, values, raw)):
        if v is None:
            continue
        x = _LEFT + i * slot + (slot - width) / 2
        shown = _duration(original) if what == "seconds" else _usd(original)
        tip = f"{r.key}: {shown} ({'correct' if r.correct else r.status})"
        pale = "" if r.correct else ' fill-opacity="0.4"'
        out.append(
            f'<rect x="{_num(x)}" y="{_num(y(v))}" width="{_num(width)}" '
            f'height="{_num(max(y(0) - y(v), 0.5))}" fill="{_color(r.level)}" '
            f'class="bar{"" if r.correct else " failed"}"{pale}><title>{_esc(tip)}</title></rect>'
        )
    out += axis
    levels = sorted({r.level for r in records}, key=lambda lv: (lv is None, lv or 0))
    out += _legend(levels)
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------- the page

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 900px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
tr.all td { font-weight: bold; border-top: 2px solid #888; }
table.problems { font-size: 12px; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 12px; }
svg.chart { max-width: 100%; height: auto; }
.notes li { margin: 0.3em 0; } .source { color: #555; }
"""


def _html_table(
    header: list[str], rows: list[list[str]], css_class: str, last_is_total: bool = False
) -> list[str]:
    out = [f'<table class="{css_class}">', "<thead><tr>"]
    out += [f"<th>{_esc(h)}</th>" for h in header]
    out += ["</tr></thead>", "<tbody>"]
    text_columns = {i for i in range(len(header)) if not _numeric_column(rows, i)}
    for i, row in enumerate(rows):
        total = last_is_total and i == len(rows) - 1
        out.append('<tr class="all">' if total else "<tr>")
        for j, cell in enumerate(row):
            attr = ' class="text"' if j in text_columns else ""
            out.append(f"<td{attr}>{_esc(cell)}</td>")
        out.append("</tr>")
    out += ["</tbody>", "</table>"]
    return out


def _figure(svg: str, caption: str) -> str:
    return f"<figure>\n{svg}\n<figcaption>{_esc(caption)}</figcaption>\n</figure>"


def _html_page(summary: Summary) -> str:
    records = summary.records
    names = ", ".join(Path(s).name for s in summary.sources) or "results"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8"/>',
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
        f"<title>cudaforge benchmark: {_esc(names)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>Benchmark summary: {_esc(names)}</h1>",
        f'<p class="source">{_esc(summary._source_line())}</p>',
    ]
    if summary.settings:
        out.append(f'<p class="source">Settings: {_esc(_settings_text(summary.settings))}</p>')
    out += _html_table(*_summary_table(summary), "summary", last_is_total=True)
    out.append('<ul class="notes">')
    out += [f"<li>{_esc(note)}</li>" for note in _notes(summary)]
    out.append("</ul>")
    out.append("<h2>Speedup</h2>")
    out.append(
        _figure(
            speedup_histogram_svg(records),
            "Correct problems by speedup range (lo, hi], stacked by level; the first bar counts "
            "the problems without a correct kernel. Right of the dashed line: faster than "
            "PyTorch eager (the fast_1 problems).",
        )
    )
    out.append(
        _figure(
            speedup_bars_svg(records),
            "Each problem's best correct kernel, ordered by level and id; bars above the dashed "
            "1x line are faster than PyTorch eager. Hover a bar for its name.",
        )
    )
    out.append("<h2>Time and cost</h2>")
    out.append(
        _figure(
            per_problem_svg(records, "time-bars", "Wall time per problem", "seconds"),
            "Wall time of the agents' loop for each problem; paler bars: no correct kernel.",
        )
    )
    out.append(
        _figure(
            per_problem_svg(records, "cost-bars", "API cost per problem", "cost_usd"),
            "API cost (USD) of each problem; paler bars: no correct kernel.",
        )
    )
    out.append("<h2>Problems</h2>")
    out += _html_table(*_problem_table(records), "problems")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


__all__ = [
    "FAST_P",
    "GroupSummary",
    "Summary",
    "fast_p_label",
    "per_problem_svg",
    "report",
    "speedup_bars_svg",
    "speedup_histogram_svg",
    "summarize",
    "summarize_group",
]
