"""The measurements the Judge reads about a correct candidate: one compact block within a budget.

`measurements_text(result, budget=3000)` gives, in this order: the time per forward and the
speedups over eager PyTorch and over `torch.compile` (when measured); the roofline line (what
bounds the slowest kernel and at what share of the peak, and the floor time for the bytes the
forward must move); then the kernels by time with the metrics that explain them, as
`feedback.format_profile` writes them. The profiler's bookkeeping (the requested-metric list,
replay passes and phases, how the ceilings were measured, its notes, the metrics collected in
place of others) is left out: it explains the profiler, not the kernel.

The time line gives each median's 95% interval and run count where the result has them, says
when the times are CUDA-graph replays (short forwards; the eager figures follow), and calls a
speedup whose candidate and reference intervals overlap "a tie within noise". The line after it
gives the host's time to issue one forward, beside PyTorch's, and says so when it exceeds the
GPU's: in a model paced by its host (ResNet-50 at batch 64 on the H200), that is the time the
forward takes.

`result` is an EvalResult or anything with its attributes; this module does not import the
harness (profiling does not depend on it). Pure Python: it runs on recorded results.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .feedback import format_profile, format_value, hints
from .profiler import ForwardProfile

DEFAULT_BUDGET = 3000  # characters
MIN_PROFILE_BUDGET = 120  # below this, the kernel table is left out rather than cut to nothing


def measurements_text(result: Any, budget: int = DEFAULT_BUDGET) -> str:
    """The Judge's measurements of `result` in at most `budget` characters (module docstring).
    Times in the text are per forward, in ms or us."""
    lines = _timing_lines(result)
    profile = _forward_profile(getattr(result, "profile", None))
    if profile is None:
        lines.append("hardware metrics: " + _not_profiled_reason(result))
        lines += _share_lines(result) + _kernel_lines(result)
        return _fit(lines, budget)
    lines += [_roofline_line(profile), *_share_lines(result)]
    head = _fit(lines, budget)
    room = budget - len(head) - 1
    if room < MIN_PROFILE_BUDGET:
        return head
    clean = _without_bookkeeping(profile)
    table = format_profile(clean, budget=room)
    if "\n[1] " in table or not clean.kernels:
        return head + "\n" + table
    # too little room for format_profile's table and details: one line per kernel instead
    return head + "\n" + _fit(_kernel_hint_lines(clean), room)


# ---------------------------------------------------------------- timing


def _time(ms: float | None) -> str:
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "n/a"
    return f"{ms:.4g} ms" if ms >= 0.1 else f"{ms * 1e3:.3g} us"


def _speedup(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}x"


def _timing_lines(result: Any) -> list[str]:
    timing = getattr(result, "timing", None)
    timing = timing if isinstance(timing, dict) else {}
    graph = timing.get("speedup_basis") == "graph"
    spread = getattr(result, "candidate_spread", None)
    line = f"time per forward: {_time(getattr(result, 'candidate_ms', None))}"
    said = [_interval(result, "candidate", timing.get("candidate_graph" if graph else
                                                      "candidate_eager"))]  # fmt: skip
    if spread:
        said.append(f"spread {spread:.1%}")
    said = [x for x in said if x]
    if said:
        line += f" ({'; '.join(said)})"
    if graph:
        line += " as CUDA-graph replays"
    reference_ms = getattr(result, "reference_ms", None)
    if reference_ms is not None:
        interval = _interval(result, "reference", None, runs=False)
        line += (
            f"; {'PyTorch' if graph else 'eager PyTorch'} {_time(reference_ms)}"
            f"{f' ({interval})' if interval else ''}, speedup "
            f"{_speedup(getattr(result, 'speedup', None))}"
        )
        if _within_noise(result):
            line += " (a tie within noise: the intervals overlap)"
        if timing.get("settled") is False:
            line += " (uncertain: the timing did not settle in two attempts, something else ran)"
    if graph:
        line += _eager_figures(timing)
    compiled_ms = getattr(result, "compiled_reference_ms", None)
    if compiled_ms is not None:
        line += (
            f"; torch.compile {_time(compiled_ms)}, speedup "
            f"{_speedup(getattr(result, 'speedup_vs_compile', None))}"
        )
    return [line, *_host_lines(result, timing), *_layout_lines(result)]


# in the harness's note of an output copied into the caller's layout (harness.layouts)
LAYOUT_COPY_MARK = "the caller keeps it with strides"


def _layout_lines(result: Any) -> list[str]:
    """The harness's notes of outputs copied into the caller's layout."""
    return [str(n) for n in getattr(result, "notes", None) or [] if LAYOUT_COPY_MARK in str(n)]


def _host_lines(result: Any, timing: dict) -> list[str]:
    """The host's time to issue one forward (timing["candidate_host_ms"]: its Python and its
    launches), beside PyTorch's; when it exceeds the forward's GPU time, what that means inside
    a model. Nothing when not measured."""
    host = timing.get("candidate_host_ms")
    if not isinstance(host, (int, float)) or host <= 0:
        return []
    line = f"host time to issue one forward (its Python and launches): {_time(host)}"
    reference = timing.get("reference_host_ms")
    if isinstance(reference, (int, float)) and reference > 0:
        line += f"; PyTorch's {_time(reference)}"
    gpu = getattr(result, "candidate_ms", None)
    if isinstance(gpu, (int, float)) and 0 < gpu < host:
        line += (
            f". That is {host / gpu:.2g}x its GPU time: in a model whose GPU waits for the host "
            "(small batches, many short ops), this forward takes its host time, so each torch "
            "call or launch issued from Python per forward counts there"
        )
    return [line]


def _within_noise(result: Any) -> bool:
    """Whether the candidate's and the reference's intervals overlap: the harness's tie rule
    (harness/stopping.py compare_times), said here without importing it."""
    bounds = [getattr(result, f"{who}_{end}_ms", None)
              for who in ("candidate", "reference") for end in ("low", "high")]  # fmt: skip
    if None in bounds:
        return False
    c_low, c_high, r_low, r_high = bounds
    return c_low <= r_high and r_low <= c_high


def _interval(result: Any, who: str, side: Any, runs: bool = True) -> str:
    """'95% interval 0.5461 ms to 0.5502 ms, 40 runs' from the result's bounds, or ''."""
    low, high = getattr(result, f"{who}_low_ms", None), getattr(result, f"{who}_high_ms", None)
    if low is None or high is None:
        return ""
    text = f"{_time(low)} to {_time(high)}"
    if not runs:
        return text
    count = side.get("runs") if isinstance(side, dict) else None
    return f"95% interval {text}" + (f", {count} runs" if count else "")


