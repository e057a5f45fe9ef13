"""`cudaforge.optimize` on real architectures with kernels from an LLM, measured end to end.

Per model (GPT-2 and ResNet-50 by default, built as benchmarks/models_hotspots.py builds them:
bf16, random weights): optimize() with the given LLM for --rounds rounds per hot spot, one
transcript per hot spot under OUT/<model>/transcripts (a later run resumes them) and the kernels
in OUT/store.sqlite3. With `file:DIR?wait=0` a run stops where a reply is not written yet: it
prints the prompt files and exits 4; run it again once they are answered.

With --measure (also while replies are pending: what is verified so far), per model, side by
side in one process (medians of interleaved runs, CUDA events):
- inference: eager, the optimized model, torch.compile(model), torch.compile(optimized), and
  torch.compile of a copy where cudaforge.choose_under_compile let the kernels that lose to
  Inductor's own code for their hot spot step aside under compile;
- GPT-2 also a training step (forward, backward, AdamW step; dropout off so the two agree): the
  model with the stored kernels (forward and backward) applied by cudaforge.load(training=True)
  against eager, and the
  gradients of one step compared;
- store and reuse: cudaforge.load() of a fresh copy, in seconds, with no LLM;
- with --graphs also eager and the optimized model replayed as one CUDA graph each
  (cudaforge.graphed), and torch.compile's reduce-overhead mode of both (for host-paced models).

    python benchmarks/models_optimize.py gpt2 resnet50 --rounds 3 \\
        --llm "file:benchmarks/runs/models/llm?wait=0" --out benchmarks/runs/models     # GPU
    python benchmarks/models_optimize.py --render --rounds 3 \\
        --llm "file:benchmarks/runs/models/llm?wait=0" --out benchmarks/runs/models     # CPU

GPT-2 (and the Llama decoder) also get a second optimize() in training mode, for the training
step's kernels: backward problems (cudaforge.model.backward), and forward problems of the
training model. It shares the inference run's transcripts: a forward problem the same in both
models resumes its loop or takes its stored kernel; one the training model changes (its dropout
modules in training mode) gets its own transcript beside it, named with its problem's hash.

--render (no GPU needed): resumes every recorded hot-spot transcript just far enough to write
the prompts its new replies lead to (a Judge's reply leads to the Coder's next prompt); the
candidates they bring are evaluated by the next GPU run.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from models_hotspots import build

import cudaforge

MODELS = ("gpt2", "resnet50", "llama", "vit_b_16")
EXIT_WAITING = 4


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_side_by_side(fns: dict, reps: int = 30, warmup: int = 3, samples_out=None) -> dict:
    """Median ms of each callable, their runs interleaved (a, b, c, a, b, c, ...), CUDA events;
    every run's ms into `samples_out` (a dict) when given."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    settle_site_graphs(fns)
    _sync()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end))
            else:
                began = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - began) * 1e3)
    if samples_out is not None:
        samples_out.update(samples)
    return {name: statistics.median(values) for name, values in samples.items()}


def speedups_over(base: str, samples: dict) -> dict:
    """Per other callable: its speedup over `base` (ratio of medians) and that ratio's bounds
    from the two medians' 95% intervals (None with too few runs)."""
    from cudaforge.harness.stopping import median_interval, ratio_interval

    bounds = {name: median_interval(values) for name, values in samples.items()}
    found = {}
    for name, values in samples.items():
        if name == base:
            continue
        ratio = statistics.median(samples[base]) / statistics.median(values)
        both = ratio_interval(bounds[base], bounds[name])  # None without both intervals
        found[name] = {"speedup": ratio, "low": both[0] if both else None,
                       "high": both[1] if both else None}  # fmt: skip
    return found


def said_speedups(found: dict) -> str:
    """speedups_over's result as one line: "name 1.234x (1.100-1.300), ..."."""
    return ", ".join(f"{k} {v['speedup']:.3f}x" + (f" ({v['low']:.3f}-{v['high']:.3f})"
                                                   if v["low"] else "")
                     for k, v in found.items())  # fmt: skip


def gpu_and_host(fns: dict, reps: int = 10, spin_cycles: int = 80_000_000) -> dict:
    """Per callable, medians of: its GPU time with every launch queued ahead (behind a spin of
    spin_cycles, 80M about 40 ms on the H200, so the GPU never waits for the host) and the
    host's time to issue it (the wall time of the call while the GPU is still spinning). A
    forward whose host time exceeds its GPU time is paced by the host: kernels that cut GPU time
    do not shorten it. Without a GPU, the host's time only."""
    found = {}
    for name, fn in fns.items():
        gpu, host = [], []
        for _ in range(reps):
            if not torch.cuda.is_available():  # the host's time only
                began = time.perf_counter()
                fn()
                host.append((time.perf_counter() - began) * 1e3)
                continue
            torch.cuda._sleep(spin_cycles)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            began = time.perf_counter()
            start.record()
            fn()
            end.record()
            host.append((time.perf_counter() - began) * 1e3)
            end.synchronize()
            gpu.append(start.elapsed_time(end))
        found[name] = {"host_ms": statistics.median(host)}
        if gpu:
            found[name]["gpu_ms"] = statistics.median(gpu)
    return found


