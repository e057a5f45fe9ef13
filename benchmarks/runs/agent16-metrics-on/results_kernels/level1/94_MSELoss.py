import torch
import torch.nn as nn
import cudaforge

_SRC = r'''
__device__ __forceinline__ double warp_sum_d(double v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// Result valid in thread 0.
__device__ __forceinline__ double block_sum_d(double v) {
    __shared__ double s[32];
    const int lane = threadIdx.x & 31;
    const int wid  = threadIdx.x >> 5;
    v = warp_sum_d(v);
    if (lane == 0) s[wid] = v;
    __syncthreads();
    double r = 0.0;
    if (wid == 0) {
        const int nw = (blockDim.x + 31) >> 5;
        r = (lane < nw) ? s[lane] : 0.0;
        r = warp_sum_d(r);
    }
    return r;
}

__device__ __forceinline__ float sq4(const float4 a, const float4 b) {
    const float d0 = a.x - b.x;
    const float d1 = a.y - b.y;
    const float d2 = a.z - b.z;
    const float d3 = a.w - b.w;
    return (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
}

extern "C" __global__ void __launch_bounds__(256, 4)
mse_partial(const float* __restrict__ p, const float* __restrict__ q,
            double* __restrict__ partial, long long n, int vec)
{
    double acc = 0.0;
    const long long tid    = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;

    if (vec) {
        const float4* __restrict__ p4 = reinterpret_cast<const float4*>(p);
        const float4* __restrict__ q4 = reinterpret_cast<const float4*>(q);
        const long long n4 = n >> 2;
        long long i = tid;
        // 4x unrolled: 8 independent 16-byte loads in flight per thread
        for (; i + 3 * stride < n4; i += 4 * stride) {
            const float4 a0 = __ldg(p4 + i);
            const float4 a1 = __ldg(p4 + i + stride);
            const float4 a2 = __ldg(p4 + i + 2 * stride);
            const float4 a3 = __ldg(p4 + i + 3 * stride);
            const float4 b0 = __ldg(q4 + i);
            const float4 b1 = __ldg(q4 + i + stride);
            const float4 b2 = __ldg(q4 + i + 2 * stride);
            const float4 b3 = __ldg(q4 + i + 3 * stride);
            const float s = (sq4(a0, b0) + sq4(a1, b1)) + (sq4(a2, b2) + sq4(a3, b3));
            acc += (double)s;
        }
        for (; i < n4; i += stride) {
            acc += (double)sq4(__ldg(p4 + i), __ldg(q4 + i));
        }
        done = n4 << 2;
    }
    // scalar tail (or whole range if pointers are not 16-byte aligned)
    for (long long i = done + tid; i < n; i += stride) {
        const float d = __ldg(p + i) - __ldg(q + i);
        acc += (double)(d * d);
    }

    acc = block_sum_d(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(1024)
mse_final(const double* __restrict__ partial, int nparts, float* __restrict__ out, double n_d)
{
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) out[0] = (float)(acc / n_d);   // n == 0 -> NaN, like torch.mean
}
'''

_mod = cudaforge.compile(_SRC)

_THREADS = 256
_BLOCKS_PER_SM = 4
_sm_cache = {}


def _num_sms(device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _sm_cache.get(idx)
    if n is None:
        n = torch.cuda.get_device_properties(idx).multi_processor_count
        _sm_cache[idx] = n
    return n


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, predictions, targets):
        p, t = predictions, targets
        out_dtype = torch.result_type(p, t)
        if p.shape != t.shape:
            p, t = torch.broadcast_tensors(p, t)
        if p.dtype != torch.float32:
            p = p.to(torch.float32)
        if t.dtype != torch.float32:
            t = t.to(torch.float32)
        p = p.contiguous().reshape(-1)
        t = t.contiguous().reshape(-1)
        n = p.numel()
        dev = p.device

        vec = 1 if (p.data_ptr() % 16 == 0 and t.data_ptr() % 16 == 0) else 0
        work = (n // 4) if vec else n
        blocks = max(1, min(_num_sms(dev) * _BLOCKS_PER_SM, (work + _THREADS - 1) // _THREADS))

        partial = torch.empty(blocks, dtype=torch.float64, device=dev)
        out = torch.empty(1, dtype=torch.float32, device=dev)

        _mod.mse_partial(blocks, _THREADS, (p, t, partial, n, vec))
        _mod.mse_final(1, 1024, (partial, blocks, out, float(n)))

        res = out.view(())
        if out_dtype != torch.float32:
            res = res.to(out_dtype)
        return res
