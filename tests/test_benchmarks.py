"""CPU checks of the benchmark scripts' own arithmetic and reports (their GPU runs are in
benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import profile_vs_ncu as pvn
import timing_precision as tp


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


@pytest.mark.parametrize("script", ["profile_vs_ncu.py", "eval_profile.py"])
def test_the_scripts_parse_their_options(script):
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0 and "--out" in out.stdout, out.stderr[-1500:]


# ---------------------------------------------------------------- timing_precision.py


def evaluation(rule, speedup, spread, seconds, eager_ms=0.05, status="ok", worker_s=None):
    return {"rule": rule, "status": status, "speedup": speedup, "spread": spread,
            "seconds": seconds, "eager_ms": eager_ms, "candidate_ms": eager_ms, "runs": 40,
            "basis": "graph", "worker_s": worker_s}  # fmt: skip


def test_timing_precision_candidates_span_examples_sizes_and_llm_kernels():
    every = tp.candidates(quick=False)
    names = [c.name for c in every]
    assert len(every) >= 24 and len(set(names)) == len(names)
    llm = [c for c in every if c.origin == "llm"]
    assert len(llm) >= 10 and all("class ModelNew" in c.source for c in llm)
    assert {c.name.rsplit("/", 1)[1] for c in every if c.origin == "example"} == {
        "small", "middle", "default"}  # fmt: skip
    assert len(tp.candidates(quick=True)) == len(tp.QUICK) + tp.QUICK_LLM
    halves = tp.candidates(False, part="1/2") + tp.candidates(False, part="2/2")
    assert sorted(c.name for c in halves) == sorted(names)


def test_timing_precision_rows_and_goals():
    steady = [evaluation("old", 2.0, 0.05, 1.0), evaluation("new", 2.0, 0.01, 1.2),
              evaluation("old", 2.2, 0.04, 1.0), evaluation("new", 2.02, 0.012, 1.3)]  # fmt: skip
    row = tp.row(steady)
    assert row["ok"] and row["forward_ms"] == 0.05 and row["spread_new"] == 0.012
    assert row["speedup_gap_old"] == pytest.approx(abs(2.0 / 2.2 - 1))
    assert row["seconds_ratio"] == pytest.approx(1.25)
    assert row["least_seconds_ratio"] == pytest.approx(1.2)  # 1.2 s new, 1.0 s old at least
    short = [evaluation(e["rule"], e["speedup"], 0.3, 1.0, eager_ms=0.005) for e in steady]
    failed = [evaluation("old", None, None, 1.0, status="incorrect")] + steady[1:]
    entries = [{"name": "steady", "row": row}, {"name": "short", "row": tp.row(short)},
               {"name": "failed", "row": tp.row(failed)}]  # fmt: skip
    assert not entries[2]["row"]["ok"] and "incorrect" in entries[2]["row"]["status"]
    goals = {(g["rule"], g["goal"].split()[0]): g for g in tp.goals(entries)}
    # the 5 us forward's 30% spread is below the 20 us line of the spread goal
    assert goals[("new", "spread")]["met"] and not goals[("old", "spread")]["met"]
    assert goals[("new", "the")]["met"] and not goals[("old", "the")]["met"]
    seconds = goals[("new", "evaluation")]
    assert seconds["met"] and "1.25x (steady)" in seconds["detail"]
    assert "the least evaluation of each rule: worst 1.20x (steady), 0 of 2 outside" in (
        seconds["detail"])  # fmt: skip
    text = tp.markdown(
        {"device": "H200", "trials": 2, "entries": entries, "goals": tp.goals(entries)}
    )
    assert "| steady | 0.0500 | graph | 5.00% | 1.20% | 2.000 / 2.200 | 2.000 / 2.020 |" in text
    assert "| failed | incorrect, ok |" in text
    assert "spread under 2% for every forward of 20 us or more: **met**" in text


def test_timing_precision_counts_the_time_inside_the_worker_apart_from_the_wait_for_one():
    # the new rule's evaluations waited 2 s for a fresh worker; inside it they took 1.3x
    waited = [evaluation("old", 2.0, 0.01, 1.0, worker_s=0.8),
              evaluation("new", 2.0, 0.01, 3.0, worker_s=1.0),
              evaluation("old", 2.0, 0.01, 1.0, worker_s=0.8),
              evaluation("new", 2.0, 0.01, 3.2, worker_s=1.08)]  # fmt: skip
    row = tp.row(waited)
    assert row["seconds_ratio"] == pytest.approx(3.1) and row["worker_ratio"] == pytest.approx(1.3)
    goal = next(g for g in tp.goals([{"name": "w", "row": row}]) if "evaluation" in g["goal"])
    assert not goal["met"]  # the goal line stays on the whole evaluation
    assert (
        "inside the worker (no wait for a fresh worker): worst 1.30x (w), 0 of 1" in goal["detail"]
    )
    unrecorded = tp.row([dict(e, worker_s=None) for e in waited])
    assert "worker_ratio" not in unrecorded


def test_timing_precision_runs_end_to_end_on_a_cpu(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "timing_precision.py"), "--device", "cpu", "--only",
         "l1_088_gelu/small", "--trials", "1", "--out", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "timing_precision.json").read_text())
    (entry,) = report["entries"]
    assert [e["rule"] for e in entry["evaluations"]] == list(tp.ORDER)
    assert all(e["status"] == "ok" for e in entry["evaluations"]), entry["evaluations"]
    new = [e for e in entry["evaluations"] if e["rule"] == "new"]
    assert all(e["runs"] >= 6 and e["stop"] in ("precision", "budget", "max_runs") for e in new)
    assert {e["stop"] for e in entry["evaluations"] if e["rule"] == "old"} == {"fixed"}
    assert len(report["goals"]) == 5 and "goal (new rule)" in done.stdout
    again = tp.merged([tmp_path, tmp_path])
    assert len(again["entries"]) == 2


def test_timing_precision_attribution_table():
    stats = {"median_us": 3.2, "spread": 0.041, "p5_us": 3.0, "p95_us": 9.5, "runs": 1000,
             "iqr_us": 0.13, "spread_of_means_of_4": 0.012, "lag1_correlation": 0.25}  # fmt: skip
    report = {"flush": "write 4x L2, then discard", "nvml_clock_mhz": "unavailable: ModuleNotFoundError",
              "conditions": {"tiny (1 MB)": {tp.CONDITIONS["idle"]: stats}},
              "clock": {"tiny (1 MB)": {"min_mhz": 1755.0, "median_mhz": 1980.0, "max_mhz": 1980.0,
                                        "samples": 100, "time_vs_clock_correlation": -0.31}}}  # fmt: skip
    text = "\n".join(tp.attribution_lines(report))
    assert "| tiny (1 MB) | synchronized before each: the GPU idle at launch" in text
    assert "| 3.20 | 4.10% | 0.13 | 3.00 | 9.50 | 1.20% | +0.25 |" in text
    assert "1755-1980 MHz, median 1980; correlation of run time with it: -0.31" in text
    assert tp._correlation([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert tp._correlation([1.0, 1.0, 1.0], [2.0, 4.0, 6.0]) is None


def test_gpu_activity_names_processes_and_summarizes_samples():
    import os

    import gpu_activity as ga
    import torch

    assert ga.role_of(os.getpid()) == "this process"
    worker = "/venv/bin/python -m cudaforge.harness.worker 17 25 28 29 1"
    assert ga.role_of(11, worker, own_pid=1) == "worker (17 25 28 29 1)"
    assert ga.role_of(12, "python -m cudaforge.harness.reference_process 14 0",
                      own_pid=1) == "reference process (14 0)"  # fmt: skip
    assert ga.role_of(2**22 + 7, own_pid=1) == "gone"  # no such process
    rows = ga.summarize([(11, 90, 40), (12, 5, 1), (11, 70, 30), (12, 0, 0)],
                        {11: "worker", 12: "reference process"})  # fmt: skip
    assert [r["pid"] for r in rows] == [11, 12]
    assert rows[0] == {"pid": 11, "role": "worker", "samples": 2, "sm_max": 90, "sm_mean": 80.0,
                       "mem_max": 40}  # fmt: skip
    assert rows[1]["sm_mean"] == 2.5
    with ga.GpuActivity(period=0.01) as activity:
        pass
    if not torch.cuda.is_available():  # no NVML device here: nothing sampled, and it says why
        assert activity.unavailable and activity.summary() == []


def test_timing_precision_attribution_stats_say_what_averaging_would_hide():
    # runs alternating 1.0 and 1.2 ms: a wide spread, anti-correlated neighbours, and means of
    # four that do not move at all
    times = [1.0, 1.2] * 40
    s = tp._stats(times)
    assert s["spread"] == pytest.approx(0.2 / 1.1) and s["iqr_us"] == pytest.approx(200.0)
    assert s["spread_of_means_of_4"] == pytest.approx(0.0, abs=1e-12)
    assert s["lag1_correlation"] == pytest.approx(-1.0)
    drifting = [1.0 + 0.01 * i for i in range(80)]  # a slow drift: neighbours agree
    assert tp._stats(drifting)["lag1_correlation"] > 0.99


def test_models_optimize_counts_the_child_processes_and_their_cpu():
    pytest.importorskip("torch")
    # in a process of its own, so that no other test's workers come or go meanwhile
    script = (
        "import subprocess, sys, time\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import models_optimize\n"
        "count, _ = models_optimize._children_cpu_s()\n"
        "busy = subprocess.Popen([sys.executable, '-c', 'import time\\nt = time.time()\\n"
        "while time.time() - t < 0.8: pass'])\n"
        "time.sleep(0.6)\n"
        "more, cpu = models_optimize._children_cpu_s()\n"
        "busy.wait()\n"
        "print(count, more, cpu)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    count, more, cpu = out.stdout.split()
    assert (int(count), int(more)) == (0, 1) and float(cpu) >= 0.2, out.stdout


def test_host_drift_samples_each_phase_with_what_the_machine_says(tmp_path):
    pytest.importorskip("torch")
    import host_drift

    assert host_drift.main(["--model", "mlp", "--small", "--seconds", "0.2", "--every", "0.05",
                            "--out", str(tmp_path)]) == 0  # fmt: skip
    rows = json.loads((tmp_path / "host_drift.json").read_text())["rows"]
    assert {r["phase"] for r in rows} == {"alone", "pool started", "pool closed"}
    assert all(r["host_ms"] > 0 and r["threads"] >= 1 and 0 <= (r["steal"] or 0) <= 1 for r in rows)
    before = {"user": 10, "nice": 0, "system": 5, "idle": 80, "iowait": 0, "irq": 0, "softirq": 0,
              "steal": 5}  # fmt: skip
    after = {**before, "user": 40, "steal": 15}  # 40 ticks passed, 10 of them stolen
    assert host_drift.steal_share(before, after) == pytest.approx(0.25)


def test_models_optimize_gives_each_speedup_over_eager_with_its_interval():
    pytest.importorskip("torch")
    import models_optimize

    eager = [4.0 + 0.01 * (i % 7) for i in range(30)]  # 4.00-4.06 ms
    samples = {"eager": eager, "fast": [t / 1.25 for t in eager], "few": [2.0, 2.0]}
    found = models_optimize.speedups_over("eager", samples)
    assert set(found) == {"fast", "few"}
    fast = found["fast"]
    assert fast["speedup"] == pytest.approx(1.25) and fast["low"] < 1.25 < fast["high"]
    assert fast["high"] / fast["low"] < 1.05  # runs this steady bound it closely
    assert found["few"]["low"] is None and found["few"]["speedup"] == pytest.approx(2.01, abs=0.02)


def test_models_optimize_for_compile_writes_the_masked_attention_problems_first_prompt(tmp_path):
    pytest.importorskip("transformers.masking_utils")
    out = subprocess.run(
        [sys.executable, str(BENCH / "models_optimize.py"), "gpt2", "--for-compile", "--small",
         "--rounds", "1", "--llm", f"file:{tmp_path / 'llm'}?wait=0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "CUDAFORGE_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert out.returncode == 4, out.stderr[-3000:]  # waiting for the Coder's first reply
    (prompt,) = (tmp_path / "llm").glob("*scaled_dot_product_attention/coder-r1-l0.prompt.md")
    text = prompt.read_text()
    assert "attn_mask = attention_mask" in text
    assert "torch.tril(torch.ones((32, 32), dtype=torch.bool)).expand((2, 1, 32, 32))" in text
    # SDPA's output is a (B, H, L, D) view of (B, L, H, D) memory: the prompt says so
    assert "is kept with strides (2048, 16, 64, 1)" in text and ".permute(0, 2, 1, 3)" in text
    report = json.loads((tmp_path / "gpt2-for-compile.json").read_text())
    assert report["for_compile"] and len(report["hotspots"]) == 1