def _eager_figures(timing: dict) -> str:
    """'; eager: candidate X, PyTorch Y (speedup Z)' when the times above are graph replays."""
    cand, ref = timing.get("candidate_eager"), timing.get("reference_eager")
    if not (isinstance(cand, dict) and isinstance(ref, dict)):
        return ""
    c, r = cand.get("median_ms"), ref.get("median_ms")
    if not (isinstance(c, (int, float)) and isinstance(r, (int, float)) and c > 0):
        return ""
    return f"; eagerly (launched from Python): {_time(c)} vs PyTorch {_time(r)}, {r / c:.3g}x"


def _share_lines(result: Any) -> list[str]:
    """The share of GPU time in the candidate's own kernels, and the guards that fired."""
    share = getattr(result, "own_kernel_share", None)
    guards = list(getattr(result, "guards", None) or [])
    said = []
    if share is not None:
        said.append(f"the candidate's own kernels take {share:.0%} of the GPU time")
    if guards:
        said.append("guards that fired: " + ", ".join(guards))
    return ["; ".join(said)] if said else []


# ---------------------------------------------------------------- the roofline line


def _roofline_line(profile: ForwardProfile) -> str:
    """What bounds the slowest kernel with a roofline, and the floor for the forward's bytes."""
    parts = []
    kernel = next((k for k in profile.kernels if k.roofline is not None), None)
    if kernel is not None:
        r = kernel.roofline
        who = f"{_kernel_name(kernel.name)} ({kernel.share:.0%} of GPU time)"
        if r.bound == "compute" and r.flop_pct is not None:
            parts.append(f"compute-bound: {who} at {r.flop_pct:.0f}% of the {r.flop_ceiling} peak")
        elif r.bound == "memory" and r.bandwidth_pct is not None:
            parts.append(f"memory-bound: {who} at {r.bandwidth_pct:.0f}% of the DRAM bandwidth")
        elif r.bandwidth_pct is not None:
            parts.append(f"{who}: DRAM at {r.bandwidth_pct:.0f}% of its bandwidth, no FLOP count")
    if profile.min_bytes is not None:
        floor = f"the forward must move {format_value('dram__bytes.sum', profile.min_bytes)}"
        floor += " (inputs + outputs)"
        if profile.min_time_ms is not None:
            floor += f": at least {_time(profile.min_time_ms)} at the measured DRAM bandwidth"
            if profile.kernel_ms:
                ratio = profile.kernel_ms / profile.min_time_ms if profile.min_time_ms else 0
                floor += f"; its kernels take {_time(profile.kernel_ms)}, {ratio:.3g}x that floor"
        parts.append(floor)
    if not parts:
        why = profile.reason or "the GPU's peak bandwidth and FLOP rate were not measured"
        return f"roofline: not available ({why})"
    return "roofline: " + "; ".join(parts)


