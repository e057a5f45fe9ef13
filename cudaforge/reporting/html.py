"""The reports as HTML with inline SVG charts: a benchmark summary as one self-contained page, an
optimize run as a fragment for a notebook cell. Both are built from the same parts: escaping, the
page or fragment shell, tables, figures, and the SVG chart frame, axes, legend and bars. The
output is well-formed XML and fetches nothing, so a page opens anywhere."""

from __future__ import annotations

import html
import itertools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..cli.bench import BenchRecord
from .formatting import (
    duration,
    evidence,
    milliseconds,
    numeric_column,
    share_text,
    status_text,
    times,
    usable_speedup,
    usd,
)

LEVEL_COLORS = {1: "#4c78a8", 2: "#f58518", 3: "#54a24b", 4: "#b279a2"}
OTHER_COLOR = "#9d755d"
FAILED_COLOR = "#e45756"
BEFORE_COLOR = "#bbb"
AFTER_COLOR = "#2a9d55"
# speedup bins (lo, hi]: their edges include the fast_p thresholds 1, 1.5 and 2
HISTOGRAM_EDGES = (0.0, 0.5, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, math.inf)


class Html(str):
    """Text that is HTML already: a table puts it in its cell as it is, not escaped."""


def esc(text: Any) -> str:
    """Text made safe for an element or an attribute value."""
    return html.escape(str(text), quote=True)


def _shorten(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


# ---------------------------------------------------------------- the shell

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


def document(title: str, body: list[str]) -> str:
    """A whole page: the style inline, nothing fetched."""
    head = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8"/>',
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
        f"<title>{esc(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
    ]
    return "\n".join(head + body + ["</body>", "</html>"]) + "\n"


def fragment(body: list[str]) -> str:
    """A part of a page (a notebook cell's output): no page style, so it takes the notebook's."""
    return '<div class="cudaforge-report">' + "".join(body) + "</div>"


def html_table(
    header: list[str],
    rows: list[list[str]],
    css_class: str = "",
    last_is_total: bool = False,
) -> list[str]:
    """A table's lines; numeric columns right-aligned by the page style, the others marked
    'text'. A cell that is Html goes in as it is, any other is escaped."""
    out = [f'<table class="{css_class}">' if css_class else "<table>", "<thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in header]
    out += ["</tr></thead>", "<tbody>"]
    text_columns = {i for i in range(len(header)) if not numeric_column(rows, i)}
    for i, row in enumerate(rows):
        total = last_is_total and i == len(rows) - 1
        out.append('<tr class="all">' if total else "<tr>")
        for j, cell in enumerate(row):
            attr = ' class="text"' if j in text_columns else ""
            out.append(f"<td{attr}>{cell if isinstance(cell, Html) else esc(cell)}</td>")
        out.append("</tr>")
    out += ["</tbody>", "</table>"]
    return out


def figure(svg: str, caption: str) -> str:
    return f"<figure>\n{svg}\n<figcaption>{esc(caption)}</figcaption>\n</figure>"


# ---------------------------------------------------------------- SVG parts

_W, _H = 860, 280
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 16, 34, 58
# each chart carries its own style, scoped to its id, so that it reads right when saved on its
# own and changes nothing else on the page it is in
_SVG_STYLE = (
    "text { font-family: system-ui, sans-serif; fill: #444; font-size: 11px; }",
    ".chart-title { font-size: 14px; font-weight: bold; fill: #222; }",
    ".axis-label { font-size: 12px; }",
    ".grid { stroke: #e4e4e4; stroke-width: 1; }",
    ".separator { stroke: #bbb; stroke-width: 1; stroke-dasharray: 3 3; }",
    ".baseline { stroke: #222; stroke-width: 1.2; stroke-dasharray: 5 3; }",
)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _svg_open(chart_id: str, title: str, width: int = _W, height: int = _H) -> list[str]:
    style = " ".join(f"#{chart_id} {rule}" for rule in _SVG_STYLE)
    return [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" id="{esc(chart_id)}" class="chart" '
            f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{esc(title)}">'
        ),
        f"<title>{esc(title)}</title>",
        f"<style>{style}</style>",
        f'<text x="{_LEFT}" y="18" class="chart-title">{esc(title)}</text>',
    ]


