"""Benchmark: timings users can trust (issue 20). Every candidate is evaluated four times in one
run, old rule and new rule alternating (old, new, old, new):

- old: `timing_rule="fixed", cuda_graphs=False, host_ahead=False`: 100 runs of the candidate,
  then 100 of the reference, eager (the rule before adaptive timing);
- new: the defaults: runs interleaved A/B/B/A until the median's 95% interval is within 1%
  (2 s per side at most, 20-250 runs), each eager run queued behind a spin longer than the
  host's time to issue it, CUDA-graph replays for forwards under 50 us.

Candidates: the hand-written kernels of cudaforge/examples/ on their dev problems at small,
middle and default sizes (18), and the last correct kernel an LLM wrote for each problem in the
recorded agent runs (benchmarks/runs/*/results_transcripts/, at the sizes they were written for:
15; `--every-llm-kernel` takes all 45 recorded now): 33 candidates from ~4 us to ~9 ms. Prints
a table (forward ms, spread old/new, speedup run 1/run 2 old/new, eval seconds old/new) and the
issue's goal lines as met / not met; writes timing_precision.json and timing_precision.md to
--out (after every candidate, so a cut run keeps what it measured).

First (`--no-attribute` skips it, `--attribute-only` does only it) it measures where the spread
of a short forward comes from, on one tiny and one 0.1 ms kernel, outside the harness: back-to-back
launches, the L2 flush, fresh inputs, a GPU idle at launch (launch latency in the window), the
forward allocating its output, a Python forward, a graph replay; and the SM clock during the
runs, read by a kernel (clock64 over %globaltimer) with no nvidia-smi.

    python benchmarks/timing_precision.py --out $OUT/timing                # on the H200
    python benchmarks/timing_precision.py --quick --out $OUT/timing        # 8 candidates, ~2 min
    python benchmarks/timing_precision.py --part 1/2 --out $OUT/t1         # split across calls
    python benchmarks/timing_precision.py --part 2/2 --no-attribute --out $OUT/t2
    python benchmarks/timing_precision.py --merge $OUT/t1 $OUT/t2 --out $OUT/timing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "cudaforge" / "examples"
RUNS = HERE / "runs"
sys.path.insert(0, str(HERE.parent))

from cudaforge.harness.problem import Problem

OLD = {"timing_rule": "fixed", "cuda_graphs": False, "host_ahead": False}
NEW = {"timing_rule": "adaptive"}  # the defaults on a GPU
CPU_BYTES = 1 << 20  # --device cpu: problems shrunk to this, each timed against itself
ORDER = ("old", "new", "old", "new")

# example kernel, dev problem, {size label: overrides}; "default" is the problem's own size
EXAMPLE_CASES = [
    ("l1_012_diag_matmul", 1, 12, {"small": {"M": 512, "N": 512}, "default": {}}),
    ("l1_019_relu", 1, 19, {"small": {"batch_size": 16, "dim": 16384}, "middle": {"dim": 16384},
                            "default": {}}),
    ("l1_023_softmax", 1, 23, {"small": {"batch_size": 16, "dim": 16384},
                               "middle": {"dim": 16384}, "default": {}}),
    ("l1_036_rmsnorm", 1, 36, {"small": {"batch_size": 1}, "middle": {"batch_size": 16},
                               "default": {}}),
    ("l1_088_gelu", 1, 88, {"small": {"batch_size": 256}, "default": {}}),
    ("l2_001_conv_relu_bias", 2, 1, {"small": {"batch_size": 2}, "middle": {"batch_size": 32},
                                     "default": {}}),
    ("l2_076_gemm_add_relu", 2, 76, {"small": {"batch_size": 16}, "default": {}}),
]  # fmt: skip
QUICK = ("l1_019_relu/small", "l1_088_gelu/small", "l1_012_diag_matmul/default",
         "l1_036_rmsnorm/small", "l1_019_relu/middle", "l2_076_gemm_add_relu/default")  # fmt: skip
QUICK_LLM = 2


@dataclass
class Candidate:
    name: str
    origin: str  # "example" or "llm"
    problem: Problem
    source: str
    sizes: dict = field(default_factory=dict)


def example_candidates() -> list[Candidate]:
    out = []
    for example, level, pid, sizes in EXAMPLE_CASES:
        source = (EXAMPLES / f"{example}.py").read_text()
        for label, overrides in sizes.items():
            problem = Problem.from_dev_set(level, pid, sizes=overrides or None)
            out.append(Candidate(f"{example}/{label}", "example", problem, source, overrides))
    return out


def llm_candidates(runs: Path = RUNS, every: bool = False) -> list[Candidate]:
    """The correct kernels in the recorded agent runs' transcripts, once per source: the last
    one recorded for each problem (runs in name order, rounds in order), or `every` one."""
    out, seen = [], set()
    for path in sorted(runs.glob("*/results_transcripts/*/*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        start = next((r for r in records if r.get("kind") == "start"), None)
        if start is None or not start.get("problem_source"):
            continue
        for r in records:
            result = r.get("result") or {}
            source = r.get("source")
            if r.get("kind") != "eval" or result.get("status") != "ok" or not source:
                continue
            digest = hashlib.sha256(source.encode()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            problem = Problem.from_source(start["problem_source"], name=start.get("problem"))
            name = f"llm:{path.parts[-4]}/{start.get('problem')}/r{r.get('round')}"
            out.append(Candidate(name, "llm", problem, source))
    if every:
        return out
    last = {c.problem.name: c for c in out}
    return [c for c in out if last[c.problem.name] is c]


def on_cpu(cand: Candidate) -> Candidate:
    """For a CPU smoke run: the problem shrunk, its own Model renamed ModelNew as the candidate."""
    problem = cand.problem.shrink(CPU_BYTES)
    source = re.sub(r"\bModel\b", "ModelNew", problem.source)
    return Candidate(cand.name, cand.origin, problem, source, cand.sizes)


def candidates(quick: bool, only: str = "", part: str = "", every_llm: bool = False):
    """The candidates of a run (module docstring), filtered by name and split into parts."""
    found = example_candidates()
    llm = llm_candidates(every=every_llm)
    if quick:
        found = [c for c in found if c.name in QUICK] + llm[:QUICK_LLM]
    else:
        found += llm
    if only:
        found = [c for c in found if any(part in c.name for part in only.split(","))]
    if part:
        k, n = (int(v) for v in part.split("/"))
        if not 1 <= k <= n:
            raise SystemExit(f"--part {part}: need 1 <= K <= N")
        found = found[k - 1 :: n]
    return found


# ====================================================================== evaluating


def one_evaluation(pool, cand: Candidate, rule: str, trials: int, **more) -> dict:
    from gpu_activity import GpuActivity

    options = {**(OLD if rule == "old" else NEW), **more}
    started = time.perf_counter()
    # on a machine without NVML it samples nothing and says why
    with GpuActivity() as activity:
        try:
            r = pool.evaluate(cand.problem, cand.source, trials=trials, **options)
        except Exception as e:  # noqa: BLE001 - a harness failure is a row, not the end of the run
            return {"rule": rule, "status": "error", "error": f"{type(e).__name__}: {e}"[:300],
                    "seconds": time.perf_counter() - started}  # fmt: skip
    seconds = time.perf_counter() - started
    t = r.timing
    eager = t.get("candidate_eager") or {}
    return {
        "rule": rule, "status": r.status, "error": r.error[:300], "seconds": seconds,
        "timing_s": r.phase_seconds.get("timing"), "candidate_ms": r.candidate_ms,
        "reference_ms": r.reference_ms, "speedup": r.speedup, "spread": r.candidate_spread,
        "reference_spread": r.reference_spread, "low_ms": r.candidate_low_ms,
        "high_ms": r.candidate_high_ms, "basis": t.get("speedup_basis"), "graph": t.get("graph"),
        "eager_ms": eager.get("median_ms"), "eager_spread": eager.get("spread"),
        "runs": eager.get("runs"), "stop": eager.get("stop"),
        "graph_stop": (t.get("candidate_graph") or {}).get("stop"),
        # every run's ms in order (where the spread comes from: drift, modes, outliers)
        "runs_ms": t.get("candidate_runs_ms"), "graph_runs_ms": t.get("candidate_graph_runs_ms"),
        "graph_runs": (t.get("candidate_graph") or {}).get("runs"),
        "settled": t.get("settled"), "retimed": t.get("retimed"),
        # the GPU's busy time (CUPTI) against the event time, and the host's time to issue
        "cupti_busy_ms": t.get("cupti_busy_ms"), "host_ms": t.get("candidate_host_ms"),
        "reference_cupti_busy_ms": t.get("reference_cupti_busy_ms"),
        "reference_host_ms": t.get("reference_host_ms"),
        "reference_eager_ms": (t.get("reference_eager") or {}).get("median_ms"),
        # where the evaluation's time went: its phases, the timing phase's parts, the captures
        "phases": r.phase_seconds, "timing_parts": t.get("phase_s"),
        "graph_capture_s": t.get("graph_capture_s"),
        "graph_capture_parts": t.get("graph_capture_parts"),
        # the worker's own phases: "total" adds the wait for a fresh worker and the reference
        "worker_s": sum(v for k, v in r.phase_seconds.items() if k != "total") or None,
        # which processes had SM time during the evaluation (NVML), for a disturbed one
        "gpu_processes": activity.summary(), "gpu_activity": activity.unavailable or "sampled",
    }  # fmt: skip


def evaluate_candidate(pool, cand: Candidate, trials: int, **more) -> dict:
    evaluations = [one_evaluation(pool, cand, rule, trials, **more) for rule in ORDER]
    return {"name": cand.name, "origin": cand.origin, "sizes": cand.sizes,
            "evaluations": evaluations, "row": row(evaluations)}  # fmt: skip


def row(evaluations: list[dict]) -> dict:
    """One table row from a candidate's four evaluations (ORDER)."""
    by = {rule: [e for e in evaluations if e["rule"] == rule] for rule in ("old", "new")}
    ok = all(e["status"] == "ok" for e in evaluations)
    out: dict = {"ok": ok, "status": ", ".join(sorted({e["status"] for e in evaluations}))}
    if not ok:
        return out
    new_eager = [e["eager_ms"] or e["candidate_ms"] for e in by["new"]]
    out["forward_ms"] = statistics.median(new_eager)
    out["basis"] = by["new"][0]["basis"]
    for rule, runs in by.items():
        out[f"spread_{rule}"] = max(e["spread"] or 0.0 for e in runs)
        s1, s2 = (e["speedup"] for e in runs)
        out[f"speedups_{rule}"] = [s1, s2]
        out[f"speedup_gap_{rule}"] = abs(s1 / s2 - 1) if s1 and s2 else math.inf
        out[f"seconds_{rule}"] = statistics.fmean(e["seconds"] for e in runs)
        # the least of a rule's evaluations: a wait for a fresh worker process, which comes at
        # random to either rule, adds seconds to one evaluation; the timing phase alone
        out[f"least_seconds_{rule}"] = min(e["seconds"] for e in runs)
        out[f"timing_s_{rule}"] = statistics.fmean(e.get("timing_s") or 0.0 for e in runs)
        out[f"runs_{rule}"] = [e["runs"] for e in runs]
        if all(e.get("worker_s") for e in runs):
            out[f"worker_s_{rule}"] = statistics.fmean(e["worker_s"] for e in runs)
    out["seconds_ratio"] = out["seconds_new"] / out["seconds_old"]
    out["least_seconds_ratio"] = out["least_seconds_new"] / out["least_seconds_old"]
    if out["timing_s_old"] > 0:
        out["timing_ratio"] = out["timing_s_new"] / out["timing_s_old"]
    if out.get("worker_s_old") and out.get("worker_s_new"):
        out["worker_ratio"] = out["worker_s_new"] / out["worker_s_old"]
    return out


