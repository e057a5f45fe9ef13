# Hand-written reference kernel for KernelBench level 1 problem 23 (softmax over dim 1),
# cudaforge.compile style: one block per row, block reductions for the max and the sum.
# Used by benchmarks/evaluate.py; not tuned.
import torch

import cudaforge

KERNELS = r"""
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
extern "C" __global__ void softmax_rows(const float* x, float* y, int cols) {
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
"""
mod = cudaforge.compile(KERNELS)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        mod.softmax_rows((rows,), (256,), (x, y, cols))
        return y
