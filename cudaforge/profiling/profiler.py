"""The profile of a forward: per kernel, as data the Judge can read.

`profile_forward(fn)` / `profile(problem, candidate)` give a `ForwardProfile` with a
`KernelProfile` per kernel: its time (timing.py), hardware metrics (CUPTI Range Profiler, the
L2 flushed before each pass: l2_flush.py; the list and its stand-ins: metrics.py), static facts
(registers, shared and local memory, spills, launch configuration, theoretical occupancy and what
limits it: occupancy.py) and a roofline line against this GPU's measured ceilings (roofline.py).
Without counter access the profile keeps timing and static facts and says why the metrics are
missing (`ForwardProfile.reason`).

Units: times in ms (`*_ms`) or s (`*_s`), sizes in bytes, rates per second.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _core
from ..errors import LibraryNotFound, ProfilerError
from . import gpu
from .l2_flush import l2_flush
from .metrics import EXTRA_METRICS, METRICS, MetricPlan, check_metrics, parse_metrics
from .occupancy import Occupancy, launch_metrics, occupancy
from .roofline import Roofline, measure_ceilings, roofline
from .timing import ForwardTiming, time_forward


@dataclass
class KernelProfile:
    """One kernel of a forward (all its launches in one forward taken together).

    `time_ms` is the mean GPU time of one launch (CUPTI activity), `total_ms` the time per
    forward; `metrics` hold the mean over its launches of each collected metric, under the name
    requested (a substitute's value appears under the requested name, see `substitutes`);
    `unavailable` gives every requested metric without a value, with the reason."""

    name: str
    launches: int
    time_ms: float
    total_ms: float
    share: float  # of the forward's kernel time
    metrics: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    substitutes: dict[str, str] = field(default_factory=dict)
    registers_per_thread: int = 0  # the compiler's count (function attribute) when known
    registers_allocated: int = 0  # per thread at launch (CUPTI, ncu): rounded to the unit
    static_shared_bytes: int = 0
    dynamic_shared_bytes: int = 0
    local_bytes_per_thread: int = 0
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    occupancy: Occupancy | None = None
    roofline: Roofline | None = None
    own: bool = False


@dataclass
class ForwardProfile:
    """Everything measured about one forward, kernels sorted by time per forward (largest
    first). `reason` is set when hardware metrics are missing, saying why."""

    device: str
    chip: str | None
    kernels: list[KernelProfile]
    forward_ms: float | None = None
    kernel_ms: float | None = None
    reason: str | None = None
    metrics_requested: list[str] = field(default_factory=list)
    passes: int = 0
    profile_s: float = 0.0  # wall time of the metric collection
    profile_phases: dict[str, float] = field(default_factory=dict)  # setup/passes/decode/evaluate s
    min_bytes: int | None = None
    min_time_ms: float | None = None  # min_bytes at the measured bandwidth
    ceilings: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    synthetic: bool = False  # True for made-up fixtures, never for a measurement
    l2_flushed: bool = False  # the L2 was flushed before each profiler pass

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ForwardProfile:
        data = dict(data)
        kernels = []
        for k in data.pop("kernels", []):
            k = dict(k)
            if k.get("occupancy") is not None:
                k["occupancy"] = Occupancy(**k["occupancy"])
            if k.get("roofline") is not None:
                k["roofline"] = Roofline(**k["roofline"])
            for dim in ("grid", "block"):
                if dim in k:
                    k[dim] = tuple(k[dim])
            kernels.append(KernelProfile(**k))
        known = {f for f in cls.__dataclass_fields__}
        extra = {k: v for k, v in data.items() if k not in known}
        out = cls(kernels=kernels, **{k: v for k, v in data.items() if k in known})
        if extra:
            out.notes.append(f"ignored fields: {', '.join(sorted(extra))}")
        return out

    @classmethod
    def from_json(cls, text: str) -> ForwardProfile:
        return cls.from_dict(json.loads(text))


_profilers: dict[tuple[int, tuple[str, ...]], Any] = {}
_lock = threading.Lock()


def _profiler(device: int, collect: list[str]):
    """A warm _core.Profiler per (device, metric list): its host object and config image are
    built once per worker process."""
    key = (device, tuple(collect))
    with _lock:
        found = _profilers.get(key)
    if found is None:
        found = _core.Profiler(collect, device=device)
        with _lock:
            _profilers[key] = found
    return found


def _chip_of(device: int) -> str:
    # The device's chip: from a Profiler with no metrics (no counters read, no privileges needed).
    return _profiler(device, []).chip


def _ptxas_for(resources: dict[str, dict[str, int]] | None, name: str) -> dict[str, int]:
    if not resources:
        return {}
    if name in resources:
        return resources[name]
    return next((v for k, v in resources.items() if name.startswith(k) or k in name), {})


# Whether profile_forward leaves the Range Profiler enabled between calls by default: the worker
# processes (cudaforge.harness.pool) turn it on; they profile many candidates and nothing else. While
# it is enabled the GPU's counters are taken: ncu or nsys on the same GPU are refused ("a driver
# resource was unavailable") until the worker ends or calls _core.profiler_release().
# CUDAFORGE_PROFILER_KEEP=0 turns it off in workers too.
KEEP_ENABLED = False


def profile_forward(
    fn: Callable[[], Any],
    *,
    metrics: str | Iterable[str] = METRICS,
    extra_metrics: Iterable[str] = EXTRA_METRICS,
    device: int | None = None,
    min_bytes: int | None = None,
    flops: float | dict[str, float] | None = None,
    kernels: dict[str, Any] | None = None,
    resources: dict[str, dict[str, int]] | None = None,
    own: Iterable[str] = (),
    timing: ForwardTiming | None = None,
    timing_iterations: int = 10,
    max_kernels: int = 256,
    ceilings: bool | dict[str, Any] = True,
    replay: str = "user",
    keep_enabled: bool | None = None,
    flush_l2: bool = True,
) -> ForwardProfile:
    """Profile one forward `fn()` on `device`: timing (CUPTI activity + CUDA events), hardware
    `metrics` per kernel (Range Profiler), static facts, occupancy and a roofline line.

    - `replay`: "user" runs fn once per profiler pass (fast: nothing to save; fn must launch
      the same kernels each call, as a forward on fixed inputs does), falling back to "kernel"
      if CUPTI refuses; "kernel" runs fn once and CUPTI replays each launch, saving and
      restoring the memory it may write.
    - `keep_enabled`: leave the Range Profiler enabled on the context between calls (a warm
      worker's profile then skips the ~0.4 s first start; `_core.profiler_release()` ends it).
      Default: KEEP_ENABLED, which the evaluation workers set; off in the user's process, where
      torch.profiler or Nsight may want the counters next.
    - `flush_l2`: flush the L2 before each profiler pass (outside the profiled range), so that
      every pass, and every candidate, starts cold, as Nsight Compute's default
      `--cache-control all` does (its buffers, 6x the L2, stay allocated for the process); False
      leaves the cache as the previous pass left it. The flush is l2_flush.L2_FLUSH_METHOD's.

    - `min_bytes`: the fewest DRAM bytes the problem needs (inputs read + outputs written), for
      the forward's speed-of-light time; `flops`: FLOPs of the forward, or {kernel name: FLOPs}.
    - `kernels` {name: _core.Kernel} lets the driver's occupancy calculator check ours;
      `resources` {name: ptxas info} (CompiledModule.resources) adds spill bytes;
      `own`: the candidate's kernel names (default: the names in `kernels` and `resources`).
    - `timing`: a ForwardTiming of the same forward already measured (time_forward), reused
      instead of timing `timing_iterations` more calls.
    - `ceilings`: True to measure/cache this GPU's ceilings, False to skip, or a dict.

    Never raises for missing counters: the result's `reason` says what is missing and why."""
    device = gpu.device_index(device)
    if keep_enabled is None:
        keep_enabled = KEEP_ENABLED
    with gpu.require_torch().cuda.device(device):
        return _profile_forward(
            fn,
            device,
            metrics=metrics,
            extra_metrics=extra_metrics,
            min_bytes=min_bytes,
            flops=flops,
            kernels=kernels,
            resources=resources,
            own=own,
            timing=timing,
            timing_iterations=timing_iterations,
            max_kernels=max_kernels,
            ceilings=ceilings,
            replay=replay,
            keep_enabled=keep_enabled,
            flush_l2=flush_l2,
        )


def _profile_forward(
    fn: Callable[[], Any],
    device: int,
    *,
    metrics: str | Iterable[str],
    extra_metrics: Iterable[str],
    min_bytes: int | None,
    flops: float | dict[str, float] | None,
    kernels: dict[str, Any] | None,
    resources: dict[str, dict[str, int]] | None,
    own: Iterable[str],
    timing: ForwardTiming | None,
    timing_iterations: int,
    max_kernels: int,
    ceilings: bool | dict[str, Any],
    replay: str,
    keep_enabled: bool,
    flush_l2: bool,
) -> ForwardProfile:
    gpu.prepare(device)
    own = set(own) | set(kernels or {}) | set(resources or {})
    info = _core.device_info(device)
    if timing is None:
        timing = time_forward(fn, iterations=timing_iterations, warmup=2, device=device, own=own)
    notes = list(timing.notes)

    plan: MetricPlan | None = None
    reason = timing.reason
    ranges: list[dict] | None = None
    passes, profile_s, phases = 0, 0.0, {}
    requested = parse_metrics(metrics)
    chip = before = None
    try:
        chip = _chip_of(device)
        plan = check_metrics(requested + [m for m in extra_metrics if m not in requested], chip)
        prof = _profiler(device, plan.collect)
        before = l2_flush(device) if flush_l2 else None
        started = time.perf_counter()
        discarded_s = 0.0
        try:
            ranges = prof.profile(
                fn, max_kernels=max_kernels, replay=replay, keep=keep_enabled, before=before
            )
            if keep_enabled and (prof.last_run or {}).get("reused_enabled") is False:
                # The first profile after enabling counts DRAM writes of CUPTI's own (an add with
                # a 4 MB output: 6.1 MB, then 8-13 KB, on the H200): a worker's freshly enabled
                # Range Profiler profiles once more and keeps the second. Kept for the Judge, not
                # for agreement with ncu: without it the first candidate in every worker would
                # show megabytes of writes it never made (relu: 73 MB instead of 45 MB), and its
                # DRAM bandwidth and roofline bound would follow them.
                discarded_s = time.perf_counter() - started
                ranges = prof.profile(
                    fn, max_kernels=max_kernels, replay=replay, keep=True, before=before
                )
        except ProfilerError as exc:
            if replay != "user" and not keep_enabled:
                raise
            kept = ", kept enabled," if keep_enabled else ""
            notes.append(f"{replay} replay{kept} refused ({exc}); kernel replay per call used")
            started, discarded_s = time.perf_counter(), 0.0
            ranges = prof.profile(fn, max_kernels=max_kernels, replay="kernel", before=before)
        profile_s = time.perf_counter() - started
        passes = prof.passes
        run = prof.last_run or {}
        phases = dict(run.get("seconds") or {})
        if discarded_s:
            phases["first_profile_after_enable"] = discarded_s  # done again, not kept
        phases["disable_and_rest"] = profile_s - sum(phases.values())
        if run.get("names_note"):
            notes.append(run["names_note"])
        if run.get("ranges_dropped"):
            notes.append(f"{run['ranges_dropped']} launches past max_kernels were not profiled")
    except ProfilerError as exc:
        reason = f"{getattr(exc, 'reason', 'cupti_error')}: {exc}"
        ranges = None
    except LibraryNotFound as exc:
        reason = f"no_cupti: {exc}"
        ranges = None

    # Names of the ranges: from the profiler's own trace, else the timing trace's launch order.
    if ranges is not None and any(r["name"] is None for r in ranges):
        per = timing.launches_per_forward or 0
        order = [r["name"] for r in timing.records[:per]]
        if len(order) == len(ranges):
            for r, name in zip(ranges, order):
                r["name"] = name
        else:
            notes.append(
                f"{len(ranges)} profiled launches vs {len(order)} timed: metrics not matched"
            )
            ranges = [r for r in ranges if r["name"] is not None]

    ceiling_data = None
    if ceilings is True:
        try:
            ceiling_data = measure_ceilings(device)
        except (RuntimeError, OSError, ValueError) as exc:  # a bonus: keep the profile
            notes.append(f"no ceilings: {exc}")
    elif isinstance(ceilings, dict):
        ceiling_data = ceilings

    first_record: dict[str, dict] = {}
    for r in timing.records:
        first_record.setdefault(r["name"], r)
    values: dict[str, list[dict[str, float]]] = {}
    for r in ranges or []:
        values.setdefault(r["name"], []).append(r["metrics"])

    total = sum(k.total_us for k in timing.kernels) or 1.0
    profiles = []
    for kt in timing.kernels:
        rec = first_record.get(kt.name, {})
        kp = KernelProfile(
            name=kt.name,
            launches=kt.calls,
            time_ms=kt.mean_us / 1e3,
            total_ms=kt.total_us / 1e3,
            share=kt.total_us / total,
            own=kt.own or kt.name in own,
        )
        kernel_obj = (kernels or {}).get(kt.name)
        if rec:
            kp.registers_allocated = kp.registers_per_thread = rec["registers"]
            if kernel_obj is not None:
                kp.registers_per_thread = kernel_obj.attributes()["registers_per_thread"]
            kp.static_shared_bytes = rec["static_shared"]
            kp.dynamic_shared_bytes = rec["dynamic_shared"]
            kp.local_bytes_per_thread = rec["local_bytes"]
            kp.grid, kp.block = tuple(rec["grid"]), tuple(rec["block"])
            threads = kp.block[0] * kp.block[1] * kp.block[2]
            kp.occupancy = occupancy(
                kp.registers_allocated,
                threads,
                kp.static_shared_bytes + kp.dynamic_shared_bytes,
                info,
                rec.get("shared_executed") or None,
            )
            if kernel_obj is not None:
                try:
                    kp.occupancy.driver_blocks_per_sm = kernel_obj.occupancy(
                        threads, kp.dynamic_shared_bytes
                    )
                except (RuntimeError, ValueError) as exc:
                    notes.append(f"{kt.name}: driver occupancy failed: {exc}")
            kp.metrics.update(launch_metrics(kp.occupancy, kp.registers_allocated))
        ptxas = _ptxas_for(resources, kt.name)
        kp.spill_store_bytes = ptxas.get("spill_store_bytes")
        kp.spill_load_bytes = ptxas.get("spill_load_bytes")
        _fill_metrics(kp, requested, plan, values.get(kt.name), reason)
        if kp.occupancy is not None:
            kp.occupancy.achieved_pct = kp.metrics.get(
                "sm__warps_active.avg.pct_of_peak_sustained_active"
            )
        if ceiling_data is not None:
            kp.roofline = _kernel_roofline(kp, ceiling_data, flops, len(timing.kernels))
        profiles.append(kp)

    min_time_ms = None
    if min_bytes is not None and ceiling_data is not None:
        min_time_ms = 1e3 * min_bytes / ceiling_data["dram_bytes_per_s"]
    return ForwardProfile(
        device=info["name"],
        chip=chip,
        kernels=profiles,
        forward_ms=timing.forward_ms,
        kernel_ms=timing.kernel_ms,
        reason=reason,
        metrics_requested=requested,
        passes=passes,
        profile_s=profile_s,
        profile_phases=phases,
        min_bytes=min_bytes,
        min_time_ms=min_time_ms,
        ceilings=ceiling_data,
        notes=notes,
        l2_flushed=before is not None and ranges is not None,
    )


def _fill_metrics(
    kp: KernelProfile,
    requested: list[str],
    plan: MetricPlan | None,
    launches: list[dict[str, float]] | None,
    reason: str | None,
) -> None:
    for name in requested:
        if name.startswith("launch__"):
            if name not in kp.metrics:
                kp.unavailable[name] = (
                    plan.unavailable.get(name, "no launch record for this kernel")
                    if plan
                    else "no launch record for this kernel"
                )
            continue
        if plan is not None and name in plan.unavailable:
            kp.unavailable[name] = plan.unavailable[name]
            continue
        source = plan.substitutes.get(name, name) if plan else name
        if launches:
            kp.metrics[name] = sum(v[source] for v in launches) / len(launches)
            if source != name:
                kp.substitutes[name] = source
        elif reason:
            kp.unavailable[name] = f"no hardware counters: {reason}"
        else:
            kp.unavailable[name] = "this kernel was not among the profiled launches"
    if launches and "gpu__time_duration.sum" in launches[0]:
        kp.metrics["gpu__time_duration.sum"] = sum(
            v["gpu__time_duration.sum"] for v in launches
        ) / len(launches)
    # the launch__* values are for the Judge only when asked for
    for name in [m for m in kp.metrics if m.startswith("launch__") and m not in requested]:
        del kp.metrics[name]


def _kernel_roofline(
    kp: KernelProfile,
    ceilings: dict[str, Any],
    flops: float | dict[str, float] | None,
    n_kernels: int,
) -> Roofline:
    m = kp.metrics
    dram = None
    if "dram__bytes_read.sum" in m and "dram__bytes_write.sum" in m:
        dram = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
    kernel_flops = None
    if isinstance(flops, dict):
        kernel_flops = flops.get(kp.name)
        if kernel_flops is not None:
            kernel_flops /= max(1, kp.launches)
    elif flops is not None and n_kernels == 1:
        kernel_flops = flops / max(1, kp.launches)
    # the duration under the profiler matches the counters; else the timed mean
    time_s = m.get("gpu__time_duration.sum", kp.time_ms * 1e6) / 1e9
    tensor = m.get("sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active", 0.0) > 1.0
    return roofline(time_s, ceilings, dram, kernel_flops, tensor)


def min_bytes_of(*tensors) -> int:
    """Bytes of the given tensors (nested lists/tuples allowed): the minimum DRAM traffic of a
    forward that reads its inputs once and writes its outputs once."""
    total = 0
    for t in tensors:
        if isinstance(t, (list, tuple)):
            total += min_bytes_of(*t)
        elif hasattr(t, "element_size") and hasattr(t, "numel"):
            total += t.element_size() * t.numel()
    return total


def profile(problem, candidate=None, **kwargs) -> ForwardProfile:
    """Profile a candidate's forward on a problem's inputs.

    - `profile(fn)`: `fn` is a zero-argument callable (a forward with its inputs bound);
    - `profile(problem, candidate)`: `problem` has `get_inputs()` (KernelBench format) or is the
      list of inputs; `candidate` is a module or callable taking them. Inputs are moved to the
      GPU; `min_bytes` defaults to the bytes of the inputs plus those of the outputs.

    Other keywords go to profile_forward()."""
    if candidate is None:
        if not callable(problem):
            raise TypeError("profile(fn) takes a zero-argument callable, or (problem, candidate)")
        return profile_forward(problem, **kwargs)
    torch = gpu.require_torch()
    device = gpu.device_index(kwargs.get("device"))
    inputs = problem.get_inputs() if hasattr(problem, "get_inputs") else list(problem)
    inputs = [x.to(f"cuda:{device}") if hasattr(x, "to") else x for x in inputs]
    if hasattr(candidate, "to") and hasattr(candidate, "parameters"):
        candidate = candidate.to(f"cuda:{device}")

    def forward():
        with torch.no_grad():
            return candidate(*inputs)

    if kwargs.get("min_bytes") is None:
        kwargs["min_bytes"] = min_bytes_of(inputs, forward())
    return profile_forward(forward, **kwargs)


__all__ = [
    "KEEP_ENABLED",
    "ForwardProfile",
    "KernelProfile",
    "min_bytes_of",
    "profile",
    "profile_forward",
]
