"""Which of two evaluated candidates is faster, by the tie rule of stopping.py: a candidate whose
median's interval overlaps the other's is a tie, not faster. The two are compared on times of the
same kind: the graph replays' when both results have them, else the eager runs', else each
result's own candidate_ms and interval; results recorded before intervals existed are compared
by their medians."""

from __future__ import annotations

from typing import Any

from .stopping import compare_times

BASES = ("graph", "eager", "recorded")


def candidate_time(result: Any, basis: str) -> tuple[float, tuple[Any, Any] | None] | None:
    """(median ms, (low, high) or None) of the candidate's times of `basis` in `result` (an
    EvalResult or anything with its attributes), or None when it has none of that kind."""
    if basis not in BASES:
        raise ValueError(f"basis {basis!r} is not one of {', '.join(BASES)}")
    if basis == "recorded":
        ms = getattr(result, "candidate_ms", None)
        if ms is None:
            return None
        low = getattr(result, "candidate_low_ms", None)
        high = getattr(result, "candidate_high_ms", None)
        return ms, (low, high) if low is not None and high is not None else None
    timing = getattr(result, "timing", None) or {}
    side = timing.get(f"candidate_{basis}") if isinstance(timing, dict) else None
    if not isinstance(side, dict) or not isinstance(side.get("median_ms"), (int, float)):
        return None
    low, high = side.get("low_ms"), side.get("high_ms")
    return side["median_ms"], (low, high) if low is not None and high is not None else None


def compare_results(a: Any, b: Any) -> tuple[str, str]:
    """(verdict, basis): whether candidate `a` is "faster", "slower" or a "tie" with `b`, and on
    which times ("graph", "eager" or "recorded"). A result without any time is slower than one
    with a time; two without are a tie."""
    for basis in BASES:
        ta, tb = candidate_time(a, basis), candidate_time(b, basis)
        if ta is not None and tb is not None:
            return compare_times(ta[0], ta[1], tb[0], tb[1]), basis
    has_a = candidate_time(a, "recorded") is not None
    has_b = candidate_time(b, "recorded") is not None
    if has_a != has_b:
        return ("faster" if has_a else "slower"), "recorded"
    return "tie", "recorded"


__all__ = ["BASES", "candidate_time", "compare_results"]
