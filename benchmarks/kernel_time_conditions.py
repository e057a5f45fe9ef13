"""Diagnosis: why a kernel's CUPTI time in the timed runs can differ from Nsight Compute's
gpu__time_duration.sum. Times the candidate's own kernels of a few evaluate.py cases with each
means at hand (the CUPTI activity trace of either kind, CUDA events, the Range Profiler's
gpu__time_duration with and without a trace running), with the SM clock, power and clock-event
reasons sampled through NVML meanwhile, then runs ncu on the same kernels (also reading the SM
clock it saw). Writes kernel_time_conditions.json/.md.

    python benchmarks/kernel_time_conditions.py --out $OUT/bench        # on the H200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from evaluate import CASES, Case, ncu_values

# case -> prefix of its own kernels' names (cudaforge/examples/)
OWN = {
    "l1_012_diag_matmul": "scale_rows",
    "l1_019_relu": "relu_kernel",
    "l1_088_gelu": "gelu_tanh",
    "l2_001_conv_relu_bias": "relu_bias",
}
# Seen on the H200 (2026-12-02): the SM clock (1980 MHz, no clock-event reason), idle gaps
# before the launch, 1 vs 4 input sets, where the inputs lie (behind 0-62 MB pads) and warming
# the TLBs after the flush change nothing; flushing with writes only or not at all adds ~3 us.
# CUDA events without the CUPTI trace read gelu 214.5 us where the traced runs read 231.5 us:
# on this GPU the activity trace times kernels by instrumenting them (CUPTI's header: hardware
# event timestamps are "only available on Blackwell"), which slows kernels of many short
# blocks. These conditions time the same launches with each means at hand.
# (label, how the kernel is timed)
CONDITIONS = [
    ("as timed: CUPTI activity trace (concurrent kernels)", "cupti"),
    ("CUPTI activity trace, KERNEL kind (serialized)", "cupti_serial"),
    ("CUDA events around the forward, no trace", "events"),
    ("Range Profiler gpu__time_duration, no trace", "range"),
    ("Range Profiler gpu__time_duration + naming trace", "range_named"),
]
DURATION = "gpu__time_duration.sum"


class Clocks:
    """NVML samples (SM MHz, power W, clock-event reasons) every ~2 ms while running."""

    def __init__(self):
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[int, float, int]] = []
        self.running = False

    def __enter__(self):
        self.samples, self.running = [], True
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()
        return self

    def loop(self):
        n, h = self.nvml, self.handle
        while self.running:
            reasons = n.nvmlDeviceGetCurrentClocksEventReasons(h)
            self.samples.append(
                (n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetPowerUsage(h) / 1e3,
                 reasons)
            )  # fmt: skip
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {}
        sm = [s[0] for s in self.samples]
        power = [s[1] for s in self.samples]
        reasons = sorted({s[2] for s in self.samples})
        return {"samples": len(sm), "sm_mhz_median": statistics.median(sm), "sm_mhz_min": min(sm),
                "power_w_median": statistics.median(power), "reasons": reasons}  # fmt: skip


def measure(case: Case, seconds: float) -> list[dict]:
    import torch

    from cudaforge import _core
    from cudaforge.cuda import libs as _libs
    from cudaforge.profiling.profiler import l2_flush

    _libs.ensure("cupti")
    problem = case.problem()
    module = problem.build_module()
    namespace: dict = {"__name__": "candidate"}
    exec(compile(case.source("fast"), f"{case.name}.py", "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    model = namespace["ModelNew"](*module.get_init_inputs()).cuda()
    sets = [problem.make_inputs(k, "cuda", module) for k in range(4)]
    flush = l2_flush(0)
    prefix = OWN[case.name]
    prof = _core.Profiler([DURATION], device=0)
    rows = []
    with torch.no_grad():
        for label, how in CONDITIONS:
            for k in range(8):  # warm
                model(*sets[k % 4])
            torch.cuda.synchronize()
            clocks, events, own = Clocks(), [], []
            if how.startswith("cupti"):
                _core.timing_start(serial=how == "cupti_serial")
            started, i = time.perf_counter(), 0
            with clocks:
                while time.perf_counter() - started < seconds:
                    k = i % 4
                    fresh = problem.make_inputs(1000 + i, "cuda", module)
                    for dst, src in zip(sets[k], fresh, strict=True):
                        if torch.is_tensor(dst):
                            dst.copy_(src)
                    i += 1
                    if how.startswith("range"):  # the flush runs as `before`, outside the range
                        ranges = prof.profile(lambda k=k: model(*sets[k]), max_kernels=64,
                                              replay="user", keep=True, before=flush,
                                              names=how == "range_named")  # fmt: skip
                        mine = [r for r in ranges if (r["name"] or "").startswith(prefix)]
                        # unnamed: the own kernel is the forward's last launch in these cases
                        pick = mine[-1] if mine else ranges[-1]
                        own.append(pick["metrics"][DURATION] / 1e3)
                        continue
                    flush(i)
                    if how == "events":
                        events.append((torch.cuda.Event(enable_timing=True),
                                       torch.cuda.Event(enable_timing=True)))  # fmt: skip
                        events[-1][0].record()
                    model(*sets[k])  # its output freed at once, as in the timed runs
                    if how == "events":
                        events[-1][1].record()
                    if i % 16 == 0:
                        torch.cuda.synchronize()
                torch.cuda.synchronize()
            if how.startswith("cupti"):
                records = _core.timing_stop()
                own = [r["duration_ns"] / 1e3 for r in records if r["name"].startswith(prefix)]
            elif how == "events":
                own = [s.elapsed_time(e) * 1e3 for s, e in events]
            row = {"case": case.name, "condition": label, "launches": len(own),
                   "median_us": statistics.median(own) if own else None,
                   "mean_us": statistics.fmean(own) if own else None,
                   "min_us": min(own) if own else None, **clocks.summary()}  # fmt: skip
            rows.append(row)
            print(f"{case.name} | {label}: {row['median_us']:.2f} us median, {row['mean_us']:.2f} "
                  f"mean ({len(own)} launches); SM {row.get('sm_mhz_median')} MHz (min "
                  f"{row.get('sm_mhz_min')}), {row.get('power_w_median')} W, reasons "
                  f"{row.get('reasons')}", flush=True)  # fmt: skip
    _core.profiler_release()  # ncu needs the counters
    return rows


def ncu(case: Case, cache: str, sets: int) -> dict:
    time_m, clock_m = "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second"
    found = ncu_values(case, [OWN[case.name]], [time_m, clock_m], cache=cache, sets=sets,
                       timeout=600)  # fmt: skip
    if "error" in found:
        return found
    t = [v for per in found.values() for v in per.get(time_m, [])]
    f = [v for per in found.values() for v in per.get(clock_m, [])]
    return {"cache": cache, "sets": sets, "median_us": statistics.median(t) if t else None,
            "mean_us": statistics.fmean(t) if t else None,
            "sm_mhz_median": statistics.median(f) if f else None, "n": len(t)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench-out")
    p.add_argument("--seconds", type=float, default=0.5, help="per condition")
    p.add_argument("--cases", default=",".join(OWN))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    by_name = {c.name: c for c in CASES}
    rows, ncu_rows = [], []
    for name in args.cases.split(","):
        rows += measure(by_name[name], args.seconds)
    for name in args.cases.split(","):
        for cache, sets in (("all", 4),):
            got = {"case": name, **ncu(by_name[name], cache, sets)}
            ncu_rows.append(got)
            print(f"ncu {name} cache-control {cache}, {sets} input set(s): {got}", flush=True)
    (out / "kernel_time_conditions.json").write_text(
        json.dumps({"conditions": rows, "ncu": ncu_rows}, indent=2)
    )
    lines = ["| case | condition | median us | mean us | SM MHz | W | clock-event reasons |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['case']} | {r['condition']} | {r['median_us']:.2f} | "
                     f"{r['mean_us']:.2f} | {r.get('sm_mhz_median')} | {r.get('power_w_median')}"
                     f" | {r.get('reasons')} |")  # fmt: skip
    for r in ncu_rows:
        lines.append(f"| {r['case']} | ncu --cache-control {r.get('cache')}, {r.get('sets')} "
                     f"input set(s) | "
                     f"{r.get('median_us')} | {r.get('mean_us')} | {r.get('sm_mhz_median')} | - "
                     f"| - |")  # fmt: skip
    (out / "kernel_time_conditions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
