"""How steady is the host's speed? A host-paced forward's time is the host's time to issue it, so
a machine whose CPU slows down moves end-to-end figures by as much.

In one fresh process, every `--every` seconds for `--seconds` per phase: the host's time to issue
one eager forward of a model (median of 10, launches queued behind a spin so that the GPU never
holds the host back; models_optimize.gpu_and_host), and beside it what the machine says of
itself: the share of CPU time stolen from this machine by its hypervisor (/proc/stat "steal"),
its load average, the mean CPU clock (/proc/cpuinfo), and this process's own CPU use and
thread count. Phases: the process alone; with cudaforge's default worker pool started and idle
(its spare workers hold CUDA contexts); after the pool is closed.

    python benchmarks/host_drift.py --model resnet50 --seconds 20 --out DIR      # GPU
    python benchmarks/host_drift.py --model mlp --small --seconds 2              # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def cpu_times() -> dict:
    """The machine's CPU time counters (/proc/stat, all CPUs), in clock ticks."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    return {n: int(v) for n, v in zip(names, fields)}


def steal_share(before: dict, after: dict) -> float | None:
    """The share of the machine's CPU time stolen between two cpu_times() readings."""
    total = sum(after.values()) - sum(before.values())
    return (after["steal"] - before["steal"]) / total if total > 0 else None


def mean_mhz() -> float | None:
    """The mean of the "cpu MHz" lines of /proc/cpuinfo; None where there are none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    values = [float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")]
    return statistics.fmean(values) if values else None


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def sample(step, gpu_and_host) -> dict:
    cpu0, own0, wall0 = cpu_times(), own_cpu_s(), time.perf_counter()
    got = gpu_and_host({"step": step}, reps=10)["step"]
    cpu1, own1, wall1 = cpu_times(), own_cpu_s(), time.perf_counter()
    return {
        **got,
        "steal": steal_share(cpu0, cpu1),
        "own_cpu_share": (own1 - own0) / (wall1 - wall0),
        "threads": len(os.listdir("/proc/self/task")),
        "loadavg_1m": os.getloadavg()[0],
        "mhz": mean_mhz(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch
    from models_hotspots import build
    from models_optimize import forward_of, gpu_and_host

    from cudaforge.harness import pool as pools

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.model == "mlp":  # no torchvision or transformers needed
        width = 64 if args.small else 4096
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)]).to(device)
        inputs = (torch.randn(16, width, device=device),)
    else:
        model, inputs = build(args.model, device, small=args.small)
    step = forward_of(model, inputs)
    for _ in range(3):
        step()
    rows = []
    for phase in ("alone", "pool started", "pool closed"):
        if phase == "pool started":
            pools.default_pool()
        elif phase == "pool closed" and pools._default is not None:
            pools._default.close()
        began = time.perf_counter()
        while time.perf_counter() - began < args.seconds:
            row = {
                "phase": phase,
                "t": round(time.perf_counter() - began, 1),
                **sample(step, gpu_and_host),
            }
            rows.append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                  flush=True)  # fmt: skip
            time.sleep(args.every)
    hosts = [r["host_ms"] for r in rows]
    summary = {"model": args.model, "device": device, "samples": len(rows),
               "host_ms_min": min(hosts), "host_ms_median": statistics.median(hosts),
               "host_ms_max": max(hosts)}  # fmt: skip
    print(f"== host ms to issue one {args.model} forward: {summary}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_drift.json").write_text(
            json.dumps({"summary": summary, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
