"""Benchmark: the wall time of one full evaluation (compile, 5 correctness trials, 100 timed runs of
the candidate and of the reference) with cudaforge, against the same evaluation done the paper's
way (load_inline + nvcc, then a KernelBench-style loop timed with CUDA events), in the same run on
the same GPU, for hand-written candidates of 5 level-1 and 2 level-2 dev problems
(cudaforge/examples/: each kernel in both styles).

Reported per problem: both wall times and their ratio (goal: >= 20x), the run-to-run spread of the
candidate time cudaforge measures over --repeats evaluations (goal: < 2%), and, with --ncu, how
far CUPTI's per-kernel time is from Nsight Compute's gpu__time_duration.sum for the same kernels
(goal: within 3%). Writes results.json and results.md to --out.

    python benchmarks/evaluate.py --out $OUT/bench            # on the H200
    python benchmarks/evaluate.py --out $OUT/bench --ncu      # plus the ncu comparison

The paper's way runs in a fresh process per evaluation with an empty TORCH_EXTENSIONS_DIR (a cold
nvcc build, as a new kernel always is); its wall time is measured inside that process (from before
the build to the last timed run: interpreter and torch start-up are not counted). cudaforge's runs
in a warm worker (as an agent's loop uses it) with an empty kernel cache on the first evaluation of
each problem; later repeats hit the cache and are reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "cudaforge" / "examples"  # hand-written reference kernels
sys.path.insert(0, str(HERE.parent))

from ncu_tools import find_ncu

from cudaforge.harness.problem import Problem


@dataclass
class Case:
    name: str
    level: int
    problem_id: int
    sizes: dict = field(
        default_factory=dict
    )  # overrides (both ways use the same), none with --full-size

    def problem(self, full_size: bool = False) -> Problem:
        return Problem.from_dev_set(
            self.level, self.problem_id, sizes=None if full_size else self.sizes
        )

    def source(self, style: str) -> str:
        suffix = "_inline" if style == "inline" else ""
        return (EXAMPLES / f"{self.name}{suffix}.py").read_text()


# the 6.4 GB-per-tensor problems are cut to sizes where generating KernelBench-style inputs on
# the CPU (as the paper's loop does) does not dominate its time; the same sizes for both ways
CASES = [
    Case("l1_012_diag_matmul", 1, 12),
    Case("l1_019_relu", 1, 19, {"dim": 16384}),
    Case("l1_023_softmax", 1, 23, {"dim": 16384}),
    Case("l1_036_rmsnorm", 1, 36, {"batch_size": 16}),
    Case("l1_088_gelu", 1, 88),
    Case("l2_001_conv_relu_bias", 2, 1, {"batch_size": 32}),
    Case("l2_076_gemm_add_relu", 2, 76),
]


# ====================================================================== the paper's way


def paper_way(case: Case, trials: int, timed_runs: int, full_size: bool) -> dict:
    """One evaluation as KernelBench/CudaForge do it, in this process: build the load_inline
    candidate, check it on `trials` seeds (inputs made on the CPU, moved to the GPU, allclose),
    then time candidate and reference with CUDA events around each call, synchronizing after each
    (KernelBench's time_execution_with_cuda_event: 3 warm-up calls, then `timed_runs`)."""
    import torch

    started = time.perf_counter()
    problem = case.problem(full_size)
    module = problem.build_module()
    namespace: dict = {"__name__": "candidate"}
    exec(compile(case.source("inline"), f"{case.name}_inline.py", "exec"), namespace)  # noqa: S102
    compiled = time.perf_counter()
    init = module.get_init_inputs()
    torch.manual_seed(42)
    model = module.Model(*init).cuda()
    torch.manual_seed(42)
    model_new = namespace["ModelNew"](*init).cuda()
    correct = True
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(trial)
            inputs = [x.cuda() if torch.is_tensor(x) else x for x in module.get_inputs()]
            expected = model(*inputs)
            got = model_new(*inputs)
            torch.cuda.synchronize()
            same = expected.shape == got.shape and torch.allclose(
                got, expected, atol=1e-2, rtol=1e-2
            )
            correct = correct and bool(same)
        checked = time.perf_counter()
        torch.manual_seed(trials)
        inputs = [x.cuda() if torch.is_tensor(x) else x for x in module.get_inputs()]
        times = {}
        for label, m in (("candidate", model_new), ("reference", model)):
            for _ in range(3):
                m(*inputs)
            torch.cuda.synchronize()
            elapsed = []
            for _ in range(timed_runs):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                m(*inputs)
                end.record()
                torch.cuda.synchronize()
                elapsed.append(start.elapsed_time(end))
            times[label] = elapsed
    finished = time.perf_counter()
    return {
        "wall_s": finished - started,
        "compile_s": compiled - started,
        "correctness_s": checked - compiled,
        "timing_s": finished - checked,
        "correct": correct,
        "candidate_ms_mean": statistics.fmean(times["candidate"]),
        "reference_ms_mean": statistics.fmean(times["reference"]),
    }


def run_paper_way(case: Case, args, scratch: Path) -> dict:
    """paper_way() in a fresh process with an empty torch extensions folder."""
    ext_dir = scratch / f"torch_extensions_{case.name}"
    shutil.rmtree(ext_dir, ignore_errors=True)
    out = scratch / f"paper_{case.name}.json"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir)}
    command = [sys.executable, __file__, "--paper-way", case.name, "--json", str(out),
               "--trials", str(args.trials), "--timed-runs", str(args.timed_runs)]  # fmt: skip
    if args.full_size:
        command.append("--full-size")
    started = time.perf_counter()
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    process_s = time.perf_counter() - started
    if proc.returncode != 0 or not out.exists():
        return {"error": (proc.stderr or proc.stdout)[-3000:], "process_s": process_s}
    result = json.loads(out.read_text())
    result["process_s"] = process_s
    return result


