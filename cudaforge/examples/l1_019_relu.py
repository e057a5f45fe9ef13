# Hand-written reference kernel for KernelBench level 1 problem 19 (ReLU), cudaforge.compile style.
# Used by benchmarks/evaluate.py as a known-good candidate; not tuned.
import torch

import cudaforge

KERNELS = r"""
extern "C" __global__ void relu_kernel(const float4* x, float4* y, long long n4) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        y[i] = v;
    }
}
extern "C" __global__ void relu_tail(const float* x, float* y, long long start, long long n) {
    long long i = start + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
"""
mod = cudaforge.compile(KERNELS)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        n4 = n // 4
        if n4:
            mod.relu_kernel(((n4 + 255) // 256,), (256,), (x, y, n4))
        if n % 4:
            mod.relu_tail((1,), (4,), (x, y, n4 * 4, n))
        return y
