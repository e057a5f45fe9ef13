"""Results of evaluating a candidate: plain dataclasses that serialize to JSON and back."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

# status values of an EvalResult, in the order a candidate goes through them
STATUSES = (
    "ok",  # compiled, correct, timed
    "compile_error",  # did not compile (compile_log holds the log)
    "load_error",  # the candidate's Python failed before a forward (import, __init__)
    "runtime_error",  # raised during a forward (error holds the message)
    "incorrect",  # ran, but an output differs (failure holds the first failing trial)
    "rejected",  # correct values, but a guard refused it (guards says which)
    "timeout",  # did not finish in time; its worker was replaced
    "crashed",  # a sticky CUDA error or a dead worker process; the worker was replaced
)


def _known(cls, data: dict[str, Any]):
    """cls(**data) without the keys cls does not have (results written by a newer version)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class TrialFailure:
    """The first trial whose output differed from the reference."""

    trial: int
    output_index: int
    message: str
    max_abs_err: float = float("nan")
    max_rel_err: float = float("nan")
    mismatches: int = 0
    total: int = 0
    worst_index: list[int] = field(default_factory=list)
    expected: float | None = None
    actual: float | None = None
    # where it failed: "correctness" (the trials), "timed_output" (an output of a timed run),
    # "revalidation" (after timing, on inputs the candidate had not seen)
    phase: str = "correctness"
    seed: int | None = None
    rel_l2_err: float = float("nan")  # ||actual - expected|| / ||expected|| over finite elements


@dataclass
class KernelTime:
    """GPU time of one kernel (by name) during the timed forwards, from CUPTI activity records."""

    name: str
    calls: int
    total_us: float
    mean_us: float
    own: bool  # compiled by the candidate (not a torch/cuBLAS kernel)

    @staticmethod
    def from_records(records, runs: int, own) -> list[KernelTime]:
        """One KernelTime per kernel name of CUPTI's kernel `records` (dicts with "name" and
        "duration_ns") over `runs` forwards, the most total time first; `own`: the names that are
        the candidate's."""
        per_name: dict[str, list[int]] = {}
        for rec in records:
            per_name.setdefault(rec["name"], []).append(rec["duration_ns"])
        kernels = [
            KernelTime(
                name=name,
                calls=round(len(d) / runs) or 1,
                total_us=sum(d) / runs / 1e3,
                mean_us=sum(d) / len(d) / 1e3,
                own=name in own,
            )
            for name, d in per_name.items()
        ]
        return sorted(kernels, key=lambda k: -k.total_us)


@dataclass
class EvalResult:
    problem: str
    status: str = "load_error"
    compiled: bool = False
    correct: bool = False
    error: str = ""  # one readable line: what happened
    compile_log: str = ""
    failure: TrialFailure | None = None
    trials: int = 0
    tolerances: dict[str, float] = field(default_factory=dict)
    # median time of one forward (CUDA events on a GPU): of the graph replays where both sides
    # were captured (timing["speedup_basis"] == "graph"), else of the eager forwards
    candidate_ms: float | None = None
    candidate_spread: float | None = None  # (p75 - p25) / median
    reference_ms: float | None = None
    reference_spread: float | None = None
    # the 95% confidence interval of each median (order statistics, harness/stopping.py); None
    # with too few runs or in records written before it. The per-side details (runs, why they
    # stopped, eager and graph figures) are timing["candidate_eager"], ["candidate_graph"], ...
    candidate_low_ms: float | None = None
    candidate_high_ms: float | None = None
    reference_low_ms: float | None = None
    reference_high_ms: float | None = None
    compiled_reference_ms: float | None = None  # torch.compile of the reference, when asked
    speedup: float | None = None  # reference_ms / candidate_ms
    speedup_vs_compile: float | None = None
    kernels: list[KernelTime] = field(default_factory=list)
    own_kernel_share: float | None = None  # share of GPU time in the candidate's own kernels
    guards: list[str] = field(default_factory=list)  # guards that fired, by name
    profile: dict[str, Any] | None = None  # hardware metrics (cudaforge.profile), when asked
    device: str = ""
    worker: int | None = None
    node: str = ""  # the Ray node that measured it (its node id); "" for a local pool
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # added with the evaluation harness (cudaforge/harness/)
    problem_hash: str = ""  # sha256 of the problem source that ran (size overrides included)
    candidate_hash: str = ""  # sha256 of the candidate source
    seed: int = 0  # trial t draws its inputs from seed + t
    traceback: str = ""  # the candidate's frames of the exception behind error, if any
    guard_details: dict[str, str] = field(default_factory=dict)  # fired guard -> what was seen
    guards_passed: list[str] = field(default_factory=list)  # guards checked that did not fire
    guards_skipped: dict[str, str] = field(default_factory=dict)  # guard -> why it could not run
    timing: dict[str, Any] = field(default_factory=dict)  # how times were taken, and extra stats
    notes: list[str] = field(default_factory=list)  # anything else worth reading

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def eager_candidate_ms(self) -> float | None:
        """The candidate's median eager time (ms): candidate_ms, unless the speedup used graph
        replays (the torch.compile comparison is eager on both sides)."""
        eager = self.timing.get("candidate_eager") if isinstance(self.timing, dict) else None
        if isinstance(eager, dict) and isinstance(eager.get("median_ms"), (int, float)):
            return float(eager["median_ms"])
        return self.candidate_ms

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        data = dict(data)
        if data.get("failure") is not None:
            data["failure"] = _known(TrialFailure, data["failure"])
        data["kernels"] = [_known(KernelTime, k) for k in data.get("kernels", [])]
        return _known(cls, data)

    @classmethod
    def from_json(cls, text: str) -> EvalResult:
        return cls.from_dict(json.loads(text))
