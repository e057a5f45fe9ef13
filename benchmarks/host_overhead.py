"""Does a profiling pass slow the host down for the rest of the process?

cudaforge finds hot spots with torch.profiler in the user's process. Kineto may leave CUPTI
attached after a profiling session ends (the TEARDOWN_CUPTI environment variable decides, per
pytorch/pytorch#144455), and an attached CUPTI adds host time to every launch. The GPT-2 training
step and ResNet-50's forward measured host-paced on the H200 after optimize() (RESULTS.md), so
this measures, per workload, the host's time to issue one call and the GPU time with the launches
queued ahead, in a fresh child process: before any profiling, after a torch.profiler session,
and after cudaforge.find_hotspots; once with TEARDOWN_CUPTI unset and once per value given.

    python benchmarks/host_overhead.py                      # GPU
    python benchmarks/host_overhead.py --teardown 0 1 --json out.json
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
    """In this process: the workload measured fresh, after torch.profiler, after find_hotspots."""
    import torch

    from cudaforge.model.hotspots import find_hotspots

    fn, model, inputs = workload(name, small)
    for _ in range(3):
        fn()
    rows = {"fresh": measure(fn, reps)}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities):
        fn()
    rows["after torch.profiler"] = measure(fn, reps)
    if name != "gpt2_train_step":
        find_hotspots(model, inputs)
        rows["after find_hotspots"] = measure(fn, reps)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--teardown", nargs="*", default=["1"],
                        help="TEARDOWN_CUPTI values to run besides unset")  # fmt: skip
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
    for teardown in [None, *args.teardown]:
        env = dict(os.environ)
        env.pop("TEARDOWN_CUPTI", None)
        if teardown is not None:
            env["TEARDOWN_CUPTI"] = teardown
        label = "TEARDOWN_CUPTI " + ("unset" if teardown is None else f"={teardown}")
        for name in args.workloads:
            cmd = [sys.executable, __file__, "--child", name, "--reps", str(args.reps)]
            cmd += ["--small"] if args.small else []
            done = subprocess.run(
                cmd, check=False, env=env, capture_output=True, text=True, timeout=900
            )
            if done.returncode != 0:
                print(f"{label} {name}: exit {done.returncode}\n{done.stderr[-2000:]}", flush=True)
                continue
            rows = json.loads(done.stdout.strip().splitlines()[-1])
            table[f"{label} | {name}"] = rows
            for phase, row in rows.items():
                cells = ", ".join(f"{key} {value:.2f}" for key, value in row.items())
                print(f"{label:22} {name:18} {phase:22} {cells}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
