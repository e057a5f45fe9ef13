"""Benchmark: the wall time per candidate evaluation in a stream of evaluations, before and after
issue 17 (one process per candidate, verdicts in a reference process), on the same dev problems
in one run.

- before: the old warm worker's work, run_evaluation over and over in one warm process (the
  comparison in that process; what the reused worker did per job, less its pickle pipe);
- after: WorkerPool.evaluate in a stream (a fresh sandboxed worker per candidate, started
  ahead; outputs judged in the reference process; JSON results).

The candidates are the hand-written kernels of cudaforge/examples/ on a GPU, and on the CPU each
problem's own Model renamed ModelNew (the problems shrunk to the CPU path's size). Goal: at
most +0.3 s per evaluation. Prints a table and writes walltime.json to --out.

    python benchmarks/eval_walltime.py --out $OUT/walltime                 # on the H200, ~2 min
    python benchmarks/eval_walltime.py --repeats 2 --timed-runs 10         # small, on a CPU
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from cudaforge.harness.problem import Problem

EXAMPLES = HERE.parent / "cudaforge" / "examples"
CASES = [  # (example name, level, id, sizes): the dev problems benchmarks/evaluate.py uses
    ("l1_019_relu", 1, 19, {"dim": 16384}),
    ("l1_023_softmax", 1, 23, {"dim": 16384}),
    ("l1_036_rmsnorm", 1, 36, {"batch_size": 16}),
    ("l1_088_gelu", 1, 88, {}),
]
CPU_BYTES = 8 << 20


def stream(cuda: bool, repeats: int) -> list[tuple[str, Problem, str]]:
    """(name, problem, candidate source) in the order they are evaluated."""
    items = []
    for name, level, pid, sizes in CASES:
        problem = Problem.from_dev_set(level, pid, sizes=sizes or None)
        if cuda:
            source = (EXAMPLES / f"{name}.py").read_text()
        else:
            problem = problem.shrink(CPU_BYTES)
            source = re.sub(r"\bModel\b", "ModelNew", problem.source)
        items.append((name, problem, source))
    return items * repeats


def before(items, options: dict) -> list[float]:
    """Seconds per evaluation with run_evaluation in one warm process (a child interpreter,
    warmed up by one evaluation first, as the old worker was by its earlier jobs)."""
    payload = json.dumps([(p.to_dict(), s) for _, p, s in items])
    script = f"""
import json, sys, time
from cudaforge.harness.evaluate import run_evaluation
from cudaforge.harness.options import make_options
from cudaforge.harness.problem import Problem
items = json.loads(sys.stdin.read())
opts = make_options(**{options!r})
run_evaluation(Problem.from_dict(items[0][0]), items[0][1], opts)
out = []
for problem, source in items:
    t = time.perf_counter()
    r = run_evaluation(Problem.from_dict(problem), source, opts)
    out.append((time.perf_counter() - t, r.status))
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", script], input=payload, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def after(items, options: dict, device: str | None, spares: int) -> list[tuple[float, str]]:
    from cudaforge.harness.pool import WorkerPool

    out = []
    with WorkerPool(1, device=device, spares=spares) as pool:
        pool.wait_ready(600)
        pool.evaluate(items[0][1], items[0][2], **options)  # the same warm-up as before()
        for _, problem, source in items:
            t = time.perf_counter()
            r = pool.evaluate(problem, source, **options)
            out.append((time.perf_counter() - t, r.status))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="passes over the problems")
    parser.add_argument("--timed-runs", type=int, default=100)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--spares", type=int, default=None,
                        help="workers started ahead per slot (default: the pool's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    options = {"trials": args.trials, "timed_runs": args.timed_runs}
    if not cuda:
        options["device"] = "cpu"
    items = stream(cuda, args.repeats)
    old = before(items, options)
    new = after(items, options, None if cuda else "cpu", args.spares)
    rows = []
    for name in dict.fromkeys(n for n, _, _ in items):
        picks = [i for i, (n, _, _) in enumerate(items) if n == name]
        b = statistics.median(old[i][0] for i in picks)
        a = statistics.median(new[i][0] for i in picks)
        rows.append({"problem": name, "before_s": b, "after_s": a, "added_s": a - b,
                     "status_before": old[picks[0]][1], "status_after": new[picks[0]][1]})  # fmt: skip
    mean_added = statistics.fmean(r["added_s"] for r in rows)
    print(f"device: {'cuda' if cuda else 'cpu'}; {len(items)} evaluations per mode; {options}; "
          f"spares {args.spares}")  # fmt: skip
    print("| problem | before (s) | after (s) | added (s) | status before / after |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['problem']} | {r['before_s']:.3f} | {r['after_s']:.3f} | "
              f"{r['added_s']:+.3f} | {r['status_before']} / {r['status_after']} |")  # fmt: skip
    total_before = sum(t for t, _ in old) / len(old)
    total_after = sum(t for t, _ in new) / len(new)
    print(f"mean per evaluation: before {total_before:.3f} s, after {total_after:.3f} s, "
          f"added {total_after - total_before:+.3f} s (median per problem: {mean_added:+.3f} s; "
          "goal <= +0.3 s)")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "walltime.json").write_text(json.dumps(
            {"device": "cuda" if cuda else "cpu", "options": options, "rows": rows,
             "mean_before_s": total_before, "mean_after_s": total_after}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
