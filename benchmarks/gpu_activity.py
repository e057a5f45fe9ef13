"""Which processes used the GPU while something ran: NVML's per-process utilization samples
(`nvmlDeviceGetProcessUtilization`, through pynvml), read on a thread every `period` seconds, each
PID named by its command line (a cudaforge worker, a reference process, this process, another).

For the timing issue's unexplained events (benchmarks/RESULTS.md): an evaluation where the
candidate and the reference slowed down together. With this on, each evaluation says which
processes had SM time meanwhile.

    with GpuActivity() as activity:
        result = pool.evaluate(...)
    activity.summary()   # [{"pid", "role", "samples", "sm_max", "sm_mean", "mem_max"}, ...]

Without pynvml or a GPU, summary() is [] and `.unavailable` says why.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Self

ROLES = (
    ("cudaforge.harness.reference_process", "reference process"),
    ("cudaforge.harness.worker", "worker"),
)


def role_of(pid: int, cmdline: str | None = None, own_pid: int | None = None) -> str:
    """A short name for process `pid`: 'this process', a cudaforge role, or its command line."""
    if pid == (os.getpid() if own_pid is None else own_pid):
        return "this process"
    if cmdline is None:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return "gone"
    for needle, role in ROLES:
        if needle in cmdline:
            return f"{role} ({' '.join(cmdline.split(needle, 1)[1].split()[:5])})"
    return cmdline[:80] or "unknown"


def summarize(samples: list[tuple[int, int, int]], roles: dict[int, str]) -> list[dict]:
    """Per PID, from (pid, sm %, mem %) samples: how many samples, the largest and mean SM
    utilization and the largest memory utilization; busiest first."""
    by_pid: dict[int, list[tuple[int, int]]] = {}
    for pid, sm, mem in samples:
        by_pid.setdefault(pid, []).append((sm, mem))
    out = [
        {
            "pid": pid,
            "role": roles.get(pid, "unknown"),
            "samples": len(values),
            "sm_max": max(sm for sm, _ in values),
            "sm_mean": sum(sm for sm, _ in values) / len(values),
            "mem_max": max(mem for _, mem in values),
        }
        for pid, values in by_pid.items()
    ]
    return sorted(out, key=lambda d: (-d["sm_mean"], d["pid"]))


class GpuActivity:
    """A context manager sampling NVML's per-process utilization of GPU `index` (module
    docstring)."""

    def __init__(self, index: int = 0, period: float = 0.05):
        self.index, self.period = index, period
        self.samples: list[tuple[int, int, int]] = []
        self.roles: dict[int, str] = {}
        self.unavailable = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as e:  # noqa: BLE001 - a diagnostic: without NVML it says why
            self.unavailable = f"{type(e).__name__}: {e}"
            return self
        self._thread = threading.Thread(target=self._sample, daemon=True, name="gpu-activity")
        self._thread.start()
        return self

    def _sample(self) -> None:
        nvml, last = self._nvml, 0
        while not self._stop.wait(self.period):
            try:
                found = nvml.nvmlDeviceGetProcessUtilization(self._handle, last)
            except nvml.NVMLError:  # no sample since `last` (NVML_ERROR_NOT_FOUND), or none yet
                continue
            for s in found:
                last = max(last, s.timeStamp)
                self.samples.append((s.pid, s.smUtil, s.memUtil))
                if s.pid not in self.roles:
                    self.roles[s.pid] = role_of(s.pid)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> list[dict]:
        return summarize(self.samples, self.roles)
