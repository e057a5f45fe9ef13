"""Compile and launch cost: cudaforge.compile (NVRTC) against torch's load_inline (nvcc), and the
Python-to-GPU launch overhead of a trivial kernel against torch eager's own dispatch.

Run on a GPU machine:  python benchmarks/compile_and_launch.py --out results/
Writes compile_and_launch.json and .md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ADD_CUDA = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

# The same kernel as KernelBench's example: a .cu body and a C++ declaration for load_inline.
ADD_INLINE_CUDA = r"""
#include <torch/extension.h>
__global__ void add_kernel(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto c = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n);
    return c;
}
"""
ADD_INLINE_CPP = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

FRESH_PROCESS_COMPILE = r"""
import sys, time
t0 = time.perf_counter()
import cudaforge
t1 = time.perf_counter()
mod = cudaforge.compile(sys.stdin.read())
t2 = time.perf_counter()
print(f"{t1 - t0:.6f} {t2 - t1:.6f} {int(mod.cached)}")
"""


def fresh_process_compile(cache_dir: str) -> tuple[float, float, bool]:
    env = dict(os.environ, CUDAFORGE_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS_COMPILE], input=ADD_CUDA, env=env,
                         capture_output=True, text=True, check=True)
    import_s, compile_s, cached = out.stdout.split()
    return float(import_s), float(compile_s), cached == "1"


def time_calls(fn, calls: int, repeats: int, sync) -> list[float]:
    """Per-call host time (us) of `calls` back-to-back calls, repeated; GPU drained between."""
    out = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
    sync()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/out")
    parser.add_argument("--skip-load-inline", action="store_true")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch

    import cudaforge

    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                     "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                     "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory() as cache:
        import_s, cold_s, cached = fresh_process_compile(cache)
        assert not cached
        _, disk_s, cached = fresh_process_compile(cache)
        assert cached
    results["cudaforge_import_s"] = import_s
    results["cudaforge_cold_fresh_process_s"] = cold_s
    results["cudaforge_disk_cached_fresh_process_s"] = disk_s

    os.environ["CUDAFORGE_CACHE_DIR"] = tempfile.mkdtemp()
    cudaforge.compile(ADD_CUDA.replace("add", "warmup"))  # libraries loaded: measure NVRTC itself
    cold = []
    for i in range(5):
        start = time.perf_counter()
        cudaforge.compile(ADD_CUDA + f"\n// variant {i}\n")
        cold.append(time.perf_counter() - start)
    results["cudaforge_cold_warm_process_s"] = statistics.median(cold)
    cached_times = []
    for _ in range(200):
        start = time.perf_counter()
        mod = cudaforge.compile(ADD_CUDA)
        cached_times.append(time.perf_counter() - start)
    results["cudaforge_cached_ms"] = statistics.median(cached_times[1:]) * 1e3

    if not args.skip_load_inline:
        from torch.utils.cpp_extension import load_inline

        with tempfile.TemporaryDirectory() as build:
            os.environ["TORCH_EXTENSIONS_DIR"] = build
            start = time.perf_counter()
            ext = load_inline("bench_add", cpp_sources=ADD_INLINE_CPP, cuda_sources=ADD_INLINE_CUDA,
                              functions=["add_cuda"], verbose=False)
            results["load_inline_cold_s"] = time.perf_counter() - start
            x = torch.randn(1000, device="cuda")
            assert torch.equal(ext.add_cuda(x, x), x + x)
        results["cold_compile_ratio"] = (results["load_inline_cold_s"]
                                         / results["cudaforge_cold_fresh_process_s"])

    # launch overhead: host time per call, tiny tensors so the GPU is never the bottleneck
    n = 1024
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    mod = cudaforge.compile(ADD_CUDA)
    add = mod.add
    add(4, 256, (a, b, c, n))
    torch.testing.assert_close(c, a + b)
    sync = torch.cuda.synchronize
    calls, repeats = 2000, 15
    results["launch_us"] = {
        "cudaforge mod.add(grid, block, (a, b, c, n))": time_calls(
            lambda: add(4, 256, (a, b, c, n)), calls, repeats, sync),
        "torch a + b": time_calls(lambda: a + b, calls, repeats, sync),
        "torch.add(a, b, out=c)": time_calls(lambda: torch.add(a, b, out=c), calls, repeats, sync),
    }
    if not args.skip_load_inline:
        results["launch_us"]["load_inline ext.add_cuda(a, b)"] = time_calls(
            lambda: ext.add_cuda(a, b), calls, repeats, sync)
    medians = {k: statistics.median(v) for k, v in results["launch_us"].items()}
    results["launch_median_us"] = medians
    ours = medians["cudaforge mod.add(grid, block, (a, b, c, n))"]
    results["launch_ratio_vs_torch_add"] = medians["torch a + b"] / ours

    (out_dir / "compile_and_launch.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"## compile and launch ({results['date']}, {results['gpu']}, torch {results['torch']})",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| cudaforge.compile cold, fresh process (NVRTC load included) | {cold_s:.3f} s |",
        f"| cudaforge.compile cold, warm process (median of 5) | {results['cudaforge_cold_warm_process_s'] * 1e3:.1f} ms |",
        f"| cudaforge.compile cached, fresh process (disk) | {disk_s * 1e3:.1f} ms |",
        f"| cudaforge.compile cached, in process (median) | {results['cudaforge_cached_ms']:.3f} ms |",
    ]
    if "load_inline_cold_s" in results:
        lines += [
            f"| load_inline cold (nvcc + ninja) | {results['load_inline_cold_s']:.1f} s |",
            f"| **cold compile ratio load_inline / cudaforge** | **{results['cold_compile_ratio']:.0f}x** |",
        ]
    lines += ["", "| launch path (host time per call, median of 15 x 2000) | us |", "| --- | --- |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in medians.items()]
    lines += ["", f"torch `a + b` / cudaforge launch: **{results['launch_ratio_vs_torch_add']:.2f}x**"]
    (out_dir / "compile_and_launch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
