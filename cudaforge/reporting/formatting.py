"""What the text and the HTML renderings of a report write alike: numbers (a speedup, a share, USD,
a duration, milliseconds), an optimize outcome's status and evidence, and which table columns
hold numbers (those are right-aligned)."""

from __future__ import annotations

import math
from typing import Any


def usable_speedup(value: Any) -> float | None:
    """A recorded speedup that can be counted: a positive finite number, else None."""
    usable = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if usable and math.isfinite(value) and value > 0 else None


def times(value: float | None, missing: str = "-") -> str:
    """A speedup: '1.43x' ('0.012x' below 0.1); `missing` when there is none."""
    if not value:
        return missing
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def share_text(hotspot) -> str:
    """A hot spot's share of the forward, or 'bwd' for a backward one (it runs in the backward
    pass, outside the forward the shares divide)."""
    return "bwd" if hotspot.kind == "backward" else f"{hotspot.share:.1%}"


def percent(share: float) -> str:
    """A share (0..1) as '66.7%'."""
    return f"{100 * share:.1f}%"


def usd(value: float | None) -> str:
    """'$1.20', '$0.300' (three places below a dollar), '-' when unknown."""
    if value is None:
        return "-"
    return f"${value:.2f}" if value >= 0.995 or value == 0 else f"${value:.3f}"


def duration(seconds: float | None) -> str:
    """Seconds as '42.0 s', '3.5 min' or '1.25 h'; '-' when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def milliseconds(value: float | None) -> str:
    """A time in ms as '0.25 ms', or '42.0 us' below 0.1 ms; 'n/a' when unknown."""
    if value is None:
        return "n/a"
    return f"{value * 1000:.1f} us" if value < 0.1 else f"{value:.3g} ms"


def numeric_column(rows: list[list[str]], index: int) -> bool:
    """True when every filled cell of the column is a number as written above."""
    values = [row[index] for row in rows if row[index] not in ("-", "")]
    return bool(values) and all(v.lstrip("$")[:1].isdigit() for v in values)


# ---------------------------------------------------------------- an optimize run's hot spots

STATUS_TEXT = {
    "swapped": "swapped",
    "no_kernel": "kept original: no faster correct kernel",
    "slower_here": "kept original: slower in this process",
    "refused": "kept original: failed the checks here",
    "interrupted": "kept original: interrupted",
    "error": "kept original: error",
}


def status_text(status: str) -> str:
    """What a hot spot's status means for the model, in words."""
    return STATUS_TEXT.get(status, status)


def evidence(outcome) -> str:
    """Why a hot spot's kernel is trusted, in one line: the worker's trials and tolerances, the
    in-process checks and the gradient check. `outcome`: a HotspotOutcome."""
    parts = []
    worker = outcome.worker_result or {}
    if worker:
        tol = {k.rpartition(".")[2]: v for k, v in (worker.get("tolerances") or {}).items()}
        tolerance = ", ".join(f"{k} {v:g}" for k, v in sorted(tol.items()))
        parts.append(
            f"{worker.get('trials', 0)} worker trials passed"
            + (f" ({tolerance})" if tolerance else "")
            + (f" on {worker['device']}" if worker.get("device") else "")
            + (
                f", {milliseconds(worker.get('reference_ms'))} -> "
                f"{milliseconds(worker.get('candidate_ms'))} "
                f"({times(worker.get('speedup'), 'n/a')}) there"
                if worker.get("speedup")
                else ""
            )
        )
    if outcome.checks:
        trials = sum(c["trials"] for c in outcome.checks)
        worst = max(c["max_abs_err"] for c in outcome.checks)
        parts.append(
            f"{trials} in-process trials over {len(outcome.checks)} site(s), max abs error "
            f"{worst:.2g}"
        )
        if all(c["gradient_checked"] for c in outcome.checks):
            backward = any(c["backward_kernel"] for c in outcome.checks)
            parts.append(f"gradients checked ({'backward kernel' if backward else 'recompute'})")
    return "; ".join(parts)


__all__ = [
    "STATUS_TEXT",
    "duration",
    "evidence",
    "milliseconds",
    "numeric_column",
    "percent",
    "status_text",
    "times",
    "usable_speedup",
    "usd",
]
