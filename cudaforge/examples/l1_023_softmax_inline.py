# Hand-written reference kernel for KernelBench level 1 problem 23 (softmax over dim 1),
# load_inline style. Same kernel as l1_023_softmax.py.
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__device__ float block_reduce(float v, float* scratch, bool take_max) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float o = scratch[threadIdx.x + s];
            scratch[threadIdx.x] = take_max ? fmaxf(scratch[threadIdx.x], o) : scratch[threadIdx.x] + o;
        }
        __syncthreads();
    }
    float r = scratch[0];
    __syncthreads();
    return r;
}
__global__ void softmax_rows(const float* x, float* y, int cols) {
    __shared__ float scratch[256];
    const float* row = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_reduce(m, scratch, true);
    float sum = 0.f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += __expf(row[j] - m);
    sum = block_reduce(sum, scratch, false);
    float inv = 1.f / sum;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) out[j] = __expf(row[j] - m) * inv;
}
torch::Tensor softmax_forward(torch::Tensor x) {
    x = x.contiguous();
    auto y = torch::empty_like(x);
    softmax_rows<<<x.size(0), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(1));
    return y;
}
"""
cpp_source = "torch::Tensor softmax_forward(torch::Tensor x);"
ext = load_inline(
    name="bench_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_forward"],
    verbose=False,
)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.softmax_forward(x)
