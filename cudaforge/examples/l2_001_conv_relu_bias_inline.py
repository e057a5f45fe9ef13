# Hand-written reference candidate for KernelBench level 2 problem 1 (Conv2d, ReLU, + bias),
# load_inline style. Same split as l2_001_conv_relu_bias.py: cuDNN conv, our fused epilogue.
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void relu_bias_(float* y, const float* bias, int channels, long long plane, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(y[i], 0.f) + bias[(i / plane) % channels];
}
torch::Tensor relu_bias_forward(torch::Tensor y, torch::Tensor bias) {
    y = y.contiguous();
    long long n = y.numel(), plane = y.size(2) * y.size(3);
    relu_bias_<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), bias.data_ptr<float>(), y.size(1),
                                         plane, n);
    return y;
}
"""
cpp_source = "torch::Tensor relu_bias_forward(torch::Tensor y, torch::Tensor bias);"
ext = load_inline(
    name="bench_conv_relu_bias",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_bias_forward"],
    verbose=False,
)


class ModelNew(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = torch.nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return ext.relu_bias_forward(self.conv(x), self.bias)