def _logits(out):
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out[0]


def forward_of(model, inputs):
    """A no-grad forward of model on inputs: positional (a tuple) or keyword (a dict)."""

    def call():
        with torch.no_grad():
            return model(**inputs) if isinstance(inputs, dict) else model(*inputs)

    call.model = model  # for process_state
    return call


def training_model(name: str, device, small: bool):
    """The model for the training step: dropout off (so that two models' steps can be compared)."""
    model, inputs = build(name, device, small=small)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.train(), inputs


def train_step(model, inputs, optimizer):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = _logits(model(*inputs)).float().square().mean()
        loss.backward()
        optimizer.step()
        return loss

    return step


def gradient_error(model_a, model_b, inputs) -> tuple[float, float]:
    """(max relative error of any parameter's gradient, of the loss) after one backward each."""
    losses = []
    for model in (model_a, model_b):
        model.zero_grad(set_to_none=True)
        loss = _logits(model(*inputs)).float().square().mean()
        loss.backward()
        losses.append(loss.item())
    worst = 0.0
    for (name, p), q in zip(model_a.named_parameters(), model_b.parameters()):
        if p.grad is None or q.grad is None:
            continue
        scale = p.grad.float().abs().max().item() or 1.0
        worst = max(worst, (p.grad.float() - q.grad.float()).abs().max().item() / scale)
    return worst, abs(losses[0] - losses[1]) / (abs(losses[0]) or 1.0)


def optimize_training(name: str, device, store, args) -> dict:
    """optimize(training=True) of the training model (the module docstring): its forward and
    backward kernels from the LLM: every loop resumes (a forward problem the inference run
    finished re-evaluates its recorded best), none takes a stored kernel instead."""
    model, inputs = training_model(name, device, args.small)
    began = time.perf_counter()
    result = cudaforge.optimize(
        model, inputs, llm=args.llm, rounds=args.rounds, training=True,
        transcripts=Path(args.out) / name / "transcripts", store=store,
        reuse=False, max_hotspots=args.max_hotspots, min_share=args.min_share,
    )  # fmt: skip
    print(result.report(), flush=True)
    return {"optimize_s": time.perf_counter() - began, **result.to_dict()}


def run_model(name: str, args) -> dict:
    out = Path(args.out) / name
    store = Path(args.out) / "store.sqlite3"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, inputs = build(name, device, small=args.small)
    began = time.perf_counter()
    result = cudaforge.optimize(
        model, inputs, llm=args.llm, rounds=args.rounds, transcripts=out / "transcripts",
        store=store, reuse=False, max_hotspots=args.max_hotspots, min_share=args.min_share,
    )  # fmt: skip
    report = {"model": name, "optimize_s": time.perf_counter() - began, **result.to_dict()}
    print(result.report(), flush=True)
    if name in ("gpt2", "llama") and not args.no_training:
        try:
            report["training_optimize"] = optimize_training(name, device, store, args)
        except cudaforge.CudaforgeError as exc:  # the measurements below still run
            report["training_optimize"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"== {name} training optimize: {report['training_optimize']['error']}",
                  flush=True)  # fmt: skip
    if not args.measure:  # with --measure, what is verified so far is measured, replies pending
        return report
    optimized = result.model
    fns = {"eager": forward_of(model, inputs), "cudaforge": forward_of(optimized, inputs)}
    if args.site_graphs and device == "cuda":
        fns["cudaforge, site graphs"] = with_site_graphs(optimized, fns["cudaforge"])
    if args.host_after and device == "cuda":
        report["host_after_optimize"] = host_after_optimize(fns["eager"])
    compiled = {}
    if device == "cuda" and not args.no_compile:
        # a copy whose kernels that lose to Inductor's code for their hot spot step aside under
        # compile (choosing resets dynamo: done before anything below is compiled)
        chosen = copy.deepcopy(optimized)
        choose_under_compile(chosen, inputs, report)
        began = time.perf_counter()
        compiled["compile"] = forward_of(torch.compile(model), inputs)
        compiled["compile(cudaforge)"] = forward_of(torch.compile(optimized), inputs)
        compiled["compile(cudaforge, chosen)"] = forward_of(torch.compile(chosen), inputs)
        if args.site_graphs:
            compiled["compile(cudaforge, site graphs)"] = with_site_graphs(
                optimized, compiled["compile(cudaforge)"])  # fmt: skip
        if args.graphs:  # Inductor's CUDA graphs, its answer to a host-paced forward
            ro = "reduce-overhead"
            compiled[f"compile({ro})"] = forward_of(torch.compile(model, mode=ro), inputs)
            compiled[f"compile(cudaforge, {ro})"] = forward_of(torch.compile(optimized, mode=ro),
                                                              inputs)  # fmt: skip
        for fn in compiled.values():
            fn()
        report["compile_s"] = time.perf_counter() - began
    if device == "cuda" and args.graphs:  # each forward replayed as one CUDA graph
        compiled["eager+graph"] = forward_of(cudaforge.graphed(model, inputs), inputs)
        compiled["cudaforge+graph"] = forward_of(cudaforge.graphed(optimized, inputs), inputs)
    samples: dict = {}
    ms = time_side_by_side({**fns, **compiled}, reps=args.reps, samples_out=samples)
    report["end_to_end_ms"] = ms
    report["speedups_over_eager"] = speedups_over("eager", samples)
    print(f"== {name} inference, ms per forward (medians, interleaved): {ms}", flush=True)
    said = said_speedups(report["speedups_over_eager"])
    print(f"== {name} inference, speedup over eager (95% interval): {said}", flush=True)
    if device == "cuda":
        report["gpu_and_host_ms"] = gpu_and_host({**fns, **compiled})
        print(f"== {name} GPU time with launches queued ahead / host time to issue, ms: "
              f"{report['gpu_and_host_ms']}", flush=True)  # fmt: skip
    if args.site_graphs and device == "cuda":
        report["site_graphs"] = said_site_graphs(name, optimized, fns["cudaforge, site graphs"])
    del compiled
    if args.keep_all and device == "cuda":
        report["every_kernel"] = every_kernel(name, device, store, inputs, fns["eager"], args)
    if not args.no_load:
        load_fresh(name, device, store, inputs, report, args)
    if name in ("gpt2", "llama") and not args.no_training:
        try:
            report["training"] = measure_training(name, device, store, args)
        except cudaforge.CudaforgeError as exc:
            report["training"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"== {name} training step: {report['training']['error']}", flush=True)
    return report


