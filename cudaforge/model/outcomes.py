"""What `optimize` and `apply_stored` return: an OptimizeResult (the model, end-to-end times,
the output check, cost) with one HotspotOutcome per hot spot (what happened to it and the
evidence for its kernel). Both are plain data (`to_dict()`); the result reads as text
(`report()`) and as HTML in a notebook, made by cudaforge.reporting."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from ..harness.stopping import compare_times
from ..reporting.html import optimize_html
from ..reporting.markdown import optimize_text


@dataclass
class HotspotOutcome:
    """What happened to one hot spot.

    status: 'swapped' (its kernel runs in the model), 'no_kernel' (no candidate was correct and
    faster), 'slower_here' (faster in the worker, not in this process), 'refused' (failed the
    checks in this process), 'interrupted' (stopped before a kernel was found), 'error'.
    before_ms/after_ms: one call of the original / the kernel, timed in this process on the
    captured inputs. evidence: the worker's EvalResult of the kernel (trials, tolerances,
    guards, timing) and the in-process checks (SwapCheck)."""

    name: str
    kind: str
    label: str
    sites: list[str]
    problem_hash: str
    share: float
    status: str = "no_kernel"
    detail: str = ""
    origin: str = ""  # 'agents' or 'store'
    before_ms: float | None = None
    after_ms: float | None = None
    worker_result: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    cost_usd: float = 0.0
    llm_calls: int = 0
    rounds: int = 0
    candidates: int = 0
    transcript: str = ""
    stored_id: int | None = None
    kernel_source: str = ""
    problem_source: str = ""
    last_result: str = ""  # the last candidate's evaluation, in one line
    waiting_for: list[str] = field(default_factory=list)  # file: prompts without a reply yet
    # training, 'slower_here': the kernel stays installed for its backward kernel, after the
    # original forward
    forward_original: bool = False

    @property
    def speedup(self) -> float | None:
        if self.before_ms and self.after_ms:
            return self.before_ms / self.after_ms
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": self.speedup}


class PhaseClock:
    """clock(name): the seconds since the last call (or since made) become phase `name`."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self.last = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name], self.last = now - self.last, now


@dataclass
class OptimizeResult:
    """What optimize() or apply_stored() did. `model` is the optimized model (the copy, or the model
    itself with inplace=True). before_ms/after_ms: the forward on the example inputs (median,
    ms); max_abs_err: between the two models' outputs."""

    model: nn.Module
    hotspots: list[HotspotOutcome]
    model_name: str = ""
    device: str = ""
    arch: str = ""
    before_ms: float | None = None
    after_ms: float | None = None
    max_abs_err: float | None = None
    outputs_match: bool | None = None
    interrupted: bool = False
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    store: str = ""
    training: bool = False
    mode: str = "optimize"
    profile: str = ""  # where the forward spent its time before (torch.profiler, per module/op)
    # s per phase: search (profile, trace, check the hot spots), reference (the model's outputs
    # and time before), kernels (agents or store, the worker evaluations), swap (in-process
    # checks and timing), end_to_end (the model with its kernels checked and timed)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # the optimized forward's GPU work with its launches queued ahead (GPU only): after_ms well
    # above it means the host paces the forward (see host_paced)
    after_gpu_ms: float | None = None
    # the 95% intervals of before_ms and after_ms (timed side by side), where they were taken
    before_interval: tuple[float, float] | None = None
    after_interval: tuple[float, float] | None = None
    # optimize(site_graphs=...): whether the sites replay from CUDA graphs, and why ("": not asked)
    site_graphs: str = ""

    @property
    def within_noise(self) -> str:
        """A line for the report when before and after are a tie: their intervals overlap."""
        if self.before_interval is None or self.after_interval is None:
            return ""
        verdict = compare_times(self.after_ms, self.after_interval, self.before_ms,
                                self.before_interval)  # fmt: skip
        if verdict != "tie":
            return ""
        (lo, hi), (alo, ahi) = self.before_interval, self.after_interval
        return (
            f"before and after are within the noise: their 95% intervals, {lo:.3g}-{hi:.3g} ms "
            f"and {alo:.3g}-{ahi:.3g} ms, overlap (the kernels stay; a host-paced forward moves "
            "with the host's speed)"
        )

    @property
    def host_paced(self) -> str:
        """A line for the report when the optimized forward waits for the host ("" else)."""
        if not (self.after_ms and self.after_gpu_ms) or self.after_ms < 1.15 * self.after_gpu_ms:
            return ""
        return (
            f"the optimized forward is paced by the host: {self.after_ms:.3g} ms per call for "
            f"{self.after_gpu_ms:.3g} ms of GPU work. For inference, cudaforge.graphed(model, "
            "example_inputs) replays it as one CUDA graph"
        )

    @property
    def speedup(self) -> float | None:
        """End-to-end: before_ms / after_ms on the example inputs."""
        if self.before_ms and self.after_ms:
            return self.before_ms / self.after_ms
        return None

    @property
    def swapped(self) -> list[HotspotOutcome]:
        return [h for h in self.hotspots if h.status == "swapped"]

    @property
    def cost_usd(self) -> float:
        return sum(h.cost_usd for h in self.hotspots)

    @property
    def waiting_for(self) -> list[str]:
        """The `file:` provider's prompt files still without a reply (`wait=0`): run again with
        the same `transcripts=` folder once they are answered."""
        return [path for h in self.hotspots for path in h.waiting_for]

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("model", "hotspots")}
        data["hotspots"] = [h.to_dict() for h in self.hotspots]
        data["speedup"] = self.speedup
        data["cost_usd"] = self.cost_usd
        data["waiting_for"] = self.waiting_for
        return data

    def report(self) -> str:
        """The report as text: end-to-end speedup, then per hot spot before/after, speedup,
        status, evidence and cost."""
        return optimize_text(self)

    def _repr_html_(self) -> str:
        return optimize_html(self)

    def __str__(self) -> str:
        return self.report()


__all__ = ["HotspotOutcome", "OptimizeResult"]
