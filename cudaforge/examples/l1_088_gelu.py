# Hand-written reference kernel for KernelBench level 1 problem 88 (minGPT's tanh GELU),
# cudaforge.compile style. Used by benchmarks/evaluate.py; not tuned.
import torch

import cudaforge

KERNELS = r"""
extern "C" __global__ void gelu_tanh(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);  // sqrt(2/pi)
        y[i] = 0.5f * v * (1.f + tanhf(inner));
    }
}
"""
mod = cudaforge.compile(KERNELS)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        mod.gelu_tanh(((n + 255) // 256,), (256,), (x, y, n))
        return y