def _children_cpu_s() -> tuple[int, float]:
    """(count, CPU seconds used so far) of this process's child processes (Linux /proc)."""
    me, count, ticks = os.getpid(), 0, 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid
            count += 1
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return count, ticks / os.sysconf("SC_CLK_TCK")


def process_state(step) -> dict:
    """What in this process could slow a forward's host side: a profiler left on, threads, hooks
    or replaced forwards on modules, the caching allocator's device calls over 10 calls."""
    import threading

    from torch.nn.modules import module as modules

    model = getattr(step, "model", None)
    found = {
        "profiler_enabled": torch.autograd._profiler_enabled(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "global_hooks": len(modules._global_forward_hooks) + len(modules._global_forward_pre_hooks),
        "grad_enabled": torch.is_grad_enabled(),
        "gc_objects": len(gc.get_objects()),
    }
    if model is not None:
        found["module_hooks"] = sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                                    for m in model.modules())  # fmt: skip
        found["replaced_forwards"] = sum("forward" in vars(m) for m in model.modules())
    if torch.cuda.is_available():
        before = torch.cuda.memory_stats()
        for _ in range(10):
            step()
        _sync()
        after = torch.cuda.memory_stats()
        for key in ("num_alloc_retries", "num_device_alloc", "num_device_free"):
            found[key] = after.get(key, 0) - before.get(key, 0)
    return found


def host_after_optimize(eager) -> list:
    """Eager's host time to issue a forward (gpu_and_host) right after optimize() returned, then
    5 and 15 s later, then once the default worker pool is closed; with the pool's child
    processes and the CPU they used meanwhile: whether what optimize leaves running slows the
    user's own forward."""
    from cudaforge.harness import pool as pools

    print(f"== the process after optimize: {process_state(eager)}", flush=True)
    print(host_profile(eager, steps=5, top=15), flush=True)
    rows, began = [], time.perf_counter()
    steps = (("at once", 0), ("5 s later", 5), ("15 s later", 10), ("gc.collect()", 0),
             ("pool closed", 0))  # fmt: skip
    for label, wait in steps:
        if label == "pool closed" and pools._default is not None:
            pools._default.close()
        if label == "gc.collect()":
            gc.collect()
        time.sleep(wait)
        before = _children_cpu_s()
        got = gpu_and_host({"eager": eager}, reps=20)["eager"]
        after = _children_cpu_s()
        rows.append({"when": label, "s": round(time.perf_counter() - began, 1), **got,
                     "children": after[0], "children_cpu_s": round(after[1] - before[1], 3)})  # fmt: skip
        print(f"== eager after optimize, {label}: {rows[-1]}", flush=True)
    return rows