def _bar(x: float, y: float, width: float, height: float, fill: str, tip: str,
         css: str = "bar", extra: str = "") -> str:  # fmt: skip
    """One bar, with its tip (shown on hover)."""
    return (
        f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(width)}" height="{_num(height)}" '
        f'fill="{fill}" class="{css}"{extra}><title>{esc(tip)}</title></rect>'
    )


def _gridline(y: float, label: str) -> list[str]:
    line = f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_num(y)}" y2="{_num(y)}" class="grid"/>'
    text = f'<text x="{_LEFT - 6}" y="{_num(y + 4)}" class="tick" text-anchor="end">'
    return [line, f"{text}{esc(label)}</text>"]


def _color(level: int | None) -> str:
    return LEVEL_COLORS.get(level, OTHER_COLOR) if level is not None else OTHER_COLOR


def _level_name(level: int | None) -> str:
    return f"level {level}" if level is not None else "no level"


def _levels(records: list[BenchRecord]) -> list[int | None]:
    return sorted({r.level for r in records}, key=lambda lv: (lv is None, lv or 0))


def _legend(levels: list[int | None], extra: list[tuple[str, str]] = ()) -> list[str]:
    items = [(_level_name(lv), _color(lv)) for lv in levels] + list(extra)
    out, x = [], _W - _RIGHT
    for label, color in reversed(items):
        x -= 14 + 7 * len(label) + 12
        out.append(f'<rect x="{x}" y="8" width="11" height="11" fill="{color}"/>')
        out.append(f'<text x="{x + 15}" y="18" class="legend">{esc(label)}</text>')
    return out


def _nice_step(top: float, count: int = 5) -> float:
    raw = max(top, 1e-12) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if factor * magnitude >= raw:
            return factor * magnitude
    return 10 * magnitude


def _y_axis_linear(
    top: float, unit_format: Callable[[float], str], label: str
) -> tuple[list[str], Callable[[float], float]]:
    """Gridlines and labels for 0..top; returns them and the value -> y function."""
    step = _nice_step(top)
    axis_top = step * max(1, math.ceil(top / step - 1e-9))
    plot_h = _H - _TOP - _BOTTOM

    def y(value: float) -> float:
        return _H - _BOTTOM - plot_h * value / axis_top

    out = []
    for i in range(round(axis_top / step) + 1):
        out += _gridline(y(i * step), unit_format(i * step))
    out.append(_y_label(label))
    return out, y


def _y_label(label: str) -> str:
    middle = _TOP + (_H - _TOP - _BOTTOM) / 2
    return (
        f'<text x="14" y="{_num(middle)}" class="axis-label" text-anchor="middle" '
        f'transform="rotate(-90 14 {_num(middle)})">{esc(label)}</text>'
    )


# ---------------------------------------------------------------- benchmark charts


def _bin_label(lo: float, hi: float) -> str:
    if lo == 0:
        return f"\u2264{hi:g}x"
    if math.isinf(hi):
        return f">{lo:g}x"
    return f"{lo:g}\u2013{hi:g}x"


