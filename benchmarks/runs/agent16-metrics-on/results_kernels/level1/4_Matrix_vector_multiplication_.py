import torch
import torch.nn as nn
import cudaforge

_ROWS = 4      # rows of A per block (each loaded vector chunk of B is reused ROWS times)
_NT = 256      # threads per block

_SRC = r"""
#define ROWS 4
#define NT 256

// Streaming 128-bit load of A: read-only path, do not allocate in L1.
__device__ __forceinline__ float4 ld_stream_f4(const float4* p) {
    float4 v;
    asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float fma4(const float4 a, const float4 b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    acc = fmaf(a.w, b.w, acc);
    return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// out[blockIdx.y * M + row] = sum_{k in split blockIdx.y} A[row, k] * x[k]
template <bool VEC>
__device__ __forceinline__ void gemv_body(const float* __restrict__ A,
                                          const float* __restrict__ x,
                                          float* __restrict__ out,
                                          int M, long long K, long long chunk)
{
    __shared__ float red[ROWS][NT / 32];

    const int row0 = blockIdx.x * ROWS;
    const long long k0 = (long long)blockIdx.y * chunk;
    long long k1 = k0 + chunk;
    if (k1 > K) k1 = K;

    const float* rowp[ROWS];
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        int rr = row0 + r;
        if (rr > M - 1) rr = M - 1;          // clamp: valid memory, result discarded
        rowp[r] = A + (long long)rr * K;
    }

    float acc[ROWS];
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;

    if constexpr (VEC) {
        // K % 4 == 0, chunk % 4 == 0, all pointers 16-byte aligned
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* a4[ROWS];
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) a4[r] = reinterpret_cast<const float4*>(rowp[r]);

        const long long v1 = k1 >> 2;
        long long i = (k0 >> 2) + threadIdx.x;
        for (; i + NT < v1; i += 2 * NT) {
            const float4 xa = __ldg(x4 + i);
            const float4 xb = __ldg(x4 + i + NT);
            float4 a[ROWS], b[ROWS];
            #pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                a[r] = ld_stream_f4(a4[r] + i);
                b[r] = ld_stream_f4(a4[r] + i + NT);
            }
            #pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                acc[r] = fma4(a[r], xa, acc[r]);
                acc[r] = fma4(b[r], xb, acc[r]);
            }
        }
        if (i < v1) {
            const float4 xa = __ldg(x4 + i);
            #pragma unroll
            for (int r = 0; r < ROWS; ++r) acc[r] = fma4(ld_stream_f4(a4[r] + i), xa, acc[r]);
        }
    } else {
        for (long long k = k0 + threadIdx.x; k < k1; k += NT) {
            const float xv = __ldg(x + k);
            #pragma unroll
            for (int r = 0; r < ROWS; ++r) acc[r] = fmaf(__ldg(rowp[r] + k), xv, acc[r]);
        }
    }

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) red[r][warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            float v = (lane < NT / 32) ? red[r][lane] : 0.f;
            v = warp_sum(v);
            const int row = row0 + r;
            if (lane == 0 && row < M) out[(long long)blockIdx.y * M + row] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT)
gemv_vec4(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ out,
          int M, long long K, long long chunk)
{
    gemv_body<true>(A, x, out, M, K, chunk);
}

extern "C" __global__ void __launch_bounds__(NT)
gemv_scalar(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ out,
            int M, long long K, long long chunk)
{
    gemv_body<false>(A, x, out, M, K, chunk);
}

// out[row] = sum_s partial[s * M + row]
extern "C" __global__ void sum_splits(const float* __restrict__ partial, float* __restrict__ out,
                                      int M, int S)
{
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M) return;
    float s = 0.f;
    for (int k = 0; k < S; ++k) s += partial[(long long)k * M + row];
    out[row] = s;
}
"""


class ModelNew(nn.Module):
    """
    Matrix-vector multiplication C = A @ B with custom CUDA kernels.
    """

    def __init__(self):
        super(ModelNew, self).__init__()
        self._mod = cudaforge.compile(_SRC)
        self._sm_count = {}

    def _num_sms(self, device):
        idx = device.index if device.index is not None else torch.cuda.current_device()
        n = self._sm_count.get(idx)
        if n is None:
            n = torch.cuda.get_device_properties(idx).multi_processor_count
            self._sm_count[idx] = n
        return n

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        out_dtype = torch.promote_types(A.dtype, B.dtype)
        vec_in = B.dim() == 1
        B2 = B.reshape(-1, 1) if vec_in else B

        A32 = A if A.dtype == torch.float32 else A.float()
        A32 = A32.contiguous()
        M, K = A32.shape
        N = B2.shape[1]
        Bt = (B2 if B2.dtype == torch.float32 else B2.float()).t().contiguous()  # (N, K)

        outT = torch.empty((N, M), device=A.device, dtype=torch.float32)
        if M > 0 and N > 0:
            if K == 0:
                outT.zero_()
            else:
                # split K so that the grid covers the GPU several times over
                row_groups = (M + _ROWS - 1) // _ROWS
                target_blocks = self._num_sms(A.device) * 32
                S = max(1, -(-target_blocks // row_groups))
                min_chunk = _NT * 4 * 8
                S = min(S, max(1, K // min_chunk), 65535)
                chunk = -(-K // S)
                chunk = ((chunk + 3) // 4) * 4
                S = -(-K // chunk)

                partial = None
                if S > 1:
                    partial = torch.empty((S, M), device=A.device, dtype=torch.float32)

                for j in range(N):
                    x = Bt[j]
                    dst = outT[j]
                    target = partial if S > 1 else dst
                    use_vec = (K % 4 == 0 and A32.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0)
                    kern = self._mod.gemv_vec4 if use_vec else self._mod.gemv_scalar
                    kern((row_groups, S), _NT, (A32, x, target, M, K, chunk))
                    if S > 1:
                        self._mod.sum_splits(((M + 255) // 256,), 256, (partial, dst, M, S))

        out = outT.t()
        if vec_in:
            out = out.reshape(M)
        else:
            out = out.contiguous()
        if out_dtype != torch.float32:
            out = out.to(out_dtype)
        return out