# ====================================================================== ncu


# ncu's units to microseconds (times) and megahertz (rates): what the callers report in
NCU_SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
             "Ghz": 1e3, "Mhz": 1.0, "hz": 1e-6, "cycle/nsecond": 1e3, "cycle/usecond": 1.0,
             "cycle/second": 1e-6}  # fmt: skip


def ncu_values(
    case: Case, own: list[str], metrics: list[str], *, full_size: bool = False,
    cache: str = "all", sets: int = 4, scratch: Path | None = None, timeout: float = 900,
) -> dict:  # fmt: skip
    """{kernel name: {metric: [value per launch]}} from ncu over ncu_target (20 launches of the
    kernels named `own`, clocks not locked as in the timed runs, `cache` control), times in us
    and rates in MHz; or {"error": why} when ncu is missing or reported nothing."""
    tool = find_ncu()
    if tool is None:
        return {"error": "ncu not found"}
    regex = "regex:^(" + "|".join(re.escape(k) for k in own) + ")"
    command = [tool, "--csv", "--metrics", ",".join(metrics), "--clock-control", "none",
               "--cache-control", cache, "--kernel-name", regex, "--launch-count", "20",
               sys.executable, __file__, "--ncu-target", case.name, "--ncu-sets", str(sets)]  # fmt: skip
    if full_size:
        command.append("--full-size")
    env = dict(os.environ)
    if scratch is not None:
        env["CUDAFORGE_CACHE_DIR"] = str(scratch / "ncu_cache")
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    found: dict[str, dict[str, list[float]]] = {}
    header = None
    for line in proc.stdout.splitlines():
        cells = [c.strip('"') for c in re.findall(r'"(?:[^"]|"")*"|[^,]+', line)]
        if "Kernel Name" in cells and "Metric Value" in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header):
            continue
        row = dict(zip(header, cells, strict=True))
        if row.get("Metric Name") not in metrics:
            continue
        value = float(row["Metric Value"].replace(",", ""))
        name = row["Kernel Name"].split("(")[0].strip()
        per_metric = found.setdefault(name, {})
        per_metric.setdefault(row["Metric Name"], []).append(
            value * NCU_SCALE.get(row.get("Metric Unit", "ns"), 1)
        )
    if not found:
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    return found


def ncu_kernel_times(case: Case, own: list[str], args, scratch: Path) -> dict | None:
    """Nsight Compute's gpu__time_duration.sum (us) per own kernel of the candidate, over 20
    launches, with clocks not locked (as in the timed runs) and caches flushed (as there)."""
    if find_ncu() is None or not own:
        return None
    metric = "gpu__time_duration.sum"
    found = ncu_values(case, own, [metric], full_size=args.full_size, scratch=scratch)
    if "error" in found:
        return found
    return {name: statistics.fmean(v[metric]) for name, v in found.items()}


