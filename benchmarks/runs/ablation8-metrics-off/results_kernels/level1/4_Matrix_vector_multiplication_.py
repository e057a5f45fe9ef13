import torch
import torch.nn as nn
import cudaforge

_SRC = r"""
__device__ __forceinline__ float4 ld_stream4(const float4* p) {
    float4 v;
    asm volatile("ld.global.cs.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float ld_stream1(const float* p) {
    float v;
    asm volatile("ld.global.cs.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float s) {
    s = fmaf(a.x, b.x, s);
    s = fmaf(a.y, b.y, s);
    s = fmaf(a.z, b.z, s);
    s = fmaf(a.w, b.w, s);
    return s;
}

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// grid = (M, splits); block = 256 threads.
// Block (row, s) computes dot(A[row, kb:ke], x[kb:ke]) with kb = s*chunk, ke = min(K, kb+chunk).
extern "C" __global__ void __launch_bounds__(256)
gemv_kernel(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ y,
            long long M, long long K, long long chunk, int vec, int use_atomic)
{
    const long long row = blockIdx.x;
    if (row >= M) return;                       // uniform over the block
    const long long kb = (long long)blockIdx.y * chunk;
    long long ke = kb + chunk;
    if (ke > K) ke = K;

    const float* a = A + row * K;
    const int tid = threadIdx.x;
    const long long nt = blockDim.x;

    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;

    if (kb < ke) {
        if (vec) {
            // kb is a multiple of 4 and A, x are 16-byte aligned with K % 4 == 0.
            const float4* a4 = reinterpret_cast<const float4*>(a + kb);
            const float4* x4 = reinterpret_cast<const float4*>(x + kb);
            const long long n4 = (ke - kb) >> 2;
            long long i = tid;
            for (; i + 3 * nt < n4; i += 4 * nt) {
                float4 av0 = ld_stream4(a4 + i);
                float4 av1 = ld_stream4(a4 + i + nt);
                float4 av2 = ld_stream4(a4 + i + 2 * nt);
                float4 av3 = ld_stream4(a4 + i + 3 * nt);
                float4 xv0 = __ldg(x4 + i);
                float4 xv1 = __ldg(x4 + i + nt);
                float4 xv2 = __ldg(x4 + i + 2 * nt);
                float4 xv3 = __ldg(x4 + i + 3 * nt);
                s0 = dot4(av0, xv0, s0);
                s1 = dot4(av1, xv1, s1);
                s2 = dot4(av2, xv2, s2);
                s3 = dot4(av3, xv3, s3);
            }
            for (; i < n4; i += nt) {
                float4 av = ld_stream4(a4 + i);
                float4 xv = __ldg(x4 + i);
                s0 = dot4(av, xv, s0);
            }
            // scalar tail (empty when the range length is a multiple of 4)
            for (long long j = kb + (n4 << 2) + tid; j < ke; j += nt)
                s1 = fmaf(ld_stream1(a + j), __ldg(x + j), s1);
        } else {
            long long j = kb + tid;
            for (; j + 3 * nt < ke; j += 4 * nt) {
                float a0 = ld_stream1(a + j);
                float a1 = ld_stream1(a + j + nt);
                float a2 = ld_stream1(a + j + 2 * nt);
                float a3 = ld_stream1(a + j + 3 * nt);
                s0 = fmaf(a0, __ldg(x + j), s0);
                s1 = fmaf(a1, __ldg(x + j + nt), s1);
                s2 = fmaf(a2, __ldg(x + j + 2 * nt), s2);
                s3 = fmaf(a3, __ldg(x + j + 3 * nt), s3);
            }
            for (; j < ke; j += nt)
                s0 = fmaf(ld_stream1(a + j), __ldg(x + j), s0);
        }
    }

    float s = (s0 + s1) + (s2 + s3);
    s = warp_sum(s);

    __shared__ float wsum[32];
    const int lane = tid & 31;
    const int w = tid >> 5;
    if (lane == 0) wsum[w] = s;
    __syncthreads();
    if (w == 0) {
        const int nw = (blockDim.x + 31) >> 5;
        s = (lane < nw) ? wsum[lane] : 0.f;
        s = warp_sum(s);
        if (lane == 0) {
            if (use_atomic) atomicAdd(y + row, s);
            else y[row] = s;
        }
    }
}
"""


class ModelNew(nn.Module):
    """
    Matrix-vector multiplication (C = A * B) with a custom bandwidth-bound CUDA GEMV kernel.
    """
    def __init__(self):
        super(ModelNew, self).__init__()
        self._mod = cudaforge.compile(_SRC)
        self._threads = 256
        self._target_blocks = 132 * 8

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        out_dtype = torch.result_type(A, B)
        M, K = A.shape
        if B.dim() == 1:
            out_shape = (M,)
        else:
            out_shape = (M, B.shape[1])
            assert B.shape[1] == 1, "ModelNew supports a (K, 1) vector"
        assert B.shape[0] == K

        A_ = A if A.dtype == torch.float32 else A.float()
        A_ = A_.contiguous()
        x = B if B.dtype == torch.float32 else B.float()
        x = x.contiguous().reshape(-1)

        if M == 0:
            return torch.empty(out_shape, device=A.device, dtype=out_dtype)
        if K == 0:
            return torch.zeros(out_shape, device=A.device, dtype=out_dtype)

        threads = self._threads
        # Split K only when there are too few rows to fill the GPU.
        if M >= self._target_blocks:
            splits = 1
        else:
            splits = -(-self._target_blocks // M)
            splits = max(1, min(splits, K // 16384 if K >= 16384 else 1, 65535))
        chunk = -(-K // splits)
        chunk = ((chunk + 3) // 4) * 4
        splits = -(-K // chunk)

        vec = int(K % 4 == 0 and A_.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0)
        use_atomic = int(splits > 1)

        if use_atomic:
            y = torch.zeros(M, device=A.device, dtype=torch.float32)
        else:
            y = torch.empty(M, device=A.device, dtype=torch.float32)

        self._mod.gemv_kernel((M, splits), threads,
                              (A_, x, y, M, K, chunk, vec, use_atomic))

        y = y.reshape(out_shape)
        if y.dtype != out_dtype:
            y = y.to(out_dtype)
        return y
