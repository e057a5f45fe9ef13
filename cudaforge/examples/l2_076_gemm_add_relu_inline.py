# Hand-written reference candidate for KernelBench level 2 problem 76 (GEMM, + bias, ReLU),
# load_inline style. Same split as l2_076_gemm_add_relu.py: cuBLAS GEMM, our fused epilogue.
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void bias_relu_(float* y, const float* bias, int cols, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(y[i] + bias[i % cols], 0.f);
}
torch::Tensor bias_relu_forward(torch::Tensor y, torch::Tensor bias) {
    long long n = y.numel();
    bias_relu_<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), bias.data_ptr<float>(), y.size(1), n);
    return y;
}
"""
cpp_source = "torch::Tensor bias_relu_forward(torch::Tensor y, torch::Tensor bias);"
ext = load_inline(
    name="bench_gemm_add_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_relu_forward"],
    verbose=False,
)


class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = torch.nn.Linear(in_features, out_features, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return ext.bias_relu_forward(torch.matmul(x, self.gemm.weight.t()), self.bias)
