"""cudaforge/profiling/measurements.py: the Judge's measurements text, on the profile recorded on
the H200 (tests/fixtures/profile_h200.json) and on results without a profile."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from cudaforge.harness.results import EvalResult, KernelTime
from cudaforge.profiling.measurements import measurements_text

FIXTURE = Path(__file__).parent / "fixtures" / "profile_h200.json"


def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


def result_with(profile, **fields) -> EvalResult:
    kernels = [
        KernelTime(k["name"], k["launches"], k["total_ms"] * 1e3, k["time_ms"] * 1e3, k["own"])
        for k in recorded()["kernels"]
    ]
    values = {
        "problem": "matmul_add", "status": "ok", "candidate_ms": 0.5482,
        "candidate_spread": 0.012, "reference_ms": 1.21, "speedup": 2.207, "kernels": kernels,
        "own_kernel_share": 0.996, "profile": profile, **fields,
    }  # fmt: skip
    return EvalResult(**values)


def bookkeeping_in(text: str) -> list[str]:
    """The profiler's bookkeeping found in `text`: key names and the fixture's values of them."""
    profile = recorded()
    words = [
        "metrics_requested", "passes", "profile_s", "profile_phases", "phases", "ceilings",
        "measured_at", "method", "collected in place of", "unavailable", "note:",
        profile["ceilings"]["method"], profile["ceilings"]["measured_at"], profile["notes"][0],
    ]  # fmt: skip
    return [w for w in words if w in text]


def first_index(lines: list[str], start: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(start))


@pytest.mark.parametrize("budget", [3000, 1500, 700])
def test_recorded_h200_profile_within_budget_roofline_first(budget):
    text = measurements_text(result_with(recorded(), compiled_reference_ms=0.9,
                                         speedup_vs_compile=1.64), budget=budget)  # fmt: skip
    assert len(text) <= budget, len(text)
    lines = text.splitlines()
    assert lines[0].startswith("time per forward: 0.5482 ms")
    assert "eager PyTorch 1.21 ms, speedup 2.21x" in lines[0]
    assert "torch.compile 0.9 ms, speedup 1.64x" in lines[0]
    roofline = first_index(lines, "roofline: ")
    assert roofline == 1
    line = lines[roofline]
    assert line.startswith("roofline: compute-bound: matmul_naive (76% of GPU time)")
    assert "10% of the fp32 peak" in line and "424 MB" in line and "0.1014 ms" in line
    # the roofline line comes before every other measurement of the profile
    kernel_lines = [i for i, x in enumerate(lines) if "matmul_naive" in x or "vector_add" in x]
    assert kernel_lines and min(kernel_lines) == roofline
    assert not any(x.startswith("GPU:") for x in lines[:roofline])
    assert "vector_add" in text  # the kernels by time follow, with what explains them
    if budget != 1500:  # at 1500 format_profile details the slowest kernel only
        assert "memory-bound" in text
    assert bookkeeping_in(text) == []


def test_a_small_budget_keeps_the_roofline_line():
    for budget in (400, 250):
        text = measurements_text(result_with(recorded()), budget=budget)
        assert len(text) <= budget
        assert text.splitlines()[1].startswith("roofline: compute-bound")


def test_without_a_profile_timing_kernels_and_the_reason():
    failed = "profile failed: ProfilerError: counters need admin rights"
    text = measurements_text(result_with(None, notes=["compile took 0.2 s", failed]))
    lines = text.splitlines()
    assert lines[0].startswith("time per forward: 0.5482 ms") and "torch.compile" not in text
    assert f"hardware metrics: not profiled ({failed})" in lines
    kernels = lines.index("kernels by GPU time per forward:")
    assert lines[kernels + 1].startswith("  matmul_naive (own): 0.4149 ms, 76%")
    assert lines[kernels + 3].startswith("  _ZN2at6native") and "(library)" in lines[kernels + 3]
    plain = measurements_text(result_with(None))
    assert "hardware metrics: not profiled (hardware metrics were not asked for" in plain


def test_anything_with_the_attributes_will_do():
    result = SimpleNamespace(
        candidate_ms=2.0, reference_ms=1.0, speedup=0.5, compiled_reference_ms=None,
        speedup_vs_compile=None, candidate_spread=None, own_kernel_share=None,
        kernels=[{"name": "k", "calls": 2, "total_us": 1900.0, "mean_us": 950.0, "own": True}],
        guards=["unmeasured_work"], profile=None, notes=[],
    )  # fmt: skip
    text = measurements_text(result)
    assert text.splitlines()[0] == "time per forward: 2 ms; eager PyTorch 1 ms, speedup 0.5x"
    assert "guards that fired: unmeasured_work" in text
    assert "  k (own): 1.9 ms, 100%, 2 launches of 0.95 ms" in text


def test_a_profile_without_metrics_says_why():
    profile = recorded()
    profile["reason"] = "permission: counters need admin rights"
    for kernel in profile["kernels"]:
        kernel["metrics"], kernel["roofline"] = {}, None
    profile["min_time_ms"] = None
    text = measurements_text(result_with(profile))
    assert "roofline: the forward must move 424 MB (inputs + outputs)" in text
    assert "Hardware metrics unavailable (permission: counters need admin rights)" in text
    profile["min_bytes"] = None
    text = measurements_text(result_with(profile))
    assert "roofline: not available (permission: counters need admin rights)" in text


def test_profiling_does_not_depend_on_the_harness():
    import test_layout

    graph = test_layout.python_imports()
    assert not [m for m in graph["cudaforge.profiling.measurements"] if ".harness" in m]


def test_kernel_times_from_cupti_records_are_per_forward_and_largest_first():
    records = [{"name": "mine", "duration_ns": 1000}, {"name": "gemm", "duration_ns": 4000},
               {"name": "mine", "duration_ns": 3000}, {"name": "gemm", "duration_ns": 6000}]  # fmt: skip
    kernels = KernelTime.from_records(records, runs=2, own={"mine"})
    assert [k.name for k in kernels] == ["gemm", "mine"]
    gemm, mine = kernels
    assert (gemm.calls, gemm.total_us, gemm.mean_us, gemm.own) == (1, 5.0, 5.0, False)
    assert (mine.calls, mine.total_us, mine.mean_us, mine.own) == (1, 2.0, 2.0, True)


def test_intervals_runs_and_a_tie_within_noise():
    tied = result_with(None, candidate_ms=1.0, reference_ms=1.01, speedup=1.01,
                       candidate_low_ms=0.99, candidate_high_ms=1.02, reference_low_ms=1.0,
                       reference_high_ms=1.03,
                       timing={"speedup_basis": "eager", "candidate_eager": {"runs": 36}})  # fmt: skip
    line = measurements_text(tied).splitlines()[0]
    assert line.startswith("time per forward: 1 ms (95% interval 0.99 ms to 1.02 ms, 36 runs;")
    assert "eager PyTorch 1.01 ms (1 ms to 1.03 ms), speedup 1.01x (a tie within noise" in line
    apart = dataclasses.replace(tied, reference_ms=1.2, reference_low_ms=1.18,
                                reference_high_ms=1.22, speedup=1.2)  # fmt: skip
    assert "tie within noise" not in measurements_text(apart)
    assert "tie within noise" not in measurements_text(result_with(None))  # no intervals


def test_graph_replays_are_said_with_the_eager_figures():
    graph = result_with(None, candidate_ms=0.02, reference_ms=0.03, speedup=1.5,
                        timing={"speedup_basis": "graph",
                                "candidate_eager": {"median_ms": 0.045, "runs": 40},
                                "reference_eager": {"median_ms": 0.05, "runs": 40}})  # fmt: skip
    line = measurements_text(graph).splitlines()[0]
    assert "as CUDA-graph replays; PyTorch 30 us, speedup 1.5x" in line
    assert "eagerly (launched from Python): 45 us vs PyTorch 50 us, 1.11x" in line


def test_the_host_time_to_issue_a_forward_follows_the_time_line():
    timing = {"candidate_host_ms": 0.142, "reference_host_ms": 0.061}
    lines = measurements_text(result_with(None, timing=timing, candidate_ms=0.0482)).splitlines()
    host = lines[1]
    assert host.startswith("host time to issue one forward (its Python and launches): 0.142 ms")
    assert "PyTorch's 61 us" in host and "2.9x its GPU time" in host
    # a forward whose GPU time exceeds its host time: the figure alone, no advice
    quiet = measurements_text(result_with(None, timing=timing)).splitlines()[1]
    assert "PyTorch's 61 us" in quiet and "GPU time" not in quiet
    # not measured (a CPU evaluation, an old record): no line
    plain = measurements_text(result_with(None)).splitlines()
    assert not any(line.startswith("host time") for line in plain)
