"""Where a model's forward spends its time: one call timed (`time_call`: CUDA events on a GPU,
perf_counter on the CPU) and a forward profiled per module and per op (`profile_model`, under
torch.profiler with a range per module). Also how example inputs become call arguments and which
device a model runs on."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..harness.timing import SPIN_CYCLES_PER_NS

QUEUE_CYCLES = 4_000_000  # GPU clock cycles spun ahead of a queued call: about 2 ms at 2 GHz


def split_inputs(example_inputs) -> tuple[tuple, dict]:
    """A tensor, a tuple/list of positional arguments, or a dict of keyword arguments ->
    (args, kwargs)."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise TypeError(
        "example_inputs must be a tensor, a tuple/list of positional arguments or a dict of "
        f"keyword arguments, not {type(example_inputs).__name__}"
    )


def model_device(model: nn.Module, args: Sequence = (), kwargs: dict | None = None):
    """The device the model runs on: its first parameter's, else its first tensor input's."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    for value in list(args) + list((kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[[], Any],
    device,
    *,
    min_reps: int = 5,
    max_reps: int = 100,
    target_ms: float = 60.0,
    warmup: int = 2,
    queued: bool = False,
) -> float:
    """Median time of one call of fn() in ms: CUDA events on a GPU, perf_counter on the CPU.
    Repeats until about target_ms of samples (between min_reps and max_reps).

    queued: on a GPU, each call is enqueued behind a spin (QUEUE_CYCLES, or twice the host's
    time to issue a call), so that the host's work for it (Python, launches) happens while the
    GPU is still busy, as for an op inside a forward that keeps the GPU busy: the time is then
    the GPU's own, launch overhead hidden. Unqueued, an idle GPU waits for the host and the time is
    the host's where the host is slower (a short op called on its own)."""
    return time_calls([fn], device, min_reps=min_reps, max_reps=max_reps, target_ms=target_ms,
                      warmup=warmup, queued=queued)[0]  # fmt: skip


def time_calls(fns: Sequence[Callable[[], Any]], device, *, min_reps: int = 5,
               max_reps: int = 100, target_ms: float = 60.0, warmup: int = 2,
               queued: bool = False) -> list[float]:  # fmt: skip
    """time_call of each of fns, their calls alternated (a, b, a, b, ...): what drifts while
    they are timed (clocks, the host's load) hits each alike. Median ms per fn, in order."""
    samples = call_samples(fns, device, min_reps=min_reps, max_reps=max_reps,
                           target_ms=target_ms, warmup=warmup, queued=queued)  # fmt: skip
    return [statistics.median(taken) for taken in samples]


def call_samples(fns: Sequence[Callable[[], Any]], device, *, min_reps: int = 5,
                 max_reps: int = 100, target_ms: float = 60.0, warmup: int = 2,
                 queued: bool = False) -> list[list[float]]:  # fmt: skip
    """time_calls' samples: ms of every timed call, per fn, in order."""
    device = torch.device(device)
    spins = []
    for fn in fns:
        issue_ms = math.inf  # the host's least time to issue a call (the first ones set up)
        for _ in range(max(1, warmup)):
            _synchronize(device)
            began = time.perf_counter()
            fn()
            issue_ms = min(issue_ms, (time.perf_counter() - began) * 1e3)
        # the spin outlasts the host's work for a call (a forward that issues for 4 ms needs
        # more than the default), up to about 0.1 s
        spins.append(min(max(QUEUE_CYCLES, int(2 * issue_ms * 1e6 * SPIN_CYCLES_PER_NS)), 50 * QUEUE_CYCLES))
    _synchronize(device)
    samples: list[list[float]] = [[] for _ in fns]
    spent = 0.0
    while len(samples[0]) < min_reps or (spent < target_ms and len(samples[0]) < max_reps):
        for fn, spin, taken in zip(fns, spins, samples):
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                if queued:
                    torch.cuda._sleep(spin)
                start.record()
                fn()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                began = time.perf_counter()
                fn()
                ms = (time.perf_counter() - began) * 1e3
            taken.append(ms)
        spent = max(sum(taken) for taken in samples)
    return samples


# ---------------------------------------------------------------- profile


@dataclass
class ModuleTime:
    path: str
    type: str
    calls: int  # per forward
    ms: float  # per forward, all calls, children included
    leaf: bool


@dataclass
class OpTime:
    name: str
    calls: int  # per forward
    ms: float  # self time per forward


