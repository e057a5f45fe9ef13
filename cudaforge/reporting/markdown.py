"""The reports as text: a benchmark summary as markdown (its table, notes and one row per
problem), and an optimize run as the aligned table that `OptimizeResult.report()` prints."""

from __future__ import annotations

from .formatting import evidence, milliseconds, numeric_column, share_text, status_text, times


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: list[list[str]], bold_last: bool = False) -> list[str]:
    """A markdown table's lines; numeric columns right-aligned; bold_last: the first cell of the
    last row (a total) in bold."""
    aligns = ["---"] + ["---:" if numeric_column(rows, i) else "---" for i in range(1, len(header))]
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    lines.append("| " + " | ".join(aligns) + " |")
    for i, row in enumerate(rows):
        cells = [_cell(c) for c in row]
        if bold_last and i == len(rows) - 1:
            cells[0] = f"**{cells[0]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_markdown(summary, problems: bool = True) -> str:
    """A benchmark Summary as markdown: the summary table, what its numbers mean, and
    (problems=True) one row per problem."""
    lines = [f"# Benchmark summary: {summary.source_names()}", "", summary.source_line(), ""]
    if summary.settings:
        lines += [f"Settings: {summary.settings_text()}", ""]
    header, rows = summary.table()
    lines += markdown_table(header, rows, bold_last=True)
    if summary.overall.compile_n:
        lines += ["", "Against eager, torch.compile and the faster of the two:", ""]
        lines += markdown_table(*summary.baseline_table())
    lines += [""] + [f"- {note}" for note in summary.notes()]
    if problems:
        lines += ["", "## Problems", ""]
        lines += markdown_table(*summary.problem_table())
    return "\n".join(lines) + "\n"


def optimize_text(result) -> str:
    """An OptimizeResult as text: end-to-end speedup, then per hot spot before/after, speedup,
    status, evidence and cost."""
    lines = [
        f"cudaforge.{result.mode}: {result.model_name} on {result.device or 'n/a'}"
        f" [{result.arch}]{' (training)' if result.training else ''}"
        + (" -- INTERRUPTED, verified kernels kept" if result.interrupted else "")
    ]
    match = (
        f"outputs match (max abs error {result.max_abs_err:.2g})"
        if result.outputs_match
        else f"OUTPUTS DIFFER (max abs error {result.max_abs_err:.3g}); kernels taken out"
    )
    lines.append(
        "end-to-end on the example inputs: "
        f"{milliseconds(result.before_ms)} -> {milliseconds(result.after_ms)}"
        f" ({times(result.speedup, 'n/a')}); {match}"
    )
    if result.within_noise:
        lines.append(result.within_noise)
    if result.host_paced:
        lines.append(result.host_paced)
    if result.site_graphs:
        lines.append(result.site_graphs)
    lines.append("")
    header = f"{'hot spot':<44} {'share':>6} {'before':>10} {'after':>10} {'speedup':>8}  status"
    lines.append(header)
    lines.append("-" * len(header))
    for h in result.hotspots:
        name = h.name if len(h.name) <= 44 else h.name[:41] + "..."
        lines.append(
            f"{name:<44} {share_text(h):>6} {milliseconds(h.before_ms):>10} "
            f"{milliseconds(h.after_ms):>10} {times(h.speedup, 'n/a'):>8}  {status_text(h.status)}"
        )
        details = []
        if len(h.sites) > 1:
            details.append(f"{len(h.sites)} sites: {', '.join(h.sites)}")
        shown = evidence(h)
        if shown:
            details.append(f"evidence: {shown}")
        origin = {"agents": "written by the agents", "store": "from the store"}.get(h.origin, "")
        cost = f"${h.cost_usd:.2f}, {h.llm_calls} LLM calls" if h.llm_calls else ""
        tail = ", ".join(x for x in (origin, cost, f"{h.candidates} candidate(s) evaluated") if x)
        details.append(tail)
        if h.detail:
            details.append(h.detail.splitlines()[0][:200])
        lines += [f"    {d}" for d in details if d]
    lines.append("")
    lines.append(
        f"cost: ${result.cost_usd:.2f} over {sum(h.llm_calls for h in result.hotspots)} LLM "
        f"calls; {result.seconds:.1f} s"
        + (" (" + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s"
                            for k, v in result.phase_seconds.items()) + ")"
           if result.phase_seconds else "")
        + (f"; kernels stored in {result.store}" if result.store else "")
    )  # fmt: skip
    if result.waiting_for:
        lines.append(
            f"waiting for {len(result.waiting_for)} reply file(s) (file: provider, wait=0); "
            "run again with the same transcripts= folder once they are written"
        )
    if result.skipped:
        lines.append(f"not candidates ({len(result.skipped)}): " + "; ".join(result.skipped[:5]))
    if result.profile:
        lines += ["", "profile before (torch.profiler):", result.profile]
    return "\n".join(lines)


__all__ = ["markdown_table", "optimize_text", "summary_markdown"]
