"""launch.c on the GPU: kernels from cudaforge.compile run on torch tensors and match torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cudaforge

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

ADD = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

SOFTMAX = r"""
// one block per row; block-wide max and sum in shared memory
extern "C" __global__ void row_softmax(const float* x, float* y, int cols) {
    extern __shared__ float scratch[];
    const float* row = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;  // from the prelude: NVRTC has no <math.h>
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    scratch[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
        __syncthreads();
    }
    m = scratch[0];
    __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(row[j] - m);
    scratch[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
        __syncthreads();
    }
    sum = scratch[0];
    for (int j = threadIdx.x; j < cols; j += blockDim.x) out[j] = expf(row[j] - m) / sum;
}
"""

BF16 = r"""
#include <cuda_bf16.h>
extern "C" __global__ void axpy_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, float a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(a * __bfloat162float(x[i]) + __bfloat162float(y[i]));
}
"""

SPIN = r"""
extern "C" __global__ void spin(int* flag, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    *flag = 1;
}
"""

BIG_SHARED = r"""
extern "C" __global__ void copy_through_shared(const float* x, float* y, int n) {
    extern __shared__ float tile[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = tile[n - 1 - i];
}
"""


def test_vector_add_matches_torch():
    mod = cudaforge.compile(ADD)
    assert mod.arch == "sm_90a" or mod.arch.startswith("sm_")
    n = 1_000_003
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    mod.add((n + 255) // 256, 256, (a, b, c, n))
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


def test_row_softmax_matches_torch():
    mod = cudaforge.compile(SOFTMAX)
    x = torch.randn(333, 1000, device="cuda") * 5
    y = torch.empty_like(x)
    mod.row_softmax(x.shape[0], 256, [x, y, x.shape[1]], shared_mem=256 * 4)
    torch.testing.assert_close(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)


def test_bf16_kernel_matches_torch():
    mod = cudaforge.compile(BF16)
    n = 4097
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    expected = (2.5 * x.float() + y.float()).bfloat16()
    mod.axpy_bf16((n + 127) // 128, 128, (x, y, 2.5, n))
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_dynamic_shared_memory_over_48k():
    mod = cudaforge.compile(BIG_SHARED)
    n = 30_000  # 120 KB of shared memory
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    mod.copy_through_shared(1, 1024, (x, y, n), shared_mem=n * 4)
    torch.testing.assert_close(y, x.flip(0), rtol=0, atol=0)


def _spin_cycles() -> int:
    return int(torch.cuda.get_device_properties(0).clock_rate * 1e3 * 0.2)  # ~200 ms


def test_given_stream_is_respected():
    mod = cudaforge.compile(SPIN)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    mod.spin(1, 1, (flag, _spin_cycles()), stream=side)
    assert not side.query(), "the kernel should still be running on the side stream"
    assert torch.cuda.current_stream().query(), "the default stream must not be blocked"
    side.synchronize()
    assert flag.item() == 1


def test_current_torch_stream_is_the_default():
    mod = cudaforge.compile(SPIN)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        mod.spin(1, 1, (flag, _spin_cycles()))
    assert not side.query()
    assert torch.cuda.default_stream().query()
    side.synchronize()
    assert flag.item() == 1


def test_bad_launch_configurations_raise():
    mod = cudaforge.compile(ADD)
    a = torch.zeros(10, device="cuda")
    with pytest.raises(ValueError, match="2048 threads"):
        mod.add(1, 2048, (a, a, a, 10))
    with pytest.raises(ValueError, match="grid must be >= 1"):
        mod.add(0, 32, (a, a, a, 10))
    with pytest.raises(ValueError, match="at most 65535"):
        mod.add((1, 70000), 32, (a, a, a, 10))
    with pytest.raises(cudaforge.errors.CudaError):
        mod.add(1, 32, (a, a, a, 10), shared_mem=1 << 20)  # 1 MiB: more than any SM has
    # the context survives these: a good launch still works
    mod.add(1, 32, (a, a, a, 10))
    cudaforge.synchronize()


def test_bad_arguments_name_the_parameter():
    mod = cudaforge.compile(ADD)
    a = torch.zeros(10, device="cuda")
    with pytest.raises(TypeError, match="takes 4 arguments, got 3"):
        mod.add(1, 32, (a, a, a))
    with pytest.raises(TypeError, match="'n'.*expects an int"):
        mod.add(1, 32, (a, a, a, 1.5))
    with pytest.raises(TypeError, match="'a'.*expects a CUDA tensor"):
        mod.add(1, 32, ("x", a, a, 10))
    with pytest.raises(ValueError, match="'b'.*on the CPU"):
        mod.add(1, 32, (a, torch.zeros(10), a, 10))
    with pytest.raises(OverflowError, match="'n'"):
        mod.add(1, 32, (a, a, a, 2**40))
    import numpy as np

    mod.add(1, 32, (a, a, a, np.int32(10)))  # numpy scalars convert


def test_attributes_and_occupancy():
    mod = cudaforge.compile(SOFTMAX)
    attrs = mod.row_softmax.attributes()
    assert attrs["registers_per_thread"] == mod.resources["row_softmax"]["registers"]
    assert attrs["max_threads_per_block"] >= 256
    assert attrs["local_bytes_per_thread"] == 0
    blocks = mod.row_softmax.occupancy(256, shared_mem=1024)
    assert 1 <= blocks <= 32
    assert mod.row_softmax.param_sizes() == [8, 8, 4]


def test_a_trapping_kernel_raises_instead_of_killing_the_process():
    code = r"""
import cudaforge, torch
mod = cudaforge.compile('extern "C" __global__ void boom(int* x) { if (threadIdx.x == 0) __trap(); x[0] = 1; }')
x = torch.zeros(1, dtype=torch.int32, device="cuda")
mod.boom(1, 32, (x,))
try:
    cudaforge.synchronize()
except cudaforge.errors.KernelFault as e:
    print("RAISED", type(e).__name__, e.name)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "RAISED KernelFault CUDA_ERROR_" in out.stdout


def test_persisting_l2_limit_and_stream_window():
    """device.c's L2 calls as the harness uses them: the context's persisting-L2 limit set and read
    back, a fresh stream's access-policy window read and cleared, the persisting lines reset."""
    from cudaforge import _core
    from cudaforge.errors import CudaError

    torch.cuda.init()
    l2_bytes = _core.device_info(torch.cuda.current_device())["l2_bytes"]
    before = _core.persisting_l2_limit()
    try:
        _core.set_persisting_l2_limit(4 << 20)
        limit = _core.persisting_l2_limit()
        assert 0 < limit <= l2_bytes  # rounded and capped by the driver
        _core.set_persisting_l2_limit(0)
        assert _core.persisting_l2_limit() == 0

        stream = torch.cuda.Stream()
        assert _core.stream_window_bytes(stream.cuda_stream) == 0
        _core.clear_stream_window(stream.cuda_stream)
        assert _core.stream_window_bytes(stream.cuda_stream) == 0
        _core.reset_persisting_l2()
    finally:
        _core.set_persisting_l2_limit(before)
    assert _core.persisting_l2_limit() == before
    try:  # the legacy default stream may have no attributes: then the error names the call
        assert _core.stream_window_bytes(0) == 0
    except CudaError as exc:
        assert exc.call == "cuStreamGetAttribute", exc