# ====================================================================== goals and the report

SPREAD_GOAL, SPREAD_FLOOR_MS, SPEEDUP_GOAL, SECONDS_GOAL = 0.02, 0.020, 0.03, 1.5


def goals(entries: list[dict]) -> list[dict]:
    """The issue's three goals over the candidates measured correct in all four evaluations,
    for each rule: {"goal", "rule", "met", "worst", "detail"}."""
    rows = [(e["name"], e["row"]) for e in entries if e["row"].get("ok")]
    out = []
    for rule in ("old", "new"):
        long_enough = [(n, r) for n, r in rows if r["forward_ms"] >= SPREAD_FLOOR_MS]
        out.append(_goal(f"spread under {SPREAD_GOAL:.0%} for every forward of "
                         f"{SPREAD_FLOOR_MS * 1e3:.0f} us or more", rule, long_enough,
                         f"spread_{rule}", SPREAD_GOAL, "{:.2%}"))  # fmt: skip
        out.append(_goal(f"the two runs' speedups within {SPEEDUP_GOAL:.0%} of each other",
                         rule, rows, f"speedup_gap_{rule}", SPEEDUP_GOAL, "{:.2%}"))  # fmt: skip
    ratios = [r["seconds_ratio"] for _, r in rows]
    entry = _goal(f"evaluation time per candidate at most {SECONDS_GOAL:g}x the old rule's",
                  "new", rows, "seconds_ratio", SECONDS_GOAL, "{:.2f}x")  # fmt: skip
    if ratios:
        entry["detail"] += (
            f"; geometric mean {math.exp(statistics.fmean(map(math.log, ratios))):.2f}x"
        )
        for key, what in (("least_seconds_ratio", "the least evaluation of each rule"),
                          ("worker_ratio", "inside the worker (no wait for a fresh worker)"),
                          ("timing_ratio", "the timing phase alone")):  # fmt: skip
            values = [(n, r[key]) for n, r in rows if r.get(key) is not None]
            if values:
                name, worst = max(values, key=lambda nv: nv[1])
                outside = sum(1 for _, v in values if not v <= SECONDS_GOAL)
                entry["detail"] += (f"; {what}: worst {worst:.2f}x ({name}), {outside} of "
                                    f"{len(values)} outside")  # fmt: skip
    out.append(entry)
    return out


