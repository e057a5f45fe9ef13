"""cudaforge.evaluate on the GPU (the H200): kernels compiled with cudaforge.compile and load_inline,
right, wrong, not compiling, crashing and hanging; and the cheats the harness must reject: an
output never written, a result left in the reference's memory, work on a side stream, a candidate
that only calls torch, a cache keyed on the input pointer, a persisting-L2 window.

Run on a GPU machine with `pytest -m gpu tests/test_evaluate_gpu.py`."""

from __future__ import annotations

import shutil

import pytest

from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.problem import Problem

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

RUNS = {"trials": 3, "timed_runs": 30, "warmup": 3}

# 64 MiB in, 64 MiB out: big enough for the bandwidth floor and the timing guards to mean something
RELU = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
rows = 4096
cols = 4096
def get_inputs():
    return [torch.randn(rows, cols)]
def get_init_inputs():
    return []
""",
    name="relu_4096",
)

KERNELS = r"""
extern "C" __global__ void relu_kernel(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" __global__ void relu_first_half(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n / 2) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" __global__ void relu_slow(const float* x, float* y, long long n, int repeat) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int r = 0; r < repeat; r++) { v = v > 0.f ? v : 0.f; y[i] = v; __threadfence(); }
}
extern "C" __global__ void copy_kernel(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void write_far(float* y) {
    y[threadIdx.x + (1LL << 40)] = 1.f;
}
extern "C" __global__ void spin_forever(volatile int* flag) {
    while (flag[0] == 0) { }
}
"""


def compiled_candidate(forward: str, init: str = "", header: str = "") -> str:
    """A ModelNew built on cudaforge.compile(KERNELS); `forward` is the body of forward(x)."""
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    init_body = "\n".join("        " + line for line in init.strip().splitlines()) or "        pass"
    return f'''
import torch
import cudaforge
{header}
KERNELS = r"""{KERNELS}"""
mod = cudaforge.compile(KERNELS)

def blocks(n):
    return ((n + 255) // 256,)

class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
{init_body}

    def forward(self, x):
{body}
'''


GOOD = compiled_candidate(
    """
x = x.contiguous()
y = torch.empty_like(x)
mod.relu_kernel(blocks(x.numel()), (256,), (x, y, x.numel()))
return y
"""
)


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1, device="cuda", timeout=20, compile_timeout=600) as p:
        yield p


def test_a_correct_kernel_is_ok_timed_and_traced(pool):
    r = pool.evaluate(RELU, GOOD, **RUNS)
    assert r.status == "ok", r.error
    assert r.correct and r.compiled and r.trials == 3
    assert r.timing["method"] == "cuda_events" and r.candidate_ms > 0 and r.reference_ms > 0
    assert r.timing["l2_flush_bytes"] >= 2 * r.timing["l2_bytes"]
    assert "H200" in r.device or "cuda" in r.device
    for guard in ("unwritten_output", "unmeasured_work", "bandwidth_floor", "output_reused",
                  "tampering", "timed_output", "revalidation"):  # fmt: skip
        assert guard in r.guards_passed, (guard, r.guards_skipped.get(guard))
    assert "persisting_l2" in r.guards_passed or "persisting_l2" in r.guards_skipped
    assert r.timing.get("cupti") == "on", r.timing  # CUPTI tracing works on the H200
    own = [k for k in r.kernels if k.own]
    # the per-kernel times come from the 20 traced runs after the timed ones: one call each
    assert r.timing["rule"] == "adaptive" and r.timing["traced_runs"] == 20
    assert r.timing["min_runs"] <= r.timing["runs"] <= r.timing["max_runs"]
    assert [k.name for k in own] == ["relu_kernel"] and own[0].calls == 1
    assert r.own_kernel_share > 0.9
    # kernel time within the event window of the traced runs
    assert r.timing["cupti_kernel_ms"] <= r.timing["candidate_traced_mean_ms"] * 1.05


def test_no_traced_runs_no_per_kernel_times(pool):
    r = pool.evaluate(RELU, GOOD, traced_runs=0, **RUNS)
    assert r.status == "ok", r.error
    assert r.kernels == [] and r.timing["traced_runs"] == 0
    assert any("no per-kernel times" in n for n in r.notes), r.notes


def test_a_wrong_kernel_is_incorrect(pool):
    wrong = GOOD.replace("mod.relu_kernel", "mod.copy_kernel")
    r = pool.evaluate(RELU, wrong, **RUNS)
    assert r.status == "incorrect" and r.failure.trial == 0 and r.failure.mismatches > 0


def test_a_kernel_that_does_not_compile_returns_the_log(pool):
    broken = GOOD.replace('KERNELS = r"""', 'KERNELS = r"""\nthis is not CUDA;\n')
    r = pool.evaluate(RELU, broken, **RUNS)
    assert r.status == "compile_error" and not r.compiled
    assert r.compile_log and "error" in r.compile_log.lower()


def test_an_illegal_address_crashes_only_its_worker(pool):
    restarts = pool.restarts
    bad = compiled_candidate(
        """
y = torch.empty_like(x)
mod.write_far((1,), (32,), (y,))
torch.cuda.synchronize()
return y
"""
    )
    r = pool.evaluate(RELU, bad, **RUNS)
    assert r.status == "crashed", r.error
    assert "illegal" in r.error.lower() or "sticky" in r.error.lower()
    assert pool.evaluate(RELU, GOOD, **RUNS).ok
    assert pool.restarts == restarts + 1


def test_a_kernel_that_never_returns_times_out(pool):
    hang = compiled_candidate(
        """
flag = torch.zeros(1, dtype=torch.int32, device=x.device)
mod.spin_forever((1,), (1,), (flag,))
torch.cuda.synchronize()
return torch.relu(x)
"""
    )
    r = pool.evaluate(RELU, hang, timeout=10, **RUNS)
    assert r.status == "timeout" and "replaced" in r.error
    assert pool.evaluate(RELU, GOOD, **RUNS).ok


# ---------------------------------------------------------------------- cheats


def test_an_output_never_written_is_nan_and_fails(pool):
    half = GOOD.replace("mod.relu_kernel", "mod.relu_first_half")
    r = pool.evaluate(RELU, half, **RUNS)
    assert r.status == "incorrect"
    assert "NaN/Inf where the reference is finite" in r.failure.message
    assert r.failure.mismatches >= 4096 * 4096 // 2 * 0.99


def test_a_result_left_in_the_references_memory_is_not_picked_up(pool):
    # KernelBench PR #82: run after the reference, torch.empty gets its freed output block, which
    # still holds the right answer. Here the candidate runs first, on a poisoned allocator.
    lazy = compiled_candidate("return torch.empty_like(x)")
    r = pool.evaluate(RELU, lazy, **RUNS)
    assert r.status == "incorrect"


def test_work_on_a_side_stream_is_caught(pool):
    side = compiled_candidate(
        """
x = x.contiguous()
y = torch.empty_like(x)
# ordered after everything on the main stream (inputs, the harness's NaN fill of y's memory),
# but the main stream never waits for it: only the timing can notice
self.side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(self.side):
    mod.relu_slow(blocks(x.numel()), (256,), (x, y, x.numel(), 64))
return y
""",
        init="self.side = torch.cuda.Stream()",
    )
    r = pool.evaluate(RELU, side, **RUNS)
    assert r.status == "rejected" and "unmeasured_work" in r.guards, r.error


def test_a_candidate_that_only_calls_torch_is_flagged(pool):
    only_torch = "import torch\nclass ModelNew(torch.nn.Module):\n" \
        "    def forward(self, x):\n        return torch.clamp(x, min=0)\n"  # fmt: skip
    r = pool.evaluate(RELU, only_torch, **RUNS)
    assert r.status == "rejected" and "no_own_kernels" in r.guards
    assert r.own_kernel_share in (0.0, None)


def test_a_cache_keyed_on_the_input_pointer_is_caught(pool):
    # honest for the 6 calls of the correctness trials, then replays by pointer (the timed runs
    # reuse their input buffers): near-zero time, stale outputs
    cached = compiled_candidate(
        """
self.calls += 1
key = x.data_ptr()
if self.calls > 6 and key in self.cache:
    return self.cache[key]
y = torch.empty_like(x)
mod.relu_kernel(blocks(x.numel()), (256,), (x, y, x.numel()))
if self.calls > 6:
    self.cache[key] = y
return y
""",
        init="self.cache = {}\nself.calls = 0",
    )
    r = pool.evaluate(RELU, cached, **RUNS)
    assert r.status == "rejected", r.error
    assert r.timing.get("cupti") == "on", r.timing
    assert "timed_output" in r.guards and "bandwidth_floor" in r.guards, r.guard_details


def test_a_persisting_l2_window_is_reset_and_flagged(pool):
    header = """
import ctypes
_cuda = ctypes.CDLL("libcuda.so.1")
"""
    persist = compiled_candidate(
        """
status = _cuda.cuCtxSetLimit(6, ctypes.c_size_t(32 << 20))  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
if status != 0:
    raise RuntimeError(f"cuCtxSetLimit returned {status}")
x = x.contiguous()
y = torch.empty_like(x)
mod.relu_kernel(blocks(x.numel()), (256,), (x, y, x.numel()))
return y
""",
        header=header,
    )
    r = pool.evaluate(RELU, persist, **RUNS)
    if r.status == "runtime_error" and "cuCtxSetLimit returned" in r.error:
        pytest.skip(f"this GPU refuses a persisting-L2 limit: {r.error}")
    if "persisting_l2" in r.guards_skipped:
        pytest.skip(f"persisting L2 not available here: {r.guards_skipped['persisting_l2']}")
    assert r.status == "rejected" and "persisting_l2" in r.guards, r.error


# ---------------------------------------------------------------------- load_inline, extras


INLINE = r'''
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
__global__ void relu_inline_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_inline(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_inline_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_source = "torch::Tensor relu_inline(torch::Tensor x);"
ext = load_inline(name="cudaforge_test_relu_inline", cpp_sources=cpp_source,
                  cuda_sources=cuda_source, functions=["relu_inline"], verbose=False)

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu_inline(x.contiguous())
'''


@pytest.mark.skipif(
    shutil.which("nvcc") is None or shutil.which("ninja") is None,
    reason="load_inline needs nvcc and ninja",
)
def test_a_load_inline_candidate_runs_unchanged(pool):
    r = pool.evaluate(RELU, INLINE, **RUNS)
    assert r.status == "ok", r.error + r.compile_log[-2000:]
    assert r.timing.get("cupti") == "on", r.timing
    assert any(k.own and "relu_inline_kernel" in k.name for k in r.kernels), r.kernels


def test_torch_compile_comparison_and_profile_hook(pool):
    r = pool.evaluate(RELU, GOOD, compare_compile=True, profile=True, timeout=300, **RUNS)
    assert r.status == "ok", r.error
    assert r.compiled_reference_ms is not None, r.notes
    # torch.compile's time is eager: held against the candidate's eager time
    assert r.speedup_vs_compile == pytest.approx(r.compiled_reference_ms / r.eager_candidate_ms)
    assert r.profile is not None, r.notes
    assert any(k["name"] == "relu_kernel" for k in r.profile["kernels"])


def test_a_dev_problem_at_its_own_size():
    problem = Problem.from_dev_set(1, 19)  # ReLU, 4096 x 393216 floats: 6.4 GB in, 6.4 GB out
    with WorkerPool(1, device="cuda", timeout=120) as pool:
        r = pool.evaluate(problem, GOOD, trials=2, timed_runs=10, warmup=2)
    assert r.status == "ok", r.error
    assert r.timing["input_sets"] >= 1