def load_fresh(name, device, store, inputs, report, args) -> None:
    """cudaforge.load() of a fresh copy of the model: the stored kernels verified again, timed."""
    fresh, _ = build(name, device, small=args.small)
    began = time.perf_counter()
    try:
        loaded = cudaforge.load(fresh, inputs, store=store, max_hotspots=args.max_hotspots,
                                min_share=args.min_share)  # fmt: skip
        report["load_swapped"] = [h.name for h in loaded.swapped]
        report["load_phase_s"] = loaded.phase_seconds  # where load()'s seconds go
        del loaded
    except cudaforge.CudaforgeError as exc:
        report["load_error"] = f"{type(exc).__name__}: {exc}"
    report["load_s"] = time.perf_counter() - began
    print(f"== {name} load: {report['load_s']:.1f} s ({report.get('load_phase_s')}), swapped "
          f"{report.get('load_swapped')} {report.get('load_error', '')}", flush=True)  # fmt: skip


def every_kernel(name, device, store, inputs, eager, args) -> dict:
    """Where a model with every stored kernel in loses time (--keep-all): load() of a fresh
    copy with min_speedup=0 (no kernel taken out), against eager: interleaved medians, GPU and
    host time, GPU time by kernel and host time by Python function."""
    fresh, _ = build(name, device, small=args.small)
    loaded = cudaforge.load(fresh, inputs, store=store, max_hotspots=args.max_hotspots,
                            min_share=args.min_share, min_speedup=0)  # fmt: skip
    fns = {"eager": eager, "cudaforge (every kernel)": forward_of(loaded.model, inputs)}
    found = {
        "swapped": [h.name for h in loaded.swapped],
        "ms": time_side_by_side(fns, reps=args.reps),
        "gpu_and_host_ms": gpu_and_host(fns),
        "kernels_ms": {side: step_kernels(fn, top=16) for side, fn in fns.items()},
    }
    print(f"== {name} with every kernel: {found['ms']}; GPU / host: {found['gpu_and_host_ms']}")
    for side, fn in fns.items():
        print_kernels(f"== {name}, {side}: GPU ms per forward by kernel (top 16)",
                      found["kernels_ms"][side])  # fmt: skip
        print(f"== {name}, {side}: host time by Python function (cProfile)")
        print(host_profile(fn, steps=10, top=18), flush=True)
    return found