def speedup_histogram_svg(records: list[BenchRecord]) -> str:
    """Bars of how many problems fall in each speedup range, stacked by level, with a bar for the
    problems without a correct kernel."""
    levels = _levels(records)
    columns: list[tuple[str, dict[int | None, int], str]] = []
    failed = Counter(r.level for r in records if not r.correct or usable_speedup(r.speedup) is None)
    columns.append(("no correct kernel", {None: sum(failed.values())}, FAILED_COLOR))
    for lo, hi in itertools.pairwise(HISTOGRAM_EDGES):
        inside = Counter(
            r.level
            for r in records
            if r.correct and (s := usable_speedup(r.speedup)) is not None and lo < s <= hi
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
            tip = f"{label}: {count} problems" + ("" if color else f" of {_level_name(level)}")
            height = y(base) - y(base + count)
            out.append(_bar(x, y(base + count), width, height, color or _color(level), tip))
            base += count
        if base:
            out.append(
                f'<text x="{_num(x + width / 2)}" y="{_num(y(base) - 4)}" class="value" '
                f'text-anchor="middle">{base}</text>'
            )
        out.append(
            f'<text x="{_num(x + width / 2)}" y="{_H - _BOTTOM + 16}" class="tick" '
            f'text-anchor="middle">{esc(label if i else "failed")}</text>'
        )
    # the line between slower and faster than PyTorch: after the bin that ends at 1x
    x_one = _LEFT + (1 + HISTOGRAM_EDGES.index(1.0)) * slot
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
                f'class="tick" text-anchor="middle">{esc(name)}</text>'
            )
    for i in range(1, len(records) + 1):
        if i == len(records) or records[i].level != records[start].level:
            middle = _LEFT + slot * (start + i) / 2
            out.append(
                f'<text x="{_num(middle)}" y="{_H - _BOTTOM + (30 if labelled else 16)}" '
                f'class="tick" text-anchor="middle">'
                f"{esc(_level_name(records[start].level))}</text>"
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
    speedups = [s for s in (usable_speedup(r.speedup) for r in records if r.correct) if s]
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
        if e % stride == 0:
            out += _gridline(y(2.0**e), f"{2.0**e:g}x")
    out.append(_y_label("speedup over PyTorch eager"))
    slot, axis = _problem_slots(records)
    width = min(max(slot * 0.8, 0.5), 36.0)
    for i, r in enumerate(records):
        x = _LEFT + i * slot + (slot - width) / 2
        s = usable_speedup(r.speedup) if r.correct else None
        if s is None:
            tip = f"{r.key}: {r.status}" + (f" ({r.error})" if r.error else "")
            out.append(_bar(x, y(1.0) - 3, width, 6, FAILED_COLOR, tip, "bar failed"))
            continue
        top, bottom = min(y(s), y(1.0)), max(y(s), y(1.0))
        out.append(
            _bar(x, top, width, max(bottom - top, 1.0), _color(r.level), f"{r.key}: {s:.3g}x")
        )
    out += axis
    out.append(
        f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_num(y(1.0))}" y2="{_num(y(1.0))}" '
        'class="baseline"/>'
    )
    out += _legend(_levels(records), [("no correct kernel", FAILED_COLOR)])
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
        shown = duration(original) if what == "seconds" else usd(original)
        tip = f"{r.key}: {shown} ({'correct' if r.correct else r.status})"
        css, pale = ("bar", "") if r.correct else ("bar failed", ' fill-opacity="0.4"')
        height = max(y(0) - y(v), 0.5)
        out.append(_bar(x, y(v), width, height, _color(r.level), tip, css, pale))
    out += axis
    out += _legend(_levels(records))
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------- an optimize run's chart


def before_after_svg(rows: list[tuple[str, float | None, float | None]]) -> str:
    """Two horizontal bars per row, a time before (grey) and after (green), in ms."""
    width, label_w, bar_h = 560, 230, 9
    top = max([v for _, a, b in rows for v in (a, b) if v] or [1.0])
    height = 30 + len(rows) * (2 * bar_h + 10)
    title = "Time per call, ms (grey: before, green: after)"
    out = _svg_open("before-after", title, width, height)
    y = 30
    for name, before, after in rows:
        out.append(f'<text x="0" y="{y + bar_h + 3}">{esc(_shorten(name, 36))}</text>')
        for value, color, dy, when in (
            (before, BEFORE_COLOR, 0, "before"),
            (after, AFTER_COLOR, bar_h + 1, "after"),
        ):
            if value:
                w = max(1.0, (width - label_w - 60) * value / top)
                out.append(
                    _bar(label_w, y + dy, w, bar_h, color, f"{name}, {when}: {value:.3g} ms")
                )
                out.append(
                    f'<text x="{_num(label_w + w + 3)}" y="{y + dy + 8}" class="value">'
                    f"{value:.3g}</text>"
                )
        y += 2 * bar_h + 10
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------- the reports


