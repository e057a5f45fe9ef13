import torch
import torch.nn as nn
import cudaforge

_CUDA_SRC = r"""
#define ITEMS 4

__device__ __forceinline__ float relu1(float v) {
    // keeps NaN (NaN < 0 is false) like torch.relu
    return v < 0.0f ? 0.0f : v;
}

__device__ __forceinline__ float4 relu4(float4 v) {
    float4 r;
    r.x = relu1(v.x);
    r.y = relu1(v.y);
    r.z = relu1(v.z);
    r.w = relu1(v.w);
    return r;
}

// Each block handles ITEMS * blockDim.x float4 elements; the scalar tail
// (n - 4*n4 < 4 elements) is handled by block 0.
// Plain (default-cached) loads and stores: no .cs streaming hints.
extern "C" __global__ void relu_vec4(const float4* __restrict__ x,
                                     float4* __restrict__ y,
                                     long long n4,
                                     long long n)
{
    const long long base = (long long)blockIdx.x * ((long long)blockDim.x * ITEMS) + threadIdx.x;
    float4 v[ITEMS];
    #pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const long long i = base + (long long)k * blockDim.x;
        if (i < n4) v[k] = x[i];
    }
    #pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const long long i = base + (long long)k * blockDim.x;
        if (i < n4) y[i] = relu4(v[k]);
    }
    if (blockIdx.x == 0) {
        const long long t = 4 * n4 + threadIdx.x;
        if (t < n) {
            const float* xs = reinterpret_cast<const float*>(x);
            float* ys = reinterpret_cast<float*>(y);
            ys[t] = relu1(xs[t]);
        }
    }
}

extern "C" __global__ void relu_scalar(const float* __restrict__ x,
                                       float* __restrict__ y,
                                       long long n)
{
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = relu1(x[i]);
    }
}
"""

_MODULE = None


def _get_module():
    global _MODULE
    if _MODULE is None:
        _MODULE = cudaforge.compile(_CUDA_SRC)
    return _MODULE


_THREADS = 256
_ITEMS = 4


class ModelNew(nn.Module):
    """
    ReLU with a custom vectorized CUDA kernel (plain cached loads/stores).
    """
    def __init__(self):
        super(ModelNew, self).__init__()
        self._mod = _get_module()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        xc = x.contiguous()
        if xc.dtype != torch.float32:
            xc = xc.float()
        y = torch.empty_like(xc, memory_format=torch.contiguous_format)
        n = xc.numel()
        if n == 0:
            return y if orig_dtype == torch.float32 else y.to(orig_dtype)

        if xc.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0:
            n4 = n // 4
            per_block = _THREADS * _ITEMS
            blocks = max(1, (n4 + per_block - 1) // per_block)
            self._mod.relu_vec4(blocks, _THREADS, (xc, y, n4, n))
        else:
            blocks = max(1, min((n + _THREADS - 1) // _THREADS, 132 * 32))
            self._mod.relu_scalar(blocks, _THREADS, (xc, y, n))

        return y if orig_dtype == torch.float32 else y.to(orig_dtype)
