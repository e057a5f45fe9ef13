"""Where cudaforge's and ncu's `dram__bytes_write.sum` part ways: one kernel's DRAM writes as each
tool reads them under several conditions, side by side in one run (issue 3's last metric).

    python benchmarks/dram_writes.py --out DIR [--kernels read_sum,relu,vector_add,matmul_naive]

read_sum (a probe: 256 MB read, 33 KB written) writes back what the L2 held dirty when it began,
so its count under each tool measures what that tool's flush leaves.

ncu (a fresh Python under ncu, --cache-control all, --clock-control none, first launch):
    the 24 metrics with kernel replay (as profile_vs_ncu.py), dram__bytes_write.sum alone (one
    pass, nothing restored before it), and the 24 metrics with application replay (no memory
    save/restore: every pass is a new process).
cudaforge (this process, the L2 flushed before each pass with each L2Flush method): the 24
    metrics with user replay (as profile_forward), dram__bytes_write.sum alone, the 24 metrics
    with kernel replay (CUPTI saves and restores the kernel's memory), and the first profile of a
    freshly enabled Range Profiler.
Writes dram_writes.json and dram_writes.md under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import profile_vs_ncu as pvn
from ncu_tools import find_ncu
from profile_vs_ncu import READ, WRITE


def ncu_variants(ncu: str, name: str, metrics: list[str]) -> dict[str, float | None]:
    base = ["--clock-control", "none", "--cache-control", "all"]
    out = {}
    for label, wanted, replay in [
        ("ncu: 24 metrics, kernel replay", metrics, "kernel"),
        ("ncu: dram__bytes_write.sum alone", [WRITE, READ], "kernel"),
        ("ncu: 24 metrics, application replay", metrics, "application"),
    ]:
        values, run, seconds, _ = pvn.ncu_once(
            ncu, wanted, name, ["--child", name], [*base, "--replay-mode", replay]
        )
        out[label] = values.get(WRITE)
        if not values:
            print(f"{name}: {label} gave no values: {(run.stdout + run.stderr)[-800:]}")
        print(f"{name}: {label}: {out[label]} bytes written ({seconds:.1f} s)", flush=True)
    return out


def ours_variants(name: str, collect: list[str], repeats: int) -> dict[str, float]:
    import cudaforge.profiling.profiler as prof
    from cudaforge import _core

    forward, *_ = pvn.setup(name)
    out = {}
    for method in sorted(prof.L2_FLUSH_METHODS):
        flush = prof.l2_flush(0, method)
        for label, metrics, replay, fresh in [
            ("24 metrics, user replay", collect, "user", False),
            ("dram__bytes_write.sum alone", [WRITE, READ], "user", False),
            ("24 metrics, kernel replay", collect, "kernel", False),
            ("24 metrics, first profile after enable", collect, "user", True),
        ]:
            p = _core.Profiler(metrics, device=0)
            got = []
            try:
                if not fresh:
                    p.profile(forward, replay=replay, keep=True, names=False, before=flush)
                for _ in range(1 if fresh else repeats):
                    ranges = p.profile(forward, replay=replay, keep=True, names=False, before=flush)
                    got.append(ranges[0]["metrics"][WRITE])
            finally:
                _core.profiler_release()
            key = f"cudaforge {method} flush: {label}"
            out[key] = statistics.median(got)
            print(f"{name}: {key}: {got}", flush=True)
    return out


def fresh_variants(name: str, repeats: int) -> dict[str, float]:
    import cudaforge.profiling.profiler as prof
    from cudaforge import _core

    flush = prof.l2_flush(0, "discard")
    kept, got = [], []  # the older buffers stay allocated: each setup gets new memory
    p = _core.Profiler([WRITE, READ], device=0)
    try:
        for _ in range(repeats + 1):
            forward, *_ = pvn.setup(name)
            kept.append(forward)
            ranges = p.profile(forward, replay="user", keep=True, names=False, before=flush)
            got.append(ranges[0]["metrics"][WRITE])
    finally:
        _core.profiler_release()
    out = {"cudaforge discard flush: alone, new buffers each time": statistics.median(got[1:])}
    print(f"{name}: new buffers each time: {got} (the first left out)", flush=True)
    child = []
    for _ in range(repeats):
        run = subprocess.run([sys.executable, __file__, "--child", name], check=False,
                             capture_output=True, text=True)  # fmt: skip
        if run.returncode != 0:
            print(f"{name}: fresh process failed: {run.stderr[-800:]}", flush=True)
            continue
        child.append(json.loads(run.stdout.strip().splitlines()[-1])["written"])
    print(f"{name}: fresh process, first launch: {child}", flush=True)
    if child:
        key = "cudaforge discard flush: alone, fresh process, first launch"
        out[key] = statistics.median(child)
    return out


def child(name: str) -> None:
    """A fresh Python: the Range Profiler's first profile spent on a torch kernel, then the
    kernel's first launch profiled, as ncu profiles it."""
    import torch

    import cudaforge.profiling.profiler as prof
    from cudaforge import _core
    from cudaforge.cuda import libs as _libs

    _libs.ensure("cupti")
    flush = prof.l2_flush(0, "discard")
    p = _core.Profiler([WRITE, READ], device=0)
    z = torch.zeros(1 << 20, device="cuda")
    p.profile(lambda: z.add_(1), replay="user", keep=True, names=False, before=flush)
    forward, *_ = pvn.setup(name)
    ranges = p.profile(forward, replay="user", keep=True, names=False, before=flush)
    _core.profiler_release()
    print(json.dumps({"written": ranges[0]["metrics"][WRITE]}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/out")
    parser.add_argument("--kernels", default="read_sum,relu,vector_add,matmul_naive")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fresh-only", action="store_true", help="only the new-buffer variants")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0

    import torch

    import cudaforge.profiling.profiler as prof

    ncu = find_ncu()
    plan = prof.check_metrics(prof.METRICS, "GH100")
    ncu_metrics = [*prof.METRICS, *plan.substitutes.values()]
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": torch.cuda.get_device_name(0), "ncu": ncu, "kernels": {}}  # fmt: skip
    for name in args.kernels.split(","):
        row = {} if args.fresh_only else ours_variants(name, plan.collect, args.repeats)
        row.update(fresh_variants(name, args.repeats))
        if ncu and not args.fresh_only:
            row.update(ncu_variants(ncu, name, ncu_metrics))
        report["kernels"][name] = row
    lines = [f"# {WRITE}: conditions side by side", "",
             f"{report['date']}, {report['device']}, ncu {ncu or 'not found'}", "",
             "| kernel | condition | bytes written |", "| --- | --- | --- |"]  # fmt: skip
    for name, row in report["kernels"].items():
        for label, value in row.items():
            lines.append(f"| {name} | {label} | {'-' if value is None else f'{value:.6g}'} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dram_writes.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "dram_writes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
