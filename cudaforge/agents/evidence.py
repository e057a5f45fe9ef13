"""The evidence the Judge reads about a failed candidate (failure_text: the mismatch report, the
guards, the compile log verbatim), and the text helpers the loop shares. How a correct candidate
ran is cudaforge.profiling.measurements' measurements_text."""

from __future__ import annotations

import math

from ..harness.results import EvalResult

# Evidence longer than this (characters) is cut in the middle: the head has the first errors, the
# tail the summary; beyond it a prompt gets costly without helping.
MAX_EVIDENCE_CHARS = 30_000


def clip(text: str, limit: int = MAX_EVIDENCE_CHARS) -> str:
    """`text`, cut in the middle when longer than `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def number_text(value: float | None, unit: str = "", digits: int = 4) -> str:
    """`value` to `digits` significant digits with its unit; "n/a" for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}g}{unit}"


def failure_text(result: EvalResult) -> str:
    """What went wrong with a candidate, for the repair prompts: status, error, the mismatch
    report, the guards and the compile log (verbatim, cut only past MAX_EVIDENCE_CHARS)."""
    lines = [f"status: {result.status}"]
    if result.error:
        lines.append(f"error: {result.error}")
    failure = result.failure
    if failure is not None:
        lines.append(f"mismatch report (trial {failure.trial}, output {failure.output_index}):")
        lines.append(f"  {failure.message}")
        lines.append(
            f"  max abs error {number_text(failure.max_abs_err)}, max rel error "
            f"{number_text(failure.max_rel_err)}; {failure.mismatches} of {failure.total} elements "
            "outside tolerance"
        )
        if failure.worst_index:
            lines.append(
                f"  worst element at index {list(failure.worst_index)}: expected "
                f"{number_text(failure.expected, digits=6)}, "
                f"got {number_text(failure.actual, digits=6)}"
            )
    if result.tolerances:
        lines.append(
            "tolerances: " + ", ".join(f"{k}={v:g}" for k, v in sorted(result.tolerances.items()))
        )
    if result.guards:
        lines.append("refused by guards: " + ", ".join(result.guards))
    if result.compile_log:
        lines.append("compile log:")
        lines.append(clip(result.compile_log.rstrip()))
    return "\n".join(lines)


__all__ = ["MAX_EVIDENCE_CHARS", "clip", "failure_text", "number_text"]
