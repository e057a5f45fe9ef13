"""CPU checks of the benchmark scripts' own arithmetic and reports (their GPU runs are in
benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
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


def test_the_report_gives_medians_ranges_and_each_flush_method():
    row = {"kernel": "relu", "metric": "dram__bytes_write.sum", "ours": 44.9, "ncu": 47.3,
           "ok": False}  # fmt: skip
    kernel = {
        "name": "relu",
        "latency": {"ours_s": 0.2, "range_profiler_s": 0.19, "ncu_s": 6.0, "speedup": 30.0},
        "fidelity": [row],
        "fidelity_by_flush": {"read": [{**row, "ours": 45.0}]},
        "ours_ranges": {"dram__bytes_write.sum": [44.7, 45.1]},
        "ncu_ranges": {"dram__bytes_write.sum": [47.1, 47.4]},
    }
    summary = {"compared": 1, "within": 0, "failing": ["relu: dram__bytes_write.sum"],
               "median_speedup": 30.0,
               "with the read flush": {"compared": 1, "within": 0, "failing": ["relu: x"]}}  # fmt: skip
    report = {"device": "H200", "ncu_version": "2025.3", "ncu_cache_control": "all",
              "l2_flush": "d", "repeats": 3, "ncu_repeats": 3,
              "l2_flush_methods": ["discard", "read"],
              "l2_flush_descriptions": {"discard": "d", "read": "r"},
              "kernels": [kernel], "summary": summary}  # fmt: skip
    text = pvn.markdown(report)
    assert "median of 3 profiles; ncu: median of 3 run(s)" in text
    assert "| relu | dram__bytes_write.sum | 44.9 | 47.3 | **no** | 44.7-45.1 | 47.1-47.4 |" in text
    assert "- discard (d): 0 of 1 within; outside: relu: dram__bytes_write.sum" in text
    assert "- read (r): 0 of 1 within; outside: relu: x" in text
    assert "| relu | dram__bytes_write.sum | 47.3 | 44.9 (**no**) | 45 (**no**) |" in text


def test_the_same_flush_comparison_replaces_only_the_dram_byte_rows():
    fidelity = [
        {"kernel": "relu", "metric": "dram__bytes_write.sum", "ours": 44.9, "ncu": 47.3, "ok": False},
        {"kernel": "relu", "metric": "dram__bytes_read.sum", "ours": 67.1, "ncu": 67.2, "ok": True},
        {"kernel": "relu", "metric": "lts__t_sector_hit_rate.pct", "ours": 50.0, "ncu": 58.0,
         "ok": False},
    ]  # fmt: skip
    rows = pvn.same_flush_rows("relu", fidelity, {"dram__bytes_write.sum": 45.0})
    assert [(r["metric"], r["ncu"], r["ok"]) for r in rows] == [
        ("dram__bytes_write.sum", 45.0, True), ("dram__bytes_read.sum", None, None)]  # fmt: skip
    summary = pvn.with_rows([{"fidelity": fidelity, "same_flush": {"rows": rows}}], "same_flush")
    # the write count now agrees; the read count lost its ncu value; the hit rate is untouched
    assert summary == {"compared": 2, "within": 1, "failing": ["relu: lts__t_sector_hit_rate.pct"]}
    assert pvn.summarize(fidelity)["within"] == 1


def test_the_report_tables_the_same_flush_values():
    row = {"kernel": "relu", "metric": "dram__bytes_write.sum", "ours": 44.9, "ncu": 47.3,
           "ok": False}  # fmt: skip
    again = {**row, "ncu": 45.1, "ok": True}
    kernel = {"name": "relu", "fidelity": [row],
              "latency": {"ours_s": 0.2, "range_profiler_s": 0.19},
              "same_flush": {"rows": [again], "ranges": {row["metric"]: [45.0, 45.2]}}}  # fmt: skip
    summary = {**pvn.summarize([row]), "median_speedup": None,
               "same flush": pvn.with_rows([kernel], "same_flush")}  # fmt: skip
    report = {"device": "H200", "ncu_version": "2025.3", "ncu_cache_control": "all",
              "l2_flush": "d", "l2_flush_methods": ["discard"], "kernels": [kernel],
              "summary": summary}  # fmt: skip
    text = pvn.markdown(report)
    assert "| relu | dram__bytes_write.sum | 44.9 | 47.3 | 45.1 | yes | 45-45.2 |" in text
    assert "counts: 1 of 1 compared values within tolerance; outside: none." in text
    assert "Summary: 0 of 1 compared values within tolerance" in text


def test_net_write_counts_subtract_each_tools_baseline():
    fidelity = [{"kernel": "relu", "metric": "dram__bytes_write.sum", "ours": 44.86e6,
                 "ncu": 47.27e6, "ok": False}]  # fmt: skip
    baseline = {"name": "read_sum", "ours": 0.24e6, "ncu": 2.40e6, "ours_range": [0.15e6, 0.34e6],
                "ncu_range": [2.39e6, 2.40e6]}  # fmt: skip
    rows = pvn.net_rows("relu", fidelity, baseline)
    assert [(r["ours"], r["ncu"], r["ok"]) for r in rows] == [
        (pytest.approx(44.62e6), pytest.approx(44.87e6), True)]  # fmt: skip
    assert pvn.net_rows("relu", fidelity, {**baseline, "ncu": 0.0})[0]["ok"] is False
    kernel = {"name": "relu", "fidelity": fidelity, "net": {"rows": rows},
              "latency": {"ours_s": 0.2, "range_profiler_s": 0.19}}  # fmt: skip
    summary = {**pvn.summarize(fidelity), "median_speedup": None,
               "net of the baseline": pvn.with_rows([kernel], "net")}  # fmt: skip
    report = {"device": "H200", "ncu_version": "2025.3", "ncu_cache_control": "all",
              "l2_flush": "d", "l2_flush_methods": ["discard"], "kernels": [kernel],
              "summary": summary, "baseline": baseline}  # fmt: skip
    text = pvn.markdown(report)
    assert "cudaforge 240000 (150000-340000), ncu 2.4e+06 (2.39e+06-2.4e+06)" in text
    assert "| relu | 4.462e+07 | 4.487e+07 | yes |" in text
    assert "net write counts: 1 of 1 compared values within tolerance; outside: none." in text


def test_a_saved_report_is_reanalyzed_with_net_counts_for_large_kernels_only(tmp_path):
    def kernel(name, min_bytes, ours, theirs):
        row = {"kernel": name, "metric": "dram__bytes_write.sum", "ours": ours, "ncu": theirs,
               "ok": pvn.close("dram__bytes_write.sum", ours, theirs)}  # fmt: skip
        return {"name": name, "profile": {"min_bytes": min_bytes}, "fidelity": [row],
                "latency": {"ours_s": 0.2, "range_profiler_s": 0.19}}  # fmt: skip

    report = {"device": "H200", "ncu_version": "2025.3", "ncu_cache_control": "all",
              "l2_flush": "d", "l2_flush_methods": ["discard"],
              "kernels": [kernel("relu", 134e6, 44.89e6, 47.35e6),
                          kernel("matmul", 12e6, 0.0, 0.0)],
              "baseline": {"name": "read_sum", "ours": 0.34e6, "ncu": 2.40e6,
                           "ours_range": [0.2e6, 0.4e6], "ncu_range": [2.39e6, 2.4e6]},
              "summary": {"median_speedup": 37.4}}  # fmt: skip
    saved = tmp_path / "in.json"
    saved.write_text(json.dumps(report))
    args = [sys.executable, str(BENCH / "profile_vs_ncu.py"), "--from-json", str(saved),
            "--out", str(tmp_path / "out")]  # fmt: skip
    run = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2 and "--l2-bytes" in run.stderr
    run = subprocess.run([*args, "--l2-bytes", str(60 << 20)], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-1500:]
    again = json.loads((tmp_path / "out" / "profile_vs_ncu.json").read_text())
    assert again["summary"]["within"] == 1  # raw: relu is 5.2% under ncu
    assert [("net" in k) for k in again["kernels"]] == [True, False]  # matmul spans 12 MB
    assert again["summary"]["net of the baseline"]["within"] == 2
    assert "| relu | 4.455e+07 | 4.495e+07 | yes |" in run.stdout


@pytest.mark.parametrize("content", [None, "{not json"])
def test_reanalysis_of_a_missing_or_broken_file_says_so(tmp_path, content):
    saved = tmp_path / "in.json"
    if content is not None:
        saved.write_text(content)
    run = subprocess.run([sys.executable, str(BENCH / "profile_vs_ncu.py"), "--from-json",
                          str(saved), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert run.returncode == 2 and f"cannot read {saved}" in run.stderr, run.stderr[-1500:]
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["profile_vs_ncu.py", "dram_writes.py"])
def test_the_scripts_parse_their_options(script):
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0 and "--out" in out.stdout, out.stderr[-1500:]