def _goal(text: str, rule: str, rows, key: str, bound: float, fmt: str) -> dict:
    if not rows:
        return {"goal": text, "rule": rule, "met": False, "worst": None,
                "detail": "no candidate measured"}  # fmt: skip
    name, r = max(rows, key=lambda nr: nr[1][key])
    failing = [n for n, x in rows if not x[key] <= bound]
    detail = f"worst {fmt.format(r[key])} ({name}); {len(failing)} of {len(rows)} outside"
    return {"goal": text, "rule": rule, "met": not failing, "worst": r[key], "detail": detail}


def markdown(report: dict) -> str:
    head = (
        f"Device: {report.get('device', '?')}; {len(report['entries'])} candidates; "
        f"trials {report.get('trials')}; order of the evaluations: {', '.join(ORDER)}."
    )
    columns = (
        "| candidate | forward ms | basis (new) | spread old | spread new | speedup old "
        "run 1 / run 2 | speedup new run 1 / run 2 | runs new | eval s old | eval s new |"
    )
    lines = [
        head,
        "",
        columns,
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for e in report["entries"]:
        r = e["row"]
        if not r.get("ok"):
            lines.append(f"| {e['name']} | {r['status']} | | | | | | | | |")
            continue
        so, sn = r["speedups_old"], r["speedups_new"]
        lines.append(
            f"| {e['name']} | {r['forward_ms']:.4f} | {r['basis']} | {r['spread_old']:.2%} | "
            f"{r['spread_new']:.2%} | {so[0]:.3f} / {so[1]:.3f} | {sn[0]:.3f} / {sn[1]:.3f} | "
            f"{'/'.join(str(x) for x in r['runs_new'])} | {r['seconds_old']:.2f} | "
            f"{r['seconds_new']:.2f} |"
        )
    lines.append("")
    for g in report["goals"]:
        verdict = "met" if g["met"] else "not met"
        lines.append(f"- goal ({g['rule']} rule): {g['goal']}: **{verdict}** ({g['detail']})")
    if report.get("attribution"):
        lines += ["", *attribution_lines(report["attribution"])]
    return "\n".join(lines) + "\n"


def write(out: Path | None, report: dict) -> None:
    report["goals"] = goals(report["entries"])
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing_precision.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "timing_precision.md").write_text(markdown(report))