@dataclass
class ModelProfile:
    """Where a forward spends its time. time_kind: 'cuda' (GPU time) or 'cpu' (CPU time)."""

    device: str
    time_kind: str
    forward_ms: float  # the whole forward as profiled (per forward)
    modules: dict[str, ModuleTime]
    ops: list[OpTime]

    def share(self, path: str) -> float:
        module = self.modules.get(path)
        if module is None or self.forward_ms <= 0:
            return 0.0
        return module.ms / self.forward_ms

    def table(self, top: int = 12) -> str:
        lines = [f"forward: {self.forward_ms:.4g} ms of {self.time_kind} time on {self.device}"]
        leaves = sorted((m for m in self.modules.values() if m.leaf), key=lambda m: -m.ms)
        lines.append("leaf modules:")
        for m in leaves[:top]:
            lines.append(
                f"  {m.path or '(root)'} [{m.type}] {m.ms:.4g} ms ({self.share(m.path):.1%}),"
                f" {m.calls} call{'s' if m.calls != 1 else ''}"
            )
        lines.append("ops (self time):")
        for op in self.ops[:top]:
            lines.append(f"  {op.name}: {op.ms:.4g} ms, {op.calls} calls")
        return "\n".join(lines)


_RANGE = "cudaforge.module:"


def release_cupti_after_profiling() -> bool:
    """Have Kineto release CUPTI when a torch.profiler session ends: it reads TEARDOWN_CUPTI
    then, and unless it is "1" leaves CUPTI attached to the process (pytorch/pytorch#144455
    measured training 10-20% slower after profiling). Profiling a model for hot spots must not
    slow the rest of the user's process down, so this sets it to "1", for the process, unless
    it is set already (a user's "0" is kept). True when it set it."""
    if "TEARDOWN_CUPTI" in os.environ:
        return False
    os.environ["TEARDOWN_CUPTI"] = "1"
    return True


def profiled_forwards(model, args, kwargs, device, repeat: int, label: str | None = None):
    """One warm-up forward, then `repeat` forwards under torch.profiler (host, and CUDA on a GPU),
    without autograd, each inside a range named `label` when one is given; the profiler. CUPTI
    is released when the session ends (release_cupti_after_profiling)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        release_cupti_after_profiling()
    with torch.no_grad():
        model(*args, **kwargs)
        _synchronize(device)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(repeat):
                if label is None:
                    model(*args, **kwargs)
                    continue
                with torch.autograd.profiler.record_function(label):
                    model(*args, **kwargs)
            _synchronize(device)
    return prof


def profile_model(model: nn.Module, example_inputs, *, repeat: int = 3) -> ModelProfile:
    """Profile `repeat` forwards (after one warm-up) with a torch.profiler range per module."""
    args, kwargs = split_inputs(example_inputs)
    device = model_device(model, args, kwargs)
    on_gpu = device.type == "cuda"
    paths = {id(m): path for path, m in model.named_modules()}
    leaves = {path for path, m in model.named_modules() if not any(True for _ in m.children())}
    types_ = {path: type(m).__name__ for path, m in model.named_modules()}
    stack: list[Any] = []

    def enter(module, _args):
        scope = torch.autograd.profiler.record_function(_RANGE + paths.get(id(module), "?"))
        scope.__enter__()
        stack.append(scope)

    def leave(module, _args, _output):
        if stack:
            stack.pop().__exit__(None, None, None)

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        prof = profiled_forwards(model, args, kwargs, device, repeat)
    finally:
        for handle in handles:
            handle.remove()
        stack.clear()

    def span(event) -> float:  # microseconds
        if on_gpu:
            value = getattr(event, "device_time_total", None)
            if value is None:
                value = getattr(event, "cuda_time_total", 0.0)
            return float(value)
        return float(event.cpu_time_total)

    modules: dict[str, ModuleTime] = {}
    for event in prof.events():
        if not event.name.startswith(_RANGE):
            continue
        path = event.name[len(_RANGE) :]
        entry = modules.setdefault(
            path, ModuleTime(path, types_.get(path, "?"), 0, 0.0, path in leaves)
        )
        entry.calls += 1
        entry.ms += span(event) / 1e3
    for entry in modules.values():
        entry.calls = max(1, round(entry.calls / repeat))
        entry.ms /= repeat
    ops = []
    for avg in prof.key_averages():
        if avg.key.startswith(_RANGE) or avg.key.startswith("ProfilerStep"):
            continue
        if on_gpu:
            self_us = getattr(avg, "self_device_time_total", None)
            if self_us is None:
                self_us = getattr(avg, "self_cuda_time_total", 0.0)
        else:
            self_us = avg.self_cpu_time_total
        if self_us > 0:
            ops.append(OpTime(avg.key, max(1, round(avg.count / repeat)), self_us / 1e3 / repeat))
    ops.sort(key=lambda op: -op.ms)
    root = modules.get("")
    forward_ms = root.ms if root is not None else sum(op.ms for op in ops)
    return ModelProfile(str(device), "cuda" if on_gpu else "cpu", forward_ms, modules, ops)


__all__ = [
    "ModelProfile",
    "ModuleTime",
    "OpTime",
    "model_device",
    "profile_model",
    "split_inputs",
    "time_call",
    "time_calls",
]
