"""feedback.py: the Judge's text from a recorded profile (tests/fixtures/profile_h200.json), on the
CPU. The assertions hold for any recording of the fixture's forward (a memory-bound vector add,
a compute-bound naive matmul and a PyTorch kernel), synthetic or measured."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cudaforge.profiling.feedback import format_profile, format_value, hints
from cudaforge.profiling.occupancy import occupancy
from cudaforge.profiling.profiler import ForwardProfile, KernelProfile

FIXTURE = Path(__file__).parent / "fixtures" / "profile_h200.json"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
FMA = "sm__inst_executed_pipe_fp32.avg.pct_of_peak_sustained_active"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"


@pytest.fixture
def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


def test_fixture_says_what_it_is(recorded):
    profile = ForwardProfile.from_dict(recorded)
    assert profile.kernels, "the fixture has kernels"
    if profile.synthetic:
        assert any("SYNTHETIC" in n for n in profile.notes)
        assert "synthetic profile" in format_profile(profile)
    else:  # a real recording: measured on a GPU, with metrics
        assert profile.device and profile.chip and profile.passes > 0


def test_round_trip_through_json(recorded):
    profile = ForwardProfile.from_dict(recorded)
    again = ForwardProfile.from_json(profile.to_json())
    assert again == profile
    assert format_profile(again) == format_profile(recorded)


def test_table_lists_kernels_slowest_first(recorded):
    profile = ForwardProfile.from_dict(recorded)
    text = format_profile(profile, budget=10_000)
    rows = [line for line in text.splitlines() if line[:2] in {f"{i} " for i in range(1, 10)}]
    ordered = sorted(profile.kernels, key=lambda k: -k.total_ms)
    assert len(rows) == min(5, len(ordered))
    for row, kernel in zip(rows, ordered):
        assert kernel.name[:40] in row
    assert "Top kernels by GPU time per forward" in text


def test_memory_and_compute_bound_kernels_get_their_hint(recorded):
    profile = ForwardProfile.from_dict(recorded)
    text = format_profile(profile, budget=10_000)
    memory = max(profile.kernels, key=lambda k: k.metrics.get(DRAM, 0))

    def busy(k):  # the FP32/FMA pipe, or the SM as a whole when the recording has it
        return max(k.metrics.get(FMA, 0), k.metrics.get(SM, 0))

    compute = max(profile.kernels, key=busy)
    assert memory.metrics[DRAM] >= 60 and busy(compute) >= 60
    assert any("memory-bound" in h for h in hints(memory, profile))
    assert any("compute-bound" in h for h in hints(compute, profile))
    assert f"DRAM throughput {memory.metrics[DRAM]:.0f}% of peak: memory-bound" in text
    assert "compute-bound" in text
    # the chip's missing metric is reported as such, with the reason
    assert "memory_dependency" in text or "stall memory dep." in text


@pytest.mark.parametrize("budget", [300, 600, 1000, 1500, 2000, 3000, 6000])
def test_text_stays_within_budget(recorded, budget):
    text = format_profile(recorded, budget=budget)
    assert len(text) <= budget
    assert text.startswith("GPU: ")


def test_bigger_budget_shows_more(recorded):
    small = format_profile(recorded, budget=1200)
    large = format_profile(recorded, budget=8000)
    assert len(large) > len(small)
    assert "metrics:" in large
    # the slowest kernel's hints survive a tight budget
    top = max(ForwardProfile.from_dict(recorded).kernels, key=lambda k: k.total_ms)
    first_hint = hints(top)[0]
    assert first_hint in format_profile(recorded, budget=1600)


def test_without_counters_the_text_says_why(recorded):
    degraded = copy.deepcopy(recorded)
    degraded["reason"] = (
        "insufficient_privileges: cuptiRangeProfilerEnable failed: ... "
        "NVreg_RestrictProfilingToAdminUsers=1"
    )
    degraded["passes"] = 0
    for k in degraded["kernels"]:
        k["unavailable"] = {m: "no hardware counters" for m in k["metrics"]}
        k["metrics"] = {m: v for m, v in k["metrics"].items() if m.startswith("launch__")}
        k["roofline"] = None
        if k["occupancy"]:
            k["occupancy"]["achieved_pct"] = None
    text = format_profile(degraded, budget=4000)
    assert "Hardware metrics unavailable (insufficient_privileges" in text
    assert "NVreg_RestrictProfilingToAdminUsers" in text
    assert "timing and static facts only" in text
    assert "memory-bound" not in text  # no counters, no claim
    profile = ForwardProfile.from_dict(degraded)
    assert all(k.registers_per_thread > 0 for k in profile.kernels)


def _kernel(**kwargs) -> KernelProfile:
    base = {
        "name": "k",
        "launches": 1,
        "time_ms": 0.1,
        "total_ms": 0.1,
        "share": 1.0,
        "grid": (1024, 1, 1),
        "block": (256, 1, 1),
        "registers_per_thread": 32,
        "own": True,
    }
    base.update(kwargs)
    k = KernelProfile(**base)
    if k.occupancy is None:
        k.occupancy = occupancy(k.registers_per_thread, 256, k.static_shared_bytes)
    return k


def test_static_hints_without_metrics():
    small_grid = _kernel(grid=(16, 1, 1))
    assert any("grid of 16 blocks for 132 SMs" in h for h in hints(small_grid))
    heavy = _kernel(registers_per_thread=128)
    assert any("theoretical occupancy 25%" in h and "128 registers" in h for h in hints(heavy))
    spilling = _kernel(local_bytes_per_thread=64, spill_store_bytes=48, spill_load_bytes=48)
    assert any("spills 48 B stored" in h for h in hints(spilling))
    plain = _kernel()
    assert hints(plain) == []


def test_metric_hints():
    barrier = _kernel(
        metrics={
            "smsp__warp_issue_stalled_barrier_per_warp_active.pct": 45.0,
            "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": 30.0,
            "smsp__sass_average_branch_targets_threads_uniform.pct": 70.0,
        }
    )
    found = hints(barrier)
    assert any("__syncthreads (barrier 45%)" in h for h in found)
    assert not any("long_scoreboard" in h for h in found)  # only the worst stall
    assert any("70% of branch targets" in h for h in found)
    idle = _kernel(metrics={DRAM: 10.0, FMA: 5.0})
    assert any("latency-bound" in h for h in hints(idle))
    lib = _kernel(own=False, share=0.5)
    assert any("library" in h for h in hints(lib))


def test_format_value_units():
    assert format_value(DRAM, 91.64) == "91.6%"
    assert format_value("dram__bytes_read.sum", 268435456) == "268 MB"
    assert format_value("dram__bytes.sum.per_second", 3.89e12) == "3.89 TB/s"
    assert format_value("launch__registers_per_thread", 38.0) == "38"
    assert format_value("gpu__time_duration.sum", 103500.0) == "0.1035 ms"
    assert format_value("sm__inst_executed.sum", 306184192.0) == "3.062e+08"


def test_empty_profile_is_explained():
    empty = ForwardProfile(device="NVIDIA H200", chip=None, kernels=[], reason="another_subscriber")
    text = format_profile(empty)
    assert "No kernel was recorded" in text and "another_subscriber" in text