# ====================================================================== where the spread comes from

PROBE = r"""
extern "C" __global__ void add_one(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.f;
}
extern "C" __global__ void sm_clock(unsigned long long* out, long long cycles) {
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long c0 = clock64(), c1 = c0;
    while (c1 - c0 < cycles) c1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    out[0] = (unsigned long long)(c1 - c0);
    out[1] = t1 - t0;
}
"""


def _stats(times: list[float]) -> dict:
    ordered = sorted(times)
    q1, median, q3 = statistics.quantiles(ordered, n=4, method="inclusive")

    def pick(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    # the spread of means of 4 consecutive runs: what averaging would hide, not a method
    fours = [statistics.fmean(times[i : i + 4]) for i in range(0, len(times) - 3, 4)]
    f1, fm, f3 = statistics.quantiles(fours, n=4, method="inclusive")
    return {"median_us": median * 1e3, "spread": (q3 - q1) / median, "p5_us": pick(0.05) * 1e3,
            "p95_us": pick(0.95) * 1e3, "runs": len(times), "iqr_us": (q3 - q1) * 1e3,
            "spread_of_means_of_4": (f3 - f1) / fm,
            "lag1_correlation": _correlation(times[:-1], times[1:])}  # fmt: skip


def attribute(runs: int) -> dict:
    """Where a short forward's spread comes from (module docstring): per kernel size and
    condition, median, spread, p5 and p95 of `runs` CUDA-event times; the SM clock meanwhile."""
    import torch

    import cudaforge
    from cudaforge.profiling.l2_flush import l2_flush

    dev = torch.device("cuda", torch.cuda.current_device())
    mod = cudaforge.compile(PROBE)
    flush = l2_flush(dev)
    report: dict = {"flush": flush.description, "conditions": {}, "clock": {}}
    try:
        report["nvml_clock_mhz"] = torch.cuda.clock_rate(dev)
    except Exception as e:  # noqa: BLE001 - NVML (pynvml) is optional
        report["nvml_clock_mhz"] = f"unavailable: {type(e).__name__}"
    sizes = (("tiny (1 MB)", 1 << 18), ("~35 us (64 MB)", 1 << 24), ("0.1 ms (256 MB)", 1 << 26))
    for label, n in sizes:
        x = torch.randn(n, device=dev)
        y = torch.empty_like(x)
        grid = ((n + 255) // 256,)

        class Forward(torch.nn.Module):
            def forward(self, x):
                x = x.contiguous()
                y = torch.empty_like(x)
                mod.add_one(((x.numel() + 255) // 256,), (256,), (x, y, x.numel()))
                return y

        model = Forward()
        graph = torch.cuda.CUDAGraph()
        for _ in range(3):
            mod.add_one(grid, (256,), (x, y, n))
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            mod.add_one(grid, (256,), (x, y, n))
        rows = {}
        for kind, text in CONDITIONS.items():
            times, clocks = _timed_condition(torch, mod, flush, kind, runs, x, y, model, graph)
            rows[text] = _stats(times)
            if clocks:
                with_clock = [t for i, t in enumerate(times) if i % 10 == 9]
                report["clock"][label] = {
                    "min_mhz": min(clocks), "median_mhz": statistics.median(clocks),
                    "max_mhz": max(clocks), "samples": len(clocks),
                    "time_vs_clock_correlation": _correlation(with_clock, clocks),
                }  # fmt: skip
        report["conditions"][label] = rows
        graph.reset()
    return report


def _timed_condition(torch, mod, flush, kind, runs, x, y, model, graph):
    """CUDA-event ms of `runs` launches of add_one under condition `kind` (CONDITIONS); under
    "fresh", the SM clock (MHz) after every 10th run, probed outside the events and read at the
    end (no synchronization between the runs)."""
    n, grid = x.numel(), ((x.numel() + 255) // 256,)
    probes = torch.zeros(2 * (runs // 10 + 1), dtype=torch.int64, device=x.device)
    side = torch.cuda.Stream(x.device)
    main = torch.cuda.current_stream(x.device)
    events = []
    for i in range(runs):
        if kind == "queued" and i % 50 == 0:
            torch.cuda._sleep(2_000_000)  # ~1 ms spin: the next 50 launches queue behind it
        if kind == "idle":
            torch.cuda.synchronize()
        if kind == "ahead":  # as the harness queues a run: a spin, the host issues meanwhile
            torch.cuda._sleep(200_000)  # ~0.1 ms
        if kind == "harness":  # as prepare_run: seeded fresh values and the flush, side stream
            side.wait_stream(main)
            with torch.cuda.stream(side):
                torch.manual_seed(i)
                x.copy_(torch.randn_like(x))
                flush(i)
            main.wait_stream(side)
        elif kind not in ("queued", "idle"):
            flush(i)
        if kind not in ("queued", "idle", "flush", "harness"):  # fresh values before each
            x.normal_()
        if kind == "settle":  # the GPU keeps busy for ~20 us between the flush and the run
            torch.cuda._sleep(40_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if kind in ("gap", "graph_gap"):  # the host waits ~5 us before launching
            began = time.perf_counter_ns()
            while time.perf_counter_ns() - began < 5_000:
                pass
        if kind == "empty":
            pass  # the events alone: their own jitter
        elif kind in ("graph", "graph_gap"):
            graph.replay()
        elif kind in ("python", "harness"):
            model(x)
        elif kind == "alloc":
            mod.add_one(grid, (256,), (x, torch.empty_like(x), n))
        else:
            mod.add_one(grid, (256,), (x, y, n))
        end.record()
        events.append((start, end))
        if kind == "fresh" and i % 10 == 9:
            k = i // 10
            mod.sm_clock((1,), (1,), (probes[2 * k :], 200_000))
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in events]
    clocks = []
    if kind == "fresh":
        values = probes.tolist()
        clocks = [values[2 * k] / values[2 * k + 1] * 1e3 for k in range(runs // 10)
                  if values[2 * k + 1] > 0]  # fmt: skip
    return times, clocks


CONDITIONS = {
    "queued": "launches queued behind a 1 ms spin, no flush (the GPU's own time)",
    "flush": "L2 flush before each (the harness's flush)",
    "fresh": "flush + fresh input values before each",
    "idle": "synchronized before each: the GPU idle at launch (launch latency in the window)",
    "alloc": "flush + fresh values, output allocated in the window (the allocator)",
    "python": "flush + fresh values, a Python nn.Module forward (contiguous, empty_like, launch)",
    "harness": "the Python forward after the harness's preparation (seeded values, flush, side "
    "stream)",
    "graph": "flush + fresh values, the launch replayed from a CUDA graph",
    "ahead": "a ~0.1 ms spin, flush + fresh values, then the launch (queued as the harness does)",
    "settle": "flush + fresh values, then a ~20 us spin before the start event",
    "empty": "flush + fresh values, the two events with nothing between them",
    "gap": "flush + fresh values, the host waits ~5 us after the start event, then the launch",
    "graph_gap": "flush + fresh values, the host waits ~5 us after the start event, then the "
    "graph replay",
}


def _correlation(a: list[float], b: list[float]) -> float | None:
    if len(a) < 3 or len(a) != len(b) or statistics.pstdev(a) == 0 or statistics.pstdev(b) == 0:
        return None
    return statistics.correlation(a, b)


def attribution_lines(report: dict) -> list[str]:
    head = (f"Where the spread comes from (outside the harness; flush: {report['flush']}; "
            f"NVML clock: {report.get('nvml_clock_mhz')}):")  # fmt: skip
    columns = (
        "| kernel | condition | median us | spread | IQR us | p5 us | p95 us | "
        "spread of means of 4 | lag-1 corr. |"
    )
    lines = [head, "", columns,
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for label, rows in report["conditions"].items():
        for text, s in rows.items():
            lag = s.get("lag1_correlation")
            lines.append(f"| {label} | {text} | {s['median_us']:.2f} | {s['spread']:.2%} | "
                         f"{s.get('iqr_us', float('nan')):.2f} | {s['p5_us']:.2f} | "
                         f"{s['p95_us']:.2f} | {s.get('spread_of_means_of_4', float('nan')):.2%} | "
                         f"{'n/a' if lag is None else f'{lag:+.2f}'} |")  # fmt: skip
    for label, c in report["clock"].items():
        corr = c["time_vs_clock_correlation"]
        lines.append(f"- SM clock during the {label} runs (clock64 over %globaltimer, "
                     f"{c['samples']} samples): {c['min_mhz']:.0f}-{c['max_mhz']:.0f} MHz, "
                     f"median {c['median_mhz']:.0f}; correlation of run time with it: "
                     f"{'n/a' if corr is None else f'{corr:+.2f}'}")  # fmt: skip
    return lines


# ====================================================================== main


def merged(paths: list[Path]) -> dict:
    report: dict = {"entries": []}
    for path in paths:
        part = json.loads((path / "timing_precision.json" if path.is_dir() else path).read_text())
        report["entries"] += part["entries"]
        for key in ("device", "trials", "attribution"):
            report.setdefault(key, part.get(key))
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON and table")
    parser.add_argument("--quick", action="store_true", help="8 candidates, fewer probe runs")
    parser.add_argument(
        "--trials",
        type=int,
        default=2,
        help="correctness trials per evaluation (timing is the subject; default 2)",
    )
    parser.add_argument(
        "--only", default="", help="candidates whose name contains this (comma: any of these)"
    )
    parser.add_argument("--spares", type=int, default=None,
                        help="workers started ahead (default: the pool's; 0 starts each one "
                             "when needed, so that no process starts while another is timed)")  # fmt: skip
    parser.add_argument("--part", default="", help="K/N: every N-th candidate from the K-th")
    parser.add_argument("--no-attribute", action="store_true", help="skip the spread attribution")
    parser.add_argument("--attribute-only", action="store_true")
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        help="print the table and goals of earlier --out folders together",
    )
    parser.add_argument("--compare-option", default="", metavar="KEY=VALUE",
                        help="A/B one evaluation option instead of the two rules: 'old' is the "
                             "new rule as it is, 'new' the new rule with KEY=VALUE (a number)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the candidates and exit")
    parser.add_argument("--every-llm-kernel", action="store_true",
                        help="every correct LLM kernel, not the last one per problem")  # fmt: skip
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke run (shrunk problems, each its own model)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.compare_option:
        key, _, value = args.compare_option.partition("=")
        OLD.clear()
        OLD.update(NEW)
        NEW[key] = float(value)
    if args.merge:
        report = merged(args.merge)
        write(args.out, report)
        print(markdown(report))
        return 0
    chosen = [] if args.attribute_only else candidates(args.quick, args.only, args.part,
                                                       args.every_llm_kernel)  # fmt: skip
    if args.list:
        for c in chosen:
            print(f"{c.name}  sizes={c.sizes or 'as written'}")
        return 0
    import torch

    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("timing_precision needs a CUDA GPU (the H200); --device cpu for a smoke run",
              file=sys.stderr)  # fmt: skip
        return 2
    from cudaforge.harness.pool import WorkerPool

    if cpu:
        chosen = [on_cpu(c) for c in chosen]
    device = "cpu" if cpu else torch.cuda.get_device_name()
    report = {"device": device, "trials": args.trials, "entries": [], "old_options": OLD,
              "new_options": NEW, "started": time.time(), "spares": args.spares}  # fmt: skip
    if not args.no_attribute and not cpu:
        report["attribution"] = attribute(300 if args.quick else 1000)
        print("\n".join(attribution_lines(report["attribution"])), flush=True)
        write(args.out, report)
    if chosen:
        more = {"timed_runs": 10, "warmup": 1, "min_runs": 6, "max_runs": 40,
                "time_budget_s": 0.2} if cpu else {}  # fmt: skip
        with WorkerPool(1, device=args.device, timeout=120, compile_timeout=600,
                        spares=args.spares) as pool:  # fmt: skip
            for i, cand in enumerate(chosen):
                entry = evaluate_candidate(pool, cand, args.trials, **more)
                report["entries"].append(entry)
                r = entry["row"]
                said = (f"{r['forward_ms']:.4f} ms, spread {r['spread_old']:.2%} -> "
                        f"{r['spread_new']:.2%}, eval {r['seconds_old']:.2f} -> "
                        f"{r['seconds_new']:.2f} s") if r.get("ok") else r["status"]  # fmt: skip
                print(f"[{i + 1}/{len(chosen)}] {cand.name}: {said}", flush=True)
                write(args.out, report)
    write(args.out, report)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
