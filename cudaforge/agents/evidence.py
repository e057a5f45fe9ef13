"""The evidence the Judge reads about a candidate: what went wrong with it (failure_text: the
mismatch report, the guards, the compile log verbatim) or how it ran (metrics_text: timing, the
kernels by GPU time, the hardware metrics)."""

from __future__ import annotations

import math
from typing import Any

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


def _profile_lines(profile: Any, indent: str = "  ") -> list[str]:
    if isinstance(profile, dict):
        out = []
        for key, value in profile.items():
            if isinstance(value, (dict, list)):
                out.append(f"{indent}{key}:")
                out += _profile_lines(value, indent + "  ")
            else:
                out.append(f"{indent}{key}: {value}")
        return out
    if isinstance(profile, list):
        return [line for item in profile for line in _profile_lines(item, indent)]
    return [f"{indent}{profile}"]


def metrics_text(result: EvalResult, max_kernels: int = 12) -> str:
    """The default measurements text for the Judge: timing, the kernels that ran (by GPU time),
    the guards, and the hardware metrics when the result has a profile."""
    lines = [
        f"candidate: {number_text(result.candidate_ms, ' ms')} per forward"
        + (f" (spread {result.candidate_spread:.1%})" if result.candidate_spread else ""),
        f"reference (PyTorch): {number_text(result.reference_ms, ' ms')}",
        f"speedup over the reference: {number_text(result.speedup, 'x', 3)}",
    ]
    if result.compiled_reference_ms is not None:
        lines.append(
            f"torch.compile of the reference: {number_text(result.compiled_reference_ms, ' ms')}"
            f" (speedup over it {number_text(result.speedup_vs_compile, 'x', 3)})"
        )
    if result.own_kernel_share is not None:
        lines.append(
            f"share of GPU time in the candidate's own kernels: {result.own_kernel_share:.0%}"
        )
    if result.kernels:
        lines.append("kernels (GPU time during the timed forwards):")
        ranked = sorted(result.kernels, key=lambda k: k.total_us, reverse=True)
        for k in ranked[:max_kernels]:
            who = "own" if k.own else "library"
            lines.append(
                f"  {k.name} [{who}]: {k.calls} launch{'es' if k.calls != 1 else ''}, "
                f"{k.mean_us:.4g} us each, {k.total_us:.4g} us total"
            )
        if len(ranked) > max_kernels:
            lines.append(f"  ... {len(ranked) - max_kernels} more")
    if result.guards:
        lines.append("guards that fired: " + ", ".join(result.guards))
    if result.profile:
        lines.append("hardware metrics:")
        lines += _profile_lines(result.profile)
    else:
        lines.append("hardware metrics: none (not profiled)")
    return "\n".join(lines)


__all__ = ["MAX_EVIDENCE_CHARS", "clip", "failure_text", "metrics_text", "number_text"]