def _kernel_name(name: str) -> str:
    return name if len(name) <= 40 else name[:37] + "..."


# ---------------------------------------------------------------- the profile


def _forward_profile(profile: Any) -> ForwardProfile | None:
    """The profile as a ForwardProfile, or None when there is none of that shape."""
    if isinstance(profile, ForwardProfile):
        return profile
    if not isinstance(profile, dict) or not profile:
        return None
    try:
        return ForwardProfile.from_dict(profile)
    except (TypeError, KeyError, ValueError):
        return None


def _without_bookkeeping(profile: ForwardProfile) -> ForwardProfile:
    """The profile without what explains the profiler rather than the kernels; the floor of
    the bytes moved is left out too, since the roofline line already gives it."""
    kernels = [dataclasses.replace(k, unavailable={}, substitutes={}) for k in profile.kernels]
    return dataclasses.replace(
        profile,
        kernels=kernels,
        metrics_requested=[],
        passes=0,
        profile_s=0.0,
        profile_phases={},
        ceilings=None,
        notes=[],
        min_bytes=None,
        min_time_ms=None,
    )


def _kernel_hint_lines(profile: ForwardProfile) -> list[str]:
    """The kernels by time, each with its first bottleneck hint: for small budgets."""
    lines = ["kernels by GPU time per forward:"]
    for k in sorted(profile.kernels, key=lambda k: -k.total_ms):
        found = hints(k, profile)
        who = "own" if k.own else "library"
        line = f"  {_kernel_name(k.name)} ({who}): {_time(k.total_ms)}, {k.share:.0%}"
        lines.append(line + (f"; {found[0]}" if found else ""))
    return lines


def _not_profiled_reason(result: Any) -> str:
    raw = getattr(result, "profile", None)
    if raw:
        return "not available (the profile is not in cudaforge's format)"
    said = [n for n in getattr(result, "notes", None) or [] if str(n).startswith("profile")]
    if said:
        return f"not profiled ({said[0]})"
    return "not profiled (hardware metrics were not asked for in this run)"


def _field(item: Any, name: str, default: Any = None) -> Any:
    if isinstance(item, dict):
        return item.get(name, default)
    return getattr(item, name, default)


def _kernel_lines(result: Any, top: int = 8) -> list[str]:
    """The kernels that ran, by GPU time per forward (CUPTI), when there is no profile."""
    kernels = sorted(
        getattr(result, "kernels", None) or [], key=lambda k: -(_field(k, "total_us") or 0.0)
    )
    if not kernels:
        return ["kernels: none recorded (no CUPTI trace)"]
    total = sum(_field(k, "total_us") or 0.0 for k in kernels)
    lines = ["kernels by GPU time per forward:"]
    for k in kernels[:top]:
        total_us = _field(k, "total_us") or 0.0
        calls = _field(k, "calls", 1)
        share = f", {total_us / total:.0%}" if total else ""
        lines.append(
            f"  {_kernel_name(_field(k, 'name', '?'))} ({'own' if _field(k, 'own') else 'library'})"
            f": {_time(total_us / 1e3)}{share}, {calls} launch{'es' if calls != 1 else ''} of "
            f"{_time((_field(k, 'mean_us') or 0.0) / 1e3)}"
        )
    if len(kernels) > top:
        lines.append(f"  ... {len(kernels) - top} more")
    return lines


def _fit(lines: list[str], budget: int) -> str:
    """`lines` joined, cut to `budget` characters: whole lines while they fit, then the line
    that does not fit shortened with '...'; lines after it are dropped."""
    text = ""
    for line in lines:
        joined = f"{text}\n{line}" if text else line
        if len(joined) <= budget:
            text = joined
            continue
        room = budget - len(text) - (1 if text else 0)
        if room > 3:
            text = (f"{text}\n" if text else "") + line[: room - 3] + "..."
        break
    return text


__all__ = ["DEFAULT_BUDGET", "measurements_text"]
