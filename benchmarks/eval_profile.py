"""Benchmark: where one evaluation's time goes, function by function (issue 20's time goal).

The timing benchmark's phase split (`timing["phase_s"]`) says that the graph-timed evaluations of
short forwards spend 0.2-0.4 s capturing and checking the two graphs, and ~1.4 ms per timed run
whatever the forward's length. This runs such evaluations in this process under cProfile and
prints, per candidate, the functions that took the time (cumulative and own), plus wall-clock
timers around the CUDA-graph calls (capture_begin, capture_end, replay, reset) and the per-run
preparation (fresh inputs, flush, L2 check).

In-process on purpose: a profiler cannot reach into a worker. The candidates are cudaforge's own
example kernels (cudaforge/examples/), not model-written code. Each candidate is evaluated once
to warm the caches, then once profiled (`--warm` for a process's first evaluation).

    python benchmarks/eval_profile.py --out $OUT/profile            # on the H200
    python benchmarks/eval_profile.py --only l1_088_gelu/small --top 40
    python benchmarks/eval_profile.py --only l1_088_gelu/small --warm none  # a first evaluation
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

DEFAULT = "l1_019_relu/small,l1_088_gelu/small,l1_036_rmsnorm/small,l1_019_relu/middle"
# a process that creates a CUDA context and ends, over and over (each a fresh interpreter)
DISTURB = (
    "import subprocess, sys\n"
    "while True:\n"
    "    subprocess.run([sys.executable, '-c', 'import torch; torch.zeros(1, device=\"cuda\")'])\n"
)


class Timers:
    """Wall-clock totals of wrapped callables, by label."""

    def __init__(self):
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.calls[label] += 1
                self.seconds[label] += time.perf_counter() - started

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.calls.clear()
        self.seconds.clear()

    def rows(self) -> list[dict]:
        return [
            {"what": k, "calls": self.calls[k], "seconds": round(self.seconds[k], 5),
             "us_per_call": round(1e6 * self.seconds[k] / max(1, self.calls[k]), 1)}
            for k in sorted(self.seconds, key=self.seconds.get, reverse=True)
        ]  # fmt: skip


def instrument(torch) -> Timers:
    from cudaforge.harness import graphs, timing
    from cudaforge.harness.problem import Problem
    from cudaforge.profiling.l2_flush import L2Flush

    t = Timers()
    for name in ("capture_begin", "capture_end", "replay", "reset"):
        t.wrap(torch.cuda.CUDAGraph, name, f"CUDAGraph.{name}")
    t.wrap(graphs, "capture_forward", "capture_forward (warm-up + capture)")
    t.wrap(graphs.GraphTiming, "capture_side", "capture_side (capture + check)")
    t.wrap(Problem, "make_inputs", "Problem.make_inputs")
    t.wrap(timing.TimingPhases, "prepare_run", "prepare_run (spin, fresh inputs, flush)")
    t.wrap(timing.TimingPhases, "check_l2", "check_l2 (persisting-L2 guard)")
    t.wrap(L2Flush, "__call__", "L2Flush (the flush)")
    return t


def profile_one(name: str, top: int, timers: Timers, warm_with: str = "eval") -> dict:
    from timing_precision import candidates

    from cudaforge.harness.evaluate import run_evaluation
    from cudaforge.harness.options import make_options

    found = [c for c in candidates(False, only=name) if c.name == name]
    if not found:
        raise SystemExit(f"no candidate named {name}")
    cand = found[0]
    opts = make_options(trials=5, timed_runs=100, warmup=10, device="cuda")
    warm = None
    if warm_with == "eval":  # compiles, caches, lazy loads
        warm = run_evaluation(cand.problem, cand.source, opts).status
    elif warm_with == "capture":  # what a worker does before its evaluation
        import torch

        from cudaforge.harness.graphs import warm_capture

        warm_capture(torch, torch.device("cuda", torch.cuda.current_device()))
    timers.reset()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    result = run_evaluation(cand.problem, cand.source, opts)
    profiler.disable()
    seconds = time.perf_counter() - started
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return {
        "name": name, "status": result.status, "warmed_with": warm_with, "warm_status": warm, "seconds": seconds,
        "phases": result.phase_seconds, "timing_parts": result.timing.get("phase_s"),
        "graph_capture_s": result.timing.get("graph_capture_s"),
        "basis": result.timing.get("speedup_basis"), "timers": timers.rows(),
        "profile": text.getvalue(),
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=DEFAULT, help="comma-separated candidate names")
    ap.add_argument("--top", type=int, default=30, help="functions listed per sort")
    ap.add_argument(
        "--warm",
        choices=("eval", "capture", "none"),
        default="eval",
        help="before the profiled evaluation: one of the same candidate (default), "
        "a worker's graph warm-up, or nothing (the process's first evaluation, as "
        "in a fresh worker; run one candidate per process then)",
    )
    ap.add_argument(
        "--disturb",
        type=int,
        default=0,
        help="processes that create CUDA contexts in a loop meanwhile, as a pool's "
        "spare workers starting during an evaluation do",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("eval_profile: needs a CUDA GPU")
        return 2
    report, timers = [], instrument(torch)
    disturbers = [subprocess.Popen([sys.executable, "-c", DISTURB]) for _ in range(args.disturb)]
    time.sleep(3.0 if disturbers else 0.0)  # their first imports
    for name in args.only.split(","):
        got = profile_one(name, args.top, timers, args.warm)
        got["disturbers"] = len(disturbers)
        report.append(got)
        print(f"== {name}: {got['status']}, {got['seconds']:.3f} s, basis {got['basis']}")
        print("   phases:", {k: round(v, 3) for k, v in got["phases"].items()})
        print("   timing parts:", got["timing_parts"], "captures:", got["graph_capture_s"])
        for row in got["timers"]:
            print(f"   {row['what']:<45} {row['calls']:>5} calls {row['seconds']:>8.4f} s "
                  f"{row['us_per_call']:>9.1f} us/call")  # fmt: skip
        print(got["profile"])
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "eval_profile.json").write_text(json.dumps(report, indent=1))
    for p in disturbers:
        p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
