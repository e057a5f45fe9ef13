"""CPU checks of the benchmark scripts' own arithmetic and reports (their GPU runs are in
benchmarks/RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import profile_vs_ncu as pvn


def test_medians_and_ranges_per_metric():
    runs = [{"a": 1.0, "b": 10.0}, {"a": 3.0}, {"a": 2.0, "b": 30.0}]
    assert pvn.median_values(runs) == {"a": 2.0, "b": 20.0}
    assert pvn.value_ranges(runs) == {"a": [1.0, 3.0], "b": [10.0, 30.0]}


def test_median_profile_keeps_the_named_kernel_and_medians_its_metrics():
    def result(value):
        kernels = [SimpleNamespace(name="relu", metrics={"m": value}),
                   SimpleNamespace(name="other", metrics={"m": 99.0})]  # fmt: skip
        return SimpleNamespace(kernels=kernels)

    profile, ranges = pvn.median_profile([result(5.0), result(1.0), result(4.0)], "relu")
    assert [k.name for k in profile.kernels] == ["relu"]
    assert profile.kernels[0].metrics == {"m": 4.0} and ranges == {"m": [1.0, 5.0]}


@pytest.mark.parametrize(
    "metric, ours, theirs, ok",
    [
        ("dram__bytes_write.sum", 95.0, 100.0, True),
        ("dram__bytes_write.sum", 94.0, 100.0, False),
        ("lts__t_sector_hit_rate.pct", 89.5, 88.6, True),  # within 1 point
        ("lts__t_sector_hit_rate.pct", 94.1, 88.7, False),
        ("dram__bytes_write.sum", 0.0, 0.0, True),
    ],
)
def test_tolerance(metric, ours, theirs, ok):
    assert pvn.close(metric, ours, theirs) is ok


def test_the_report_gives_medians_and_ranges():
    row = {"kernel": "relu", "metric": "dram__bytes_write.sum", "ours": 44.9, "ncu": 47.3,
           "ok": False}  # fmt: skip
    kernel = {
        "name": "relu",
        "latency": {"ours_s": 0.2, "range_profiler_s": 0.19, "ncu_s": 6.0, "speedup": 30.0},
        "fidelity": [row],
        "ours_ranges": {"dram__bytes_write.sum": [44.7, 45.1]},
        "ncu_ranges": {"dram__bytes_write.sum": [47.1, 47.4]},
    }
    summary = {"compared": 1, "within": 0, "failing": ["relu: dram__bytes_write.sum"],
               "median_speedup": 30.0}  # fmt: skip
    report = {"device": "H200", "ncu_version": "2025.3", "ncu_cache_control": "all",
              "l2_flush": "d", "repeats": 3, "ncu_repeats": 3,
              "kernels": [kernel], "summary": summary}  # fmt: skip
    text = pvn.markdown(report)
    assert "median of 3 profiles; ncu: median of 3 run(s)" in text
    assert "| relu | dram__bytes_write.sum | 44.9 | 47.3 | **no** | 44.7-45.1 | 47.1-47.4 |" in text
    assert "Summary: 0 of 1 compared values within tolerance" in text


def test_the_summary_counts_the_compared_values_within_tolerance():
    fidelity = [
        {"kernel": "relu", "metric": "dram__bytes_write.sum", "ours": 44.9, "ncu": 47.3, "ok": False},
        {"kernel": "relu", "metric": "dram__bytes_read.sum", "ours": 67.1, "ncu": 67.2, "ok": True},
        {"kernel": "relu", "metric": "lts__t_sector_hit_rate.pct", "ours": 50.0, "ncu": 58.0,
         "ok": False},
    ]  # fmt: skip
    assert pvn.summarize(fidelity)["within"] == 1


@pytest.mark.parametrize("script", ["profile_vs_ncu.py"])
def test_the_scripts_parse_their_options(script):
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0 and "--out" in out.stdout, out.stderr[-1500:]
