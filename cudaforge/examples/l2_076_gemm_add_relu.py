# Hand-written reference candidate for KernelBench level 2 problem 76 (GEMM, + bias, ReLU),
# cudaforge.compile style: the GEMM stays with cuBLAS (torch), the bias add and ReLU are fused
# into one kernel of ours instead of two torch kernels. Used by benchmarks/evaluate.py.
import torch

import cudaforge

KERNELS = r"""
extern "C" __global__ void bias_relu_(float* y, const float* bias, int cols, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(y[i] + bias[i % cols], 0.f);
}
"""
mod = cudaforge.compile(KERNELS)


class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = torch.nn.Linear(in_features, out_features, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = torch.matmul(x, self.gemm.weight.t())
        n = y.numel()
        mod.bias_relu_(((n + 255) // 256,), (256,), (y, self.bias, y.shape[1], n))
        return y