def ncu_target(case: Case, full_size: bool, sets: int = 4) -> None:
    """What ncu profiles: the candidate's forward, 25 times, rotating among `sets` input sets as
    the timed runs do (4 by default; L2 flushed by ncu)."""
    import torch

    problem = case.problem(full_size)
    module = problem.build_module()
    namespace: dict = {"__name__": "candidate"}
    exec(compile(case.source("fast"), f"{case.name}.py", "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    model = namespace["ModelNew"](*module.get_init_inputs()).cuda()
    inputs = [problem.make_inputs(1 + k, "cuda", module) for k in range(sets)]
    with torch.no_grad():
        for i in range(25):
            model(*inputs[i % sets])
    torch.cuda.synchronize()


# ====================================================================== the benchmark


def spread(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def _add_paper(row: dict, paper: dict) -> None:
    row["paper"] = paper
    if "wall_s" in paper:
        row["ratio"] = paper["wall_s"] / row["cudaforge_wall_s"]


def _save_partial(args, rows: list[dict]) -> None:
    """The rows so far, so that a run cut short (a time limit, a crash) still leaves them."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.partial.json").write_text(json.dumps(rows, indent=2, default=str))


def run(args) -> dict:
    from cudaforge.harness.pool import WorkerPool

    scratch = Path(tempfile.mkdtemp(prefix="cudaforge-bench-"))
    cases = [c for c in CASES if not args.problems or c.name in args.problems]
    os.environ["CUDAFORGE_CACHE_DIR"] = str(scratch / "kernel_cache")  # empty: cold compiles
    rows = []
    with WorkerPool(1, device="cuda", timeout=900, compile_timeout=900) as pool:
        # the worker (interpreter, torch, CUDA context) starts before the clock: it stays warm
        pool.wait_ready(600)
        for case in cases:
            problem = case.problem(args.full_size)
            print(f"{case.name}: cudaforge ...", file=sys.stderr, flush=True)
            evaluations = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                r = pool.evaluate(problem, case.source("fast"), trials=args.trials,
                                  timed_runs=args.timed_runs)  # fmt: skip
                evaluations.append((time.perf_counter() - started, r))
            first_wall, first = evaluations[0]
            times = [r.candidate_ms for _, r in evaluations if r.candidate_ms]
            row = {
                "case": case.name,
                "problem": problem.name,
                "sizes": problem.sizes,
                "status": first.status,
                "error": first.error,
                "cudaforge_wall_s": first_wall,
                "cudaforge_warm_wall_s": [w for w, _ in evaluations[1:]],
                "cudaforge_phase_s": first.phase_seconds,
                "candidate_ms": [round(t, 5) for t in times],
                "reference_ms": first.reference_ms,
                "speedup": first.speedup,
                "within_run_spread": first.candidate_spread,
                "run_to_run_spread": spread(times),
                "own_kernel_share": first.own_kernel_share,
                "kernels": [k.__dict__ for k in first.kernels],
                "guards": first.guards,
                "timing": {k: v for k, v in first.timing.items() if not k.endswith("runs_ms")},
            }
            if not args.skip_paper and args.paper_jobs <= 1:
                print(f"{case.name}: the paper's way (load_inline, cold) ...", file=sys.stderr,
                      flush=True)  # fmt: skip
                _add_paper(row, run_paper_way(case, args, scratch))
            if args.ncu:
                own = [k.name for k in first.kernels if k.own]
                ncu = ncu_kernel_times(case, own, args, scratch)
                row["ncu_us"] = ncu
                if ncu and "error" not in ncu:
                    row["cupti_vs_ncu"] = {
                        k.name: (k.mean_us - ncu[k.name]) / ncu[k.name]
                        for k in first.kernels
                        if k.own and k.name in ncu
                    }
            rows.append(row)
            _save_partial(args, rows)
    if not args.skip_paper and args.paper_jobs > 1:
        # after every cudaforge evaluation, so those never share the GPU; the paper's runs share
        # it among themselves only in their short timed loops (their time is the nvcc builds)
        from concurrent.futures import ThreadPoolExecutor

        print(f"the paper's way for {len(cases)} problems, {args.paper_jobs} at a time ...",
              file=sys.stderr, flush=True)  # fmt: skip
        with ThreadPoolExecutor(args.paper_jobs) as jobs:
            papers = list(jobs.map(lambda c: run_paper_way(c, args, scratch), cases))
        for row, paper in zip(rows, papers, strict=True):
            _add_paper(row, paper)
        _save_partial(args, rows)
    shutil.rmtree(scratch, ignore_errors=True)
    import torch

    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "trials": args.trials,
        "timed_runs": args.timed_runs,
        "repeats": args.repeats,
        "full_size": args.full_size,
        "paper_jobs": args.paper_jobs,
        "rows": rows,
    }


def markdown(report: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.2f}%"

    def num(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    lines = [
        f"# Evaluation wall time: cudaforge vs the paper's way ({report['device']})",
        "",
        (
            f"One evaluation = compile + {report['trials']} correctness trials + "
            f"{report['timed_runs']} timed runs of candidate and reference. cudaforge: warm worker, "
            "cold kernel cache. Paper's way: fresh process, cold load_inline build, KernelBench-style "
            "loop. Candidates are hand-written reference kernels (cudaforge/examples/)."
            + (f" The paper's way ran {report['paper_jobs']} problems at a time, after cudaforge's"
               " evaluations." if report.get("paper_jobs", 1) > 1 else "")
        ),
        "",
        (
            "| problem | sizes | status | cudaforge s (compile) | paper s (compile) | ratio | "
            "candidate ms | speedup | within-run spread | run-to-run spread | own share | "
            "CUPTI vs ncu |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["rows"]:
        paper = row.get("paper", {})
        compile_s = row["cudaforge_phase_s"].get("load")
        ncu = row.get("cupti_vs_ncu") or {}
        lines.append(
            f"| {row['problem']} | {row['sizes'] or 'default'} | {row['status']} | "
            f"{num(row['cudaforge_wall_s'])} ({num(compile_s)}) | "
            f"{num(paper.get('wall_s'))} ({num(paper.get('compile_s'))}) | "
            f"{num(row.get('ratio'), '{:.1f}x')} | "
            f"{num(row['candidate_ms'][0] if row['candidate_ms'] else None, '{:.4f}')} | "
            f"{num(row['speedup'], '{:.2f}x')} | {pct(row['within_run_spread'])} | "
            f"{pct(row['run_to_run_spread'])} | {pct(row['own_kernel_share'])} | "
            + (", ".join(f"{k}: {pct(v)}" for k, v in ncu.items()) or "-")
            + " |"
        )
    ratios = [r["ratio"] for r in report["rows"] if r.get("ratio")]
    if ratios:
        geo = statistics.geometric_mean(ratios)
        lines += ["", f"Geometric mean ratio: {geo:.1f}x (goal: >= 20x)."]
    spreads = [r["run_to_run_spread"] for r in report["rows"] if r["run_to_run_spread"] is not None]
    if spreads:
        lines.append(f"Largest run-to-run spread: {pct(max(spreads))} (goal: < 2%).")
    errors = [r for r in report["rows"] if r["status"] != "ok"]
    for r in errors:
        lines.append(f"- {r['problem']}: {r['status']}: {r['error']}")
    for r in report["rows"]:
        if r.get("paper", {}).get("error"):
            lines.append(f"- {r['problem']}: the paper's way failed: {r['paper']['error'][-500:]}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder for results.json and results.md")
    p.add_argument("--problems", nargs="*", help="case names (default: all)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--timed-runs", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3, help="cudaforge evaluations per problem")
    p.add_argument("--full-size", action="store_true", help="the dev problems' own sizes")
    p.add_argument("--skip-paper", action="store_true", help="only cudaforge's evaluation")
    p.add_argument("--ncu", action="store_true", help="compare CUPTI with ncu (needs ncu)")
    p.add_argument("--paper-jobs", type=int, default=1,
                   help="run the paper's way for this many problems at once, after cudaforge's")
    p.add_argument("--paper-way", help=argparse.SUPPRESS)
    p.add_argument("--ncu-target", help=argparse.SUPPRESS)
    p.add_argument("--ncu-sets", type=int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    if args.paper_way:
        result = paper_way(by_name[args.paper_way], args.trials, args.timed_runs, args.full_size)
        Path(args.json).write_text(json.dumps(result))
        return 0
    if args.ncu_target:
        ncu_target(by_name[args.ncu_target], args.full_size, args.ncu_sets)
        return 0
    if not args.out:
        p.error("--out is required")
    unknown = set(args.problems or ()) - set(by_name)
    if unknown:
        p.error(f"unknown case(s) {sorted(unknown)}; cases: {', '.join(by_name)}")
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "results.md").write_text(markdown(report))
    (out / "results.partial.json").unlink(missing_ok=True)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