def summary_page(summary) -> str:
    """A benchmark Summary as a page: its tables and notes, and the plots of the speedup
    distribution, the speedup of each problem, and its time and cost."""
    records = summary.records
    names = summary.source_names() or "results"
    out = [
        f"<h1>Benchmark summary: {esc(names)}</h1>",
        f'<p class="source">{esc(summary.source_line())}</p>',
    ]
    if summary.settings:
        out.append(f'<p class="source">Settings: {esc(summary.settings_text())}</p>')
    out += html_table(*summary.table(), "summary", last_is_total=True)
    if summary.overall.compile_n:
        out.append("<p>Against eager, torch.compile and the faster of the two:</p>")
        out += html_table(*summary.baseline_table(), "baselines")
    out.append('<ul class="notes">')
    out += [f"<li>{esc(note)}</li>" for note in summary.notes()]
    out.append("</ul>")
    out.append("<h2>Speedup</h2>")
    out.append(
        figure(
            speedup_histogram_svg(records),
            "Correct problems by speedup range (lo, hi], stacked by level; the first bar counts "
            "the problems without a correct kernel. Right of the dashed line: faster than "
            "PyTorch eager (the fast_1 problems).",
        )
    )
    out.append(
        figure(
            speedup_bars_svg(records),
            "Each problem's best correct kernel, ordered by level and id; bars above the dashed "
            "1x line are faster than PyTorch eager. Hover a bar for its name.",
        )
    )
    out.append("<h2>Time and cost</h2>")
    out.append(
        figure(
            per_problem_svg(records, "time-bars", "Wall time per problem", "seconds"),
            "Wall time of the agents' loop for each problem; paler bars: no correct kernel.",
        )
    )
    out.append(
        figure(
            per_problem_svg(records, "cost-bars", "API cost per problem", "cost_usd"),
            "API cost (USD) of each problem; paler bars: no correct kernel.",
        )
    )
    out.append("<h2>Problems</h2>")
    out += html_table(*summary.problem_table(), "problems")
    return document(f"cudaforge benchmark: {names}", out)


def optimize_html(result) -> str:
    """An OptimizeResult as a notebook cell's HTML: the end-to-end line, before/after bars, and
    one row per hot spot with its status, evidence and cost."""
    rows = []
    for h in result.hotspots:
        detail = h.detail.splitlines()[0][:200] if h.detail else ""
        rows.append(
            [
                Html(f"{esc(h.name)}<br><small>{esc(', '.join(h.sites))}</small>"),
                share_text(h),
                milliseconds(h.before_ms),
                milliseconds(h.after_ms),
                Html(f"<b>{times(h.speedup, 'n/a')}</b>"),
                Html(
                    esc(status_text(h.status))
                    + (f"<br><small>{esc(detail)}</small>" if detail else "")
                ),
                Html(f"<small>{esc(evidence(h))}</small>"),
                f"${h.cost_usd:.2f}",
            ]
        )
    match = (
        f"outputs match (max abs error {result.max_abs_err:.2g})"
        if result.outputs_match
        else f"<b>outputs differ</b> (max abs error {result.max_abs_err:.3g}); kernels taken out"
    )
    bars = [("end to end", result.before_ms, result.after_ms)]
    bars += [(h.name, h.before_ms, h.after_ms) for h in result.hotspots if h.before_ms]
    header = ["hot spot", "share", "before", "after", "speedup", "status", "evidence", "cost"]
    heading = (
        f"<h4>cudaforge.{result.mode}: {esc(result.model_name)} on {esc(result.device)} "
        f"[{esc(result.arch)}]{' &mdash; interrupted' if result.interrupted else ''}</h4>"
    )
    end_to_end = (
        f"<p>End to end on the example inputs: {milliseconds(result.before_ms)} &rarr; "
        f"{milliseconds(result.after_ms)} (<b>{times(result.speedup, 'n/a')}</b>); {match}. "
        f"Cost ${result.cost_usd:.2f}, {result.seconds:.1f} s.</p>"
    )
    if result.within_noise:
        end_to_end += f"<p><small>{esc(result.within_noise)}.</small></p>"
    if result.host_paced:
        end_to_end += f"<p><small>{esc(result.host_paced)}.</small></p>"
    if result.site_graphs:
        end_to_end += f"<p><small>{esc(result.site_graphs)}.</small></p>"
    return fragment([heading, end_to_end, before_after_svg(bars), *html_table(header, rows)])


__all__ = [
    "Html",
    "before_after_svg",
    "document",
    "esc",
    "fragment",
    "html_table",
    "optimize_html",
    "per_problem_svg",
    "speedup_bars_svg",
    "speedup_histogram_svg",
    "summary_page",
]
