"""Which hardware metrics a profile reads, and what a chip makes of them.

`METRICS` is the CudaForge paper's list of 24 Nsight Compute metrics (its Judge's input);
`parse_metrics()` reads a list as `ncu --metrics` takes it; `check_metrics()` says offline (no GPU:
CUPTI's profiler host API and a chip name) which names the chip can collect, what stands in for
the two that GH100 lacks, and how many replay passes the list costs; `base_metrics()` lists the
chip's base metrics. The `launch__*` names are not counters: occupancy.py computes them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _core
from ..cuda import libs as _libs

# The paper's Judge metrics (its run_ncu.py), in its order.
METRICS: tuple[str, ...] = (
    "sm__cycles_active.avg",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__registers_per_thread",
    "sm__inst_executed.sum",
    "sm__inst_executed_pipe_fp32.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.sum.per_second",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__t_sector_hit_rate.pct",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "lts__t_sector_hit_rate.pct",
    "lts__throughput.avg.pct_of_peak_sustained_active",
    "smsp__warp_issue_stalled_memory_dependency_per_warp_active.pct",
    "smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct",
    "smsp__warp_issue_stalled_branch_resolving_per_warp_active.pct",
    "smsp__sass_average_branch_targets_threads_uniform.pct",
)

# Not counters: Nsight Compute derives them from the launch; so do we (occupancy.py).
LAUNCH_METRICS: tuple[str, ...] = (
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__registers_per_thread",
)

# Names a chip may lack, with what is collected in their place and why. Used only when the chip's
# host API rejects the original name (GH100 does).
SUBSTITUTES: dict[str, tuple[str, str]] = {
    "sm__inst_executed_pipe_fp32.avg.pct_of_peak_sustained_active": (
        "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
        (
            "no fp32 pipe counter on this chip: FP32 FFMA/FADD/FMUL issue on the FMA pipes "
            "(fmaheavy + fmalite), which also execute IMAD"
        ),
    ),
}

# Names with no equivalent on a chip: reported as unavailable, with the reason.
NO_EQUIVALENT: dict[str, str] = {
    "smsp__warp_issue_stalled_memory_dependency_per_warp_active.pct": (
        "no 'memory_dependency' stall reason since Volta (sm_70): waits on memory are split into "
        "long_scoreboard (global/local memory, in this list), short_scoreboard (shared memory, "
        "in this list), lg_throttle and mio_throttle"
    ),
}

# Collected beside the paper's list: the kernel's own duration under the profiler (free: it fits
# in the passes the list already needs on GH100).
EXTRA_METRICS: tuple[str, ...] = ("gpu__time_duration.sum",)

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def _expand_braces(text: str) -> list[str]:
    """'a_{x,y}_b' -> ['a_x_b', 'a_y_b'] (one level at a time, nested allowed)."""
    m = re.search(r"\{([^{}]*)\}", text)
    if m is None:
        return [text]
    out = []
    for option in m.group(1).split(","):
        out += _expand_braces(text[: m.start()] + option.strip() + text[m.end() :])
    return out


def parse_metrics(spec: str | Iterable[str]) -> list[str]:
    """Metric names from a list, or a string separated by commas/whitespace (as ncu --metrics
    takes them); `{a,b}` alternatives are expanded; repeats are dropped, order kept.

    Raises ValueError naming the first malformed entry."""
    if isinstance(spec, str):
        # split on commas and whitespace outside braces
        items, depth, current = [], 0, ""
        for ch in spec:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth < 0:
                raise ValueError(f"unbalanced '}}' in metric list: {spec!r}")
            if depth == 0 and (ch == "," or ch.isspace()):
                items.append(current)
                current = ""
            else:
                current += ch
        if depth != 0:
            raise ValueError(f"unbalanced '{{' in metric list: {spec!r}")
        items.append(current)
    else:
        items = list(spec)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"metric names must be str, got {item!r}")
        for name in _expand_braces(item.strip()):
            if not name:
                continue
            if not _NAME.match(name):
                raise ValueError(f"malformed metric name {name!r}")
            if name not in out:
                out.append(name)
    return out


@dataclass
class MetricPlan:
    """What a metric list becomes on a chip. `collect` goes to CUPTI; `launch` is computed from
    the launch; `substitutes` maps a requested name to the one collected for it; `unavailable`
    maps every requested name that will have no value to the reason."""

    chip: str
    requested: list[str]
    collect: list[str]
    launch: list[str]
    substitutes: dict[str, str] = field(default_factory=dict)
    substitute_reasons: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    passes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_plans: dict[tuple[str, tuple[str, ...]], MetricPlan] = {}
_lock = threading.Lock()


def check_metrics(metrics: str | Iterable[str] = METRICS, chip: str = "GH100") -> MetricPlan:
    """Offline (no GPU): which of `metrics` `chip` can collect, what replaces the ones it lacks,
    and the number of replay passes. Uses CUPTI's profiler host API (libnvperf_host)."""
    names = parse_metrics(metrics)
    key = (chip, tuple(names))
    with _lock:
        if key in _plans:
            return _plans[key]
    _libs.ensure("cupti")
    launch = [m for m in names if m.startswith("launch__")]
    hardware = [m for m in names if not m.startswith("launch__")]
    unknown_launch = [m for m in launch if m not in LAUNCH_METRICS]
    probe = _core.Profiler(hardware, chip=chip)
    rejected = probe.unsupported
    plan = MetricPlan(chip=chip, requested=names, collect=[], launch=[])
    for m in launch:
        if m in unknown_launch:
            plan.unavailable[m] = (
                f"'{m}' is not one of the launch metrics computed here: {', '.join(LAUNCH_METRICS)}"
            )
        else:
            plan.launch.append(m)
    wanted = []
    for m in hardware:
        if m not in rejected:
            wanted.append(m)
        elif m in SUBSTITUTES:
            stand_in, why = SUBSTITUTES[m]
            plan.substitutes[m] = stand_in
            plan.substitute_reasons[m] = why
            wanted.append(stand_in)
        elif m in NO_EQUIVALENT:
            plan.unavailable[m] = NO_EQUIVALENT[m]
        else:
            plan.unavailable[m] = rejected[m]
    final = _core.Profiler(wanted, chip=chip)
    for m, why in final.unsupported.items():  # a stand-in the chip lacks as well
        for original, stand_in in list(plan.substitutes.items()):
            if stand_in == m:
                del plan.substitutes[original]
                plan.unavailable[original] = f"{plan.substitute_reasons.pop(original)}; and {why}"
    plan.collect = list(final.metrics)
    plan.passes = final.passes
    with _lock:
        _plans[key] = plan
    return plan


def base_metrics(chip: str = "GH100") -> dict[str, list[str]]:
    """The chip's base metric names by type ('counter', 'ratio', 'throughput'), offline."""
    _libs.ensure("cupti")
    return _core.Profiler([], chip=chip).base_metrics()


__all__ = [
    "EXTRA_METRICS",
    "LAUNCH_METRICS",
    "METRICS",
    "NO_EQUIVALENT",
    "SUBSTITUTES",
    "MetricPlan",
    "base_metrics",
    "check_metrics",
    "parse_metrics",
]
