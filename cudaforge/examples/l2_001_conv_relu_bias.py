# Hand-written reference candidate for KernelBench level 2 problem 1 (Conv2d, ReLU, + bias),
# cudaforge.compile style: the convolution stays with cuDNN (torch), ReLU and the per-channel bias
# are fused into one in-place kernel of ours. Used by benchmarks/evaluate.py.
import torch

import cudaforge

KERNELS = r"""
extern "C" __global__ void relu_bias_(float* y, const float* bias, int channels, long long plane,
                                      long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(y[i], 0.f) + bias[(i / plane) % channels];
}
"""
mod = cudaforge.compile(KERNELS)


class ModelNew(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = torch.nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = self.conv(x).contiguous()
        n = y.numel()
        plane = y.shape[2] * y.shape[3]
        mod.relu_bias_(((n + 255) // 256,), (256,), (y, self.bias, y.shape[1], plane, n))
        return y
