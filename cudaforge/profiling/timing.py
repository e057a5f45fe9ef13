"""GPU time of a forward: CUDA events around each call, and CUPTI activity records of every
kernel it launches (`time_forward` -> `ForwardTiming`, with per-kernel `KernelTime`s). Without
CUPTI tracing the event times are still measured and `reason` says why the kernels are missing.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import _core
from ..cuda import libs as _libs
from ..errors import LibraryNotFound, ProfilerError
from ..harness.results import KernelTime
from . import gpu


@dataclass
class ForwardTiming:
    """GPU time of a forward: CUDA events around each call (`forward_ms`, median) and CUPTI
    activity records of every kernel (`kernels`, per forward; `kernel_ms`, their sum)."""

    forward_ms: float
    forward_ms_all: list[float]
    kernel_ms: float
    kernels: list[KernelTime]
    iterations: int
    records: list[dict] = field(default_factory=list, repr=False)  # all, in launch order
    launches_per_forward: int | None = None  # None when the forwards differ in launches
    dropped: int = 0
    notes: list[str] = field(default_factory=list)
    reason: str | None = None  # why there are no per-kernel times, if so


def time_forward(
    fn: Callable[[], Any],
    *,
    iterations: int = 20,
    warmup: int = 3,
    device: int | None = None,
    own: Iterable[str] = (),
) -> ForwardTiming:
    """Run `fn()` `warmup` + `iterations` times on the current stream; time each call with CUDA
    events and every kernel with CUPTI. `own` names the candidate's kernels (KernelTime.own).

    When CUPTI tracing is unavailable (another CUPTI client), per-kernel times are empty and
    `reason` says why; the event times are still measured."""
    torch = gpu.require_torch()
    device = gpu.device_index(device)
    with torch.cuda.device(device):
        return _time_forward(torch, fn, iterations, warmup, device, set(own))


def _time_forward(torch, fn, iterations, warmup, device, own) -> ForwardTiming:
    gpu.prepare(device)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    stream = torch.cuda.current_stream(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iterations)]  # fmt: skip
    reason, records, dropped = None, [], 0
    try:
        _libs.ensure("cupti")
        _core.timing_start()
        tracing = True
    except ProfilerError as exc:
        reason, tracing = f"{getattr(exc, 'reason', 'cupti_error')}: {exc}", False
    except LibraryNotFound as exc:
        reason, tracing = f"no_cupti: {exc}", False
    try:
        for start, end in events:
            start.record(stream)
            fn()
            end.record(stream)
    finally:
        if tracing:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                records = _core.timing_stop()
            dropped = _core.timing_stats()["dropped"]
            notes = [str(w.message) for w in caught]
        else:
            torch.cuda.synchronize(device)
            notes = []
    times = [s.elapsed_time(e) for s, e in events]
    forward_ms = statistics.median(times)
    kernels = KernelTime.from_records(records, iterations, own)
    kernel_ms = sum(k.total_us for k in kernels) / 1e3
    if records and kernel_ms > 1.10 * forward_ms + 0.005:
        notes.append(
            f"CUPTI kernel time ({kernel_ms:.4f} ms per forward) exceeds the CUDA-event time "
            f"({forward_ms:.4f} ms): kernels overlap on several streams, or the CUPTI clock is off"
        )
    per_forward = None
    if records and iterations and len(records) % iterations == 0:
        per_forward = len(records) // iterations
    return ForwardTiming(
        forward_ms=forward_ms,
        forward_ms_all=times,
        kernel_ms=kernel_ms,
        kernels=kernels,
        iterations=iterations,
        records=records,
        launches_per_forward=per_forward,
        dropped=dropped,
        notes=notes,
        reason=reason,
    )


__all__ = [
    "ForwardTiming",
    "time_forward",
]
