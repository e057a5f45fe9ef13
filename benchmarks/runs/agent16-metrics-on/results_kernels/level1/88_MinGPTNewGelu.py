import math
import torch
import torch.nn as nn
import cudaforge

_SRC = r"""
#define GELU_C0 0.7978845608028654f   // sqrt(2/pi)
#define GELU_C1 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
    // 0.5*x*(1+tanh(u)) == x * sigmoid(2u) == x / (1 + exp(-2u))
    const float u = GELU_C0 * (x + GELU_C1 * (x * x * x));
    const float e = __expf(-2.0f * u);
    return __fdividef(x, 1.0f + e);
}

__device__ __forceinline__ float4 gelu4(float4 v) {
    float4 r;
    r.x = gelu_f(v.x);
    r.y = gelu_f(v.y);
    r.z = gelu_f(v.z);
    r.w = gelu_f(v.w);
    return r;
}

// Each block handles 512 float4 (2 per thread, strided by 256 for coalescing).
extern "C" __global__ void __launch_bounds__(256)
gelu_vec4(const float4* __restrict__ in, float4* __restrict__ out, long long n4)
{
    const long long i0 = (long long)blockIdx.x * 512 + threadIdx.x;
    const long long i1 = i0 + 256;
    const bool ok0 = i0 < n4;
    const bool ok1 = i1 < n4;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 b = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ok0) a = in[i0];
    if (ok1) b = in[i1];
    if (ok0) out[i0] = gelu4(a);
    if (ok1) out[i1] = gelu4(b);
}

// Scalar path for elements [start, n).
extern "C" __global__ void __launch_bounds__(256)
gelu_scalar(const float* __restrict__ in, float* __restrict__ out, long long start, long long n)
{
    const long long i = start + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu_f(in[i]);
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self._mod = cudaforge.compile(_SRC, name="gelu_newgelu.cu")

    def forward(self, x):
        orig_dtype = x.dtype
        xc = x.contiguous()
        if xc.dtype != torch.float32:
            xc = xc.float()
        out = torch.empty_like(xc)
        n = xc.numel()
        if n == 0:
            return out if orig_dtype == torch.float32 else out.to(orig_dtype)

        start = 0
        if xc.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0:
            n4 = n // 4
            if n4 > 0:
                blocks = (n4 + 511) // 512
                self._mod.gelu_vec4((blocks,), (256,), (xc, out, n4))
            start = n4 * 4
        if start < n:
            rem = n - start
            blocks = (rem + 255) // 256
            self._mod.gelu_scalar((blocks,), (256,), (xc, out, start, n))

        if orig_dtype != torch.float32:
            out = out.to(orig_dtype)
        return out