def measure_training(name: str, device, store, args) -> dict:
    eager, inputs = training_model(name, device, args.small)
    mine = copy.deepcopy(eager)
    loaded = cudaforge.load(mine, inputs, store=store, training=True, inplace=True,
                            max_hotspots=args.max_hotspots, min_share=args.min_share)  # fmt: skip
    grad_err, loss_err = gradient_error(eager, mine, inputs)
    steps = {
        "eager": train_step(eager, inputs, torch.optim.AdamW(eager.parameters(), lr=1e-5)),
        "cudaforge": train_step(mine, inputs, torch.optim.AdamW(mine.parameters(), lr=1e-5)),
    }
    ms = time_side_by_side(steps, reps=max(5, args.reps // 3))
    paced = gpu_and_host(steps, spin_cycles=400_000_000) if device == "cuda" else {}
    report = {
        "swapped": [h.name for h in loaded.swapped],
        "step_ms": ms,
        "speedup": ms["eager"] / ms["cudaforge"],
        "max_rel_grad_err": grad_err,
        "rel_loss_err": loss_err,
        "gpu_and_host_ms": paced,
    }
    print(f"== {name} training step: {report}", flush=True)
    if device == "cuda":
        report["step_kernels_ms"] = {side: step_kernels(fn) for side, fn in steps.items()}
        for side, top in report["step_kernels_ms"].items():
            print_kernels(f"== {name} training step, {side}: GPU ms per step by kernel (top 12)",
                          top)  # fmt: skip
        for side, fn in steps.items():
            print(f"== {name} training step, {side}: host time by Python function (cProfile)")
            print(host_profile(fn), flush=True)
    return report


def step_kernels(step, steps: int = 2, top: int = 12) -> list:
    """[(kernel name, GPU ms per step)] of the `top` kernels by time over `steps` steps (where
    a training step's time goes, eager against swapped)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    _sync()
    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        _sync()
    rows = []
    for event in prof.key_averages():
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us > 0:
            rows.append((event.key[:110], us / 1000 / steps))
    rows.sort(key=lambda row: -row[1])
    total = sum(kernel_ms for _, kernel_ms in rows)
    return [("(all kernels)", total)] + rows[:top]


def kernel_tables(fns: dict, report: dict, title: str, top: int) -> None:
    """step_kernels of each variant into report["kernels_ms"], printed under title % variant."""
    for variant, fn in fns.items():
        rows = step_kernels(fn, steps=3, top=top)
        report.setdefault("kernels_ms", {})[variant] = rows
        print_kernels(title % variant, rows)


def print_kernels(title: str, rows: list) -> None:
    """step_kernels' rows under a title, one kernel a line."""
    print(title)
    for kernel, kernel_ms in rows:
        print(f"  {kernel_ms:8.3f}  {kernel}")


def host_profile(step, steps: int = 3, top: int = 14) -> str:
    """The `top` functions by own host time over `steps` calls of `step` (cProfile): where a
    host-paced step's time goes."""
    import cProfile
    import io
    import pstats

    step()
    _sync()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    _sync()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def choose_under_compile(model, inputs, report: dict) -> None:
    """cudaforge.choose_under_compile on `model`, its rows and seconds into `report`."""
    began = time.perf_counter()
    choices = cudaforge.choose_under_compile(model, inputs, say=print)
    report["under_compile"] = [c.to_dict() for c in choices]
    report["choose_s"] = time.perf_counter() - began


def compile_check(name: str, args) -> dict:
    """The stored kernels applied by load(), cudaforge.choose_under_compile, then
    torch.compile(model) against torch.compile of the model with the chosen kernels, side by
    side: compile plus cudaforge against compile alone, with no LLM and no search beyond load's."""
    device = "cuda"
    model, inputs = build(name, device)
    began = time.perf_counter()
    loaded = cudaforge.load(copy.deepcopy(model), inputs, store=Path(args.out) / "store.sqlite3",
                            max_hotspots=args.max_hotspots, min_share=args.min_share)  # fmt: skip
    report = {"model": name, "load_s": time.perf_counter() - began,
              "swapped": [h.name for h in loaded.swapped]}  # fmt: skip
    choose_under_compile(loaded.model, inputs, report)
    fns = {
        "compile": forward_of(torch.compile(model), inputs),
        "compile(cudaforge, chosen)": forward_of(torch.compile(loaded.model), inputs),
    }
    for fn in fns.values():
        fn()
    report["end_to_end_ms"] = time_side_by_side(fns, reps=args.reps)
    report["gpu_and_host_ms"] = gpu_and_host(fns)
    print(f"== {name} under torch.compile: {report['end_to_end_ms']}; GPU / host: "
          f"{report['gpu_and_host_ms']}", flush=True)  # fmt: skip
    if args.kernels:  # where each variant's GPU time goes, kernel by kernel
        fns = {"eager": forward_of(model, inputs), **fns}
        attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
        print(f"== {name}: attention implementation {attention!r}", flush=True)
        kernel_tables(fns, report, f"== {name}, %s: GPU ms per forward by kernel", args.kernels)
    return report


ATTENTION = ["scaled_dot_product_attention"]  # the hot spots --for-compile asks for (label text)


def compiled_call(name: str, device, small: bool):
    """(model, keyword inputs) for --for-compile: use_cache=False given, so that eager, the
    search and torch.compile all call the attention layers without a key/value cache."""
    model, inputs = build(name, device, small=small)
    return model, {"input_ids": inputs[0], "use_cache": False}


def for_compile_run(name: str, args) -> dict:
    """optimize(for_compile=True) on the attention calls torch.compile's graph makes (Hugging
    Face masks built as under compile), then, with --measure, torch.compile(model) against
    torch.compile of the optimized model (after choose_under_compile), side by side."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, call = compiled_call(name, device, args.small)
    out = Path(args.out) / name
    began = time.perf_counter()
    result = cudaforge.optimize(
        model, call, llm=args.llm, rounds=args.rounds, transcripts=out / "transcripts",
        store=Path(args.out) / "store.sqlite3", reuse=False, targets=ATTENTION, min_share=0.0,
        max_hotspots=args.max_hotspots, for_compile=True,
    )  # fmt: skip
    report = {"model": name, "for_compile": True, "optimize_s": time.perf_counter() - began,
              **result.to_dict()}  # fmt: skip
    print(result.report(), flush=True)
    if not args.measure or device != "cuda":
        return report
    # each kernel against torch.compile of its hot spot alone (no whole-model compiles: two
    # compiles of GPT-2 below are most of this run's time)
    if not args.keep_under_compile:
        choices = cudaforge.choose_under_compile(result.model, say=print)
        report["under_compile"] = [c.to_dict() for c in choices]
    fns = {
        "eager": forward_of(model, call),
        "compile": forward_of(torch.compile(model), call),
        "compile(cudaforge)": forward_of(torch.compile(result.model), call),
    }
    if args.site_graphs:  # the same compiled model, its swapped calls replayed from graphs
        fns["compile(cudaforge, site graphs)"] = with_site_graphs(result.model,
                                                                 fns["compile(cudaforge)"])  # fmt: skip
    if args.graphs:  # Inductor's CUDA graphs: no host time per call on either side
        ro = "reduce-overhead"
        fns[f"compile({ro})"] = forward_of(torch.compile(model, mode=ro), call)
        fns[f"compile(cudaforge, {ro})"] = forward_of(torch.compile(result.model, mode=ro), call)
    expected = _logits(fns["eager"]()).float()
    report["max_abs_err_vs_eager"] = {}
    for variant, fn in fns.items():
        got = _logits(fn()).float()
        report["max_abs_err_vs_eager"][variant] = float((got - expected).abs().max())
    print(f"== {name} --for-compile, max abs error of the logits against eager: "
          f"{report['max_abs_err_vs_eager']}", flush=True)  # fmt: skip
    samples: dict = {}
    report["end_to_end_ms"] = time_side_by_side(fns, reps=args.reps, samples_out=samples)
    report["speedups_over_compile"] = speedups_over("compile", samples)
    print(f"== {name} --for-compile, ms per forward (medians, interleaved): "
          f"{report['end_to_end_ms']}", flush=True)  # fmt: skip
    said = said_speedups(report["speedups_over_compile"])
    print(f"== {name} --for-compile, speedup over torch.compile (95% interval): {said}",
          flush=True)  # fmt: skip
    ro = "compile(reduce-overhead)"
    if ro in samples:  # the kernel against compile, both replayed as CUDA graphs
        pair = {k: samples[k] for k in (ro, "compile(cudaforge, reduce-overhead)")}
        got = speedups_over(ro, pair)
        report["speedup_over_reduce_overhead"] = got["compile(cudaforge, reduce-overhead)"]
        print(f"== {name} --for-compile, over {ro} (95% interval): {said_speedups(got)}",
              flush=True)  # fmt: skip
    report["python_kernel_calls_per_forward"] = calls_from_python(result.model, fns)
    print(f"== {name} --for-compile, swapped calls that ran the kernel's Python per forward "
          f"(0: replayed inside a CUDA graph): {report['python_kernel_calls_per_forward']}",
          flush=True)  # fmt: skip
    report["gpu_and_host_ms"] = gpu_and_host(fns)
    print(f"== {name} --for-compile, GPU time with launches queued ahead / host time to issue, "
          f"ms: {report['gpu_and_host_ms']}", flush=True)  # fmt: skip
    if args.site_graphs:
        report["site_graphs"] = said_site_graphs(f"{name} --for-compile", result.model,
                                                 fns["compile(cudaforge, site graphs)"])  # fmt: skip
    if args.kernels:
        for variant in [v for v in fns if "reduce-overhead" in v]:  # where its host time goes
            print(f"== {name} --for-compile, {variant}: host functions by own time, 10 "
                  f"forwards\n{host_profile(fns[variant], steps=10, top=12)}", flush=True)  # fmt: skip
        compiled = {v: fn for v, fn in fns.items() if v != "eager"}
        kernel_tables(compiled, report, f"== {name} --for-compile, %s: GPU ms per forward by "
                      "kernel", args.kernels)  # fmt: skip
    return report


def with_site_graphs(model, fn):
    """fn with `model`'s swapped sites replaying CUDA graphs (cudaforge.site_graphs) during its
    calls only: the other variants of the same model, timed interleaved with it, run without."""
    from cudaforge.model.swap import GraphSwitch, swaps

    switch = GraphSwitch(swaps(model))
    switch.set(False)

    def call():
        switch.set(True)
        try:
            return fn()
        finally:
            switch.set(False)

    call.site_graphs = switch.graphs
    call.settled_in = None
    return call


def settle_site_graphs(fns: dict) -> int:
    """Rounds of every callable, in the order time_side_by_side runs them, until the site graphs
    of those made by with_site_graphs stopped capturing (site_graphs.settle: sites in a row
    settle one after another, and the allocator's addresses depend on what ran before); the
    rounds it took, also set as each such callable's settled_in."""
    from cudaforge.model.site_graphs import settle

    graphed = [fn for fn in fns.values() if getattr(fn, "site_graphs", None) is not None]
    if not graphed:
        return 0
    every = [g for fn in graphed for g in fn.site_graphs]
    rounds = settle(lambda: [fn() for fn in fns.values()], every)
    for fn in graphed:
        fn.settled_in = rounds
    return rounds


def said_site_graphs(title: str, model, fn) -> list:
    """Each swapped site's graph counts in with_site_graphs' `fn` (replays, captures, calls
    while its outputs were held, why off), printed."""
    from cudaforge.model.swap import swaps

    found = [{"site": swap.site.path, **own.to_dict()}
             for swap, own in zip(swaps(model), fn.site_graphs)]  # fmt: skip
    print(f"== {title}, site graphs (settled in {fn.settled_in} forwards): {found}", flush=True)
    return found


def calls_from_python(optimized, fns: dict, forwards: int = 5) -> dict:
    """Per variant of the optimized model: how many swapped calls ran the kernel's Python
    forward per forward (SwapStats: eager kernel calls and the custom ops' runs); a CUDA
    graph's replay runs none."""
    from cudaforge.model.swap import swaps

    def count() -> int:
        return sum(s.stats.kernel_calls + s.stats.op_calls for s in swaps(optimized))

    found = {}
    for variant, fn in fns.items():
        if "cudaforge" not in variant:
            continue
        before = count()
        for _ in range(forwards):
            fn()
        _sync()
        found[variant] = (count() - before) / forwards
    return found


def _no_evaluation(problem_source, candidate_source):
    """The evaluator of loops started on the CPU: their first prompts need none."""
    raise RuntimeError("a candidate to evaluate: the next GPU run does it")


def start_compile_loops(args) -> list:
    """On the CPU, the first prompts of --for-compile's hot spots (the attention calls of the
    model as torch.compile runs it), named and placed as the GPU run's optimize() names and
    places them, with the GPU's facts from the inference run's transcript of the same site and
    the layout notes optimize() gives. A started loop is left to render(), which resumes it
    with its recorded notes (a full-size search on this machine takes over 15 minutes)."""
    from cudaforge.agents.loop import run_loop
    from cudaforge.agents.resume import RecordedRun, transcript_for
    from cudaforge.model.compile_view import compiled_view
    from cudaforge.model.hotspots import find_hotspots
    from cudaforge.model.swapped_hotspot import layout_notes

    waiting = []
    for name in args.models or ("gpt2",):
        folder = Path(args.out) / name / "transcripts"
        if folder.is_dir() and any(folder.glob("*.jsonl")):
            continue  # started: render() resumes it with its recorded notes
        inference = Path(args.gpu_facts_from) if args.gpu_facts_from else None
        recorded = RecordedRun.read(inference) if inference else None
        gpu = recorded.start.get("gpu", "") if recorded is not None else ""
        model, call = compiled_call(name, "cpu", args.small)
        with compiled_view():
            found = find_hotspots(model, call, targets=ATTENTION, min_share=0.0,
                                  paths=["transformer.h.0.attn"], max_hotspots=1)  # fmt: skip
        for hotspot in found:
            run, transcript = transcript_for(folder, hotspot.name, hotspot.problem_source)
            loop = run_loop(hotspot.problem_source, _no_evaluation, coder=args.llm,
                            rounds=args.rounds, transcript=transcript, name=run, gpu=gpu,
                            notes=layout_notes(hotspot.sites[0]))  # as optimize() gives them
            print(f"{name}/{transcript.stem}: {loop.stop_reason}", flush=True)
            waiting += loop.waiting_for
    return waiting


def start_training_loops(args) -> list:
    """On the CPU, the training run's first prompts for recorded hot spots of GPT-2 (and the
    Llama decoder) whose backward loop has not started: the training model's hot spot at each
    such site extracted here (find_hotspots(paths=...): minutes at full size on a CPU), the loop
    of its backward problem started, and of its forward problem where the training model changes
    it; named and placed as the GPU run's optimize() names and places them, with the GPU's facts
    from the inference transcript. The prompt files still to answer."""
    from cudaforge.agents.loop import run_loop
    from cudaforge.agents.resume import RecordedRun, transcript_file_name, transcript_for
    from cudaforge.model.backward import backward_name, backward_problem
    from cudaforge.model.codegen import NotExtractable
    from cudaforge.model.hotspots import find_hotspots

    waiting = []
    for name in ("gpt2", "llama"):
        report = Path(args.out) / f"{name}.json"
        folder = Path(args.out) / name / "transcripts"
        if not report.is_file():
            continue
        recorded = {h["name"]: h for h in json.loads(report.read_text()).get("hotspots", [])}
        pending = [
            h
            for h in recorded.values()
            if not (folder / f"{transcript_file_name(backward_name(h['name']))}.jsonl").exists()
        ]
        if not pending:
            continue
        print(f"{name}: extracting the training model's hot spots at {len(pending)} site(s) on "
              "this machine", flush=True)  # fmt: skip
        model, inputs = training_model(name, "cpu", args.small)
        paths = [h["sites"][0].replace("(root)", "") for h in pending]
        found = find_hotspots(model, inputs, paths=paths, min_share=0.0, max_hotspots=len(paths))
        for hotspot in found:
            inference = recorded.get(hotspot.name)
            if inference is None:
                continue
            start = RecordedRun.read(Path(inference.get("transcript") or "/nonexistent"))
            gpu = start.start.get("gpu", "") if start is not None else ""
            # the forward problem's loop exists where the training model leaves it unchanged
            loops = [(hotspot.problem_source, hotspot.name)]
            try:
                loops.append((backward_problem(hotspot.problem_source),
                              backward_name(hotspot.name)))  # fmt: skip
            except NotExtractable as exc:
                print(f"{name}/{hotspot.name}: no backward problem: {exc}", flush=True)
            for source, run in loops:
                run, transcript = transcript_for(folder, run, source)  # as optimize() names it
                if transcript.exists():
                    continue
                loop = run_loop(source, _no_evaluation, coder=args.llm, rounds=args.rounds,
                                transcript=transcript, name=run, gpu=gpu)  # fmt: skip
                print(f"{name}/{transcript.stem}: {loop.stop_reason}", flush=True)
                waiting += loop.waiting_for
    return waiting


def render(args) -> int:
    """Resume every hot-spot transcript on this machine until its next prompts are written."""
    from cudaforge.agents.loop import run_loop
    from cudaforge.agents.resume import RecordedRun

    class NeedsGpu(Exception):
        pass

    def no_evaluation(problem_source, candidate_source):
        raise NeedsGpu  # a candidate to evaluate: the next GPU run does it

    waiting = start_compile_loops(args) if args.for_compile else start_training_loops(args)
    for path in sorted(Path(args.out).glob("*/transcripts/*.jsonl")):
        recorded = RecordedRun.read(path)
        if recorded is None:
            continue
        try:
            loop = run_loop(
                recorded.start["problem_source"], no_evaluation, coder=args.llm,
                rounds=args.rounds, transcript=path, name=recorded.start["problem"],
            )  # fmt: skip
        except NeedsGpu:
            print(f"{path.parent.parent.name}/{path.stem}: needs_gpu (a new candidate)", flush=True)
            continue
        print(f"{path.parent.parent.name}/{path.stem}: {loop.stop_reason}", flush=True)
        waiting += loop.waiting_for
    waiting = list(dict.fromkeys(str(p) for p in waiting))  # a started loop is resumed too
    for prompt in waiting:
        print(f"  waiting: {prompt}")
    return EXIT_WAITING if waiting else 0


def _done(code: int, args) -> int:
    """code; after --kernels, the process ends here: on the H200 a process that had profiled
    compiled models with torch.profiler did not exit until killed (17:54 and 18:23 UTC,
    2026-12-04), after everything was printed and written."""
    if args.kernels:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"of {', '.join(MODELS)}; default: gpt2 resnet50")
    parser.add_argument("--llm", required=True, help="e.g. file:benchmarks/runs/models/llm?wait=0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True, help="transcripts, store and results go here")
    parser.add_argument("--max-hotspots", type=int, default=6)
    parser.add_argument("--min-share", type=float, default=0.02)
    parser.add_argument("--measure", action="store_true",
                        help="time end to end, training step, load()")  # fmt: skip
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--graphs", action="store_true",
                        help="also time eager and cudaforge replayed as CUDA graphs "
                        "(cudaforge.graphed), and torch.compile's reduce-overhead mode")  # fmt: skip
    parser.add_argument("--no-training", action="store_true")
    parser.add_argument("--site-graphs", action="store_true",
                        help="also time the optimized model with its swapped calls replayed from "
                        "CUDA graphs (cudaforge.site_graphs), eagerly and under compile")  # fmt: skip
    parser.add_argument("--no-load", action="store_true", help="skip timing load() of a copy")
    parser.add_argument("--host-after", action="store_true",
                        help="eager's host time right after optimize, later, and with the pool "
                             "closed")  # fmt: skip
    parser.add_argument("--keep-all", action="store_true",
                        help="also time a copy with every stored kernel kept, and say where it "
                        "loses time")  # fmt: skip
    parser.add_argument("--render", action="store_true", help="write the next prompts (CPU)")
    parser.add_argument("--small", action="store_true", help="tiny configurations (CPU smoke)")
    parser.add_argument("--compile-check", action="store_true",
                        help="only: load() the stored kernels, choose_under_compile, and time "
                        "torch.compile with and without them (GPU)")  # fmt: skip
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="with --compile-check: the N kernels taking the most GPU time in "
                        "eager, compile and compile with the chosen kernels")  # fmt: skip
    parser.add_argument("--for-compile", action="store_true",
                        help="only: optimize(for_compile=True) on the attention calls of the "
                        "model as torch.compile runs it; with --measure, torch.compile with "
                        "and without the kernels (with --render: its first prompts, CPU)")  # fmt: skip
    parser.add_argument("--keep-under-compile", action="store_true",
                        help="with --for-compile --measure: no choose_under_compile, every "
                        "kernel stays in under compile")  # fmt: skip
    parser.add_argument("--gpu-facts-from", metavar="TRANSCRIPT",
                        help="with --render --for-compile: the GPU facts for the first prompts, "
                        "from an earlier GPU run's transcript")  # fmt: skip
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"no model {', '.join(unknown)}; models: {', '.join(MODELS)}")
    if args.render:
        return render(args)
    if args.compile_check:
        for name in args.models or ("gpt2",):
            report = compile_check(name, args)
            path = Path(args.out) / f"{name}-compile-check.json"
            path.write_text(json.dumps(report, indent=2, default=str))
        return _done(0, args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.for_compile:
        waiting = 0
        for name in args.models or ("gpt2",):
            report = for_compile_run(name, args)
            waiting += len(report.get("waiting_for", []))
            path = Path(args.out) / f"{name}-for-compile.json"
            path.write_text(json.dumps(report, indent=2, default=str))
        return _done(EXIT_WAITING if waiting else 0, args)
    reports, waiting = [], 0
    for name in args.models or ("gpt2", "resnet50"):
        report = run_model(name, args)
        waiting += len(report.get("waiting_for", []))
        waiting += len(report.get("training_optimize", {}).get("waiting_for", []))
        reports.append(report)
        (Path(args.out) / f"{name}.json").write_text(json.dumps(report, indent=2, default=str))
    if waiting:
        print(f"waiting for {waiting} repl(ies): answer them, then run again", flush=True)
        return EXIT_WAITING
    return 0


if __name__ == "__main__":
    sys.exit(main())
