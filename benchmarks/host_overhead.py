"""Does a profiling pass slow the host down for the rest of the process?

cudaforge finds hot spots with torch.profiler in the user's process. Kineto leaves CUPTI
attached after a profiling session unless TEARDOWN_CUPTI is "1" when it ends
(pytorch/pytorch#144455), and an attached CUPTI adds host time to every launch; cudaforge sets it
to "1" for its own profiling unless the user set it (cudaforge.model.timing). This measures, per
workload, the host's time to issue one call, the GPU time with the launches queued ahead and the
wall time, in a fresh child process: before any profiling, after cudaforge's find_hotspots, and
after a plain torch.profiler session; with TEARDOWN_CUPTI unset (cudaforge's default) and with
each value given ("0": Kineto's old default, kept by cudaforge), the variants alternating over
--rounds rounds so that drift hits them alike.

    python benchmarks/host_overhead.py --teardown 0 --rounds 2      # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("gpt2_forward", "gpt2_train_step", "resnet50_forward")


def workload(name: str, small: bool):
    """(callable, model, inputs) of one workload, built as models_optimize builds them."""
    import torch
    from models_hotspots import build
    from models_optimize import forward_of, train_step, training_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "gpt2_train_step":
        model, inputs = training_model("gpt2", device, small)
        return (
            train_step(model, inputs, torch.optim.AdamW(model.parameters(), lr=1e-5)),
            model,
            inputs,
        )
    model, inputs = build(name.removesuffix("_forward"), device, small=small)
    return forward_of(model, inputs), model, inputs


def measure(fn, reps: int) -> dict:
    """Medians of host ms to issue one call and GPU ms with the launches queued behind a spin."""
    import torch
    from models_optimize import gpu_and_host, time_side_by_side

    found = gpu_and_host({"x": fn}, reps=reps, spin_cycles=400_000_000)["x"]
    if torch.cuda.is_available():
        found["wall_ms"] = time_side_by_side({"x": fn}, reps=reps)["x"]
    return found


def child(name: str, small: bool, reps: int) -> dict:
    """In this process: the workload measured fresh, after find_hotspots, after torch.profiler."""
    import torch

    from cudaforge.model.hotspots import find_hotspots

    fn, model, inputs = workload(name, small)
    for _ in range(3):
        fn()
    rows = {"fresh": measure(fn, reps)}
    find_hotspots(model, inputs)
    rows["after find_hotspots"] = measure(fn, reps)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities):
        fn()
    rows["after torch.profiler"] = measure(fn, reps)
    rows["env"] = {"TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI", "unset")}
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--teardown", nargs="*", default=["0"],
                        help="TEARDOWN_CUPTI values to run besides unset")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="tiny configs (CPU check)")
    parser.add_argument("--json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.child:
        print(json.dumps(child(args.child, args.small, args.reps)))
        return 0
    table = {}
    for round_ in range(args.rounds):
        for name in args.workloads:
            for teardown in [None, *args.teardown]:
                env = dict(os.environ)
                env.pop("TEARDOWN_CUPTI", None)
                if teardown is not None:
                    env["TEARDOWN_CUPTI"] = teardown
                label = "TEARDOWN_CUPTI " + ("unset" if teardown is None else f"={teardown}")
                cmd = [sys.executable, __file__, "--child", name, "--reps", str(args.reps)]
                cmd += ["--small"] if args.small else []
                done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True,
                                      timeout=900)  # fmt: skip
                if done.returncode != 0:
                    print(f"{label} {name}: exit {done.returncode}\n{done.stderr[-2000:]}")
                    continue
                rows = json.loads(done.stdout.strip().splitlines()[-1])
                table[f"round {round_ + 1} | {label} | {name}"] = rows
                for phase, row in rows.items():
                    if phase == "env":
                        continue
                    cells = ", ".join(f"{key} {value:.2f}" for key, value in row.items())
                    print(f"{round_ + 1} {label:22} {name:17} {phase:21} {cells}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
