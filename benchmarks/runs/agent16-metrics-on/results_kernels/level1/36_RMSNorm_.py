import torch
import torch.nn as nn
import cudaforge

_SRC = r"""
#define NW 8   // warps per block (256 threads)

template <int CPW, int VEC>
__device__ __forceinline__ void rms_body(const float* __restrict__ x, float* __restrict__ y,
                                         long long P, long long S, int C, float eps)
{
    __shared__ float part[NW * VEC * 32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long p0 = ((long long)blockIdx.x * 32 + lane) * VEC;   // first flattened (b, s) position
    const bool active = p0 < P;
    long long base = 0;
    if (active) {
        const long long b = p0 / S;
        const long long s = p0 - b * S;
        base = b * (long long)C * S + s;
    }

    float v[CPW][VEC];
    float ss[VEC];
    #pragma unroll
    for (int j = 0; j < VEC; ++j) ss[j] = 0.f;

    #pragma unroll
    for (int i = 0; i < CPW; ++i) {
        const int c = warp + i * NW;
        if (active && c < C) {
            const float* src = x + base + (long long)c * S;
            if constexpr (VEC == 4) {
                const float4 q = *reinterpret_cast<const float4*>(src);
                v[i][0] = q.x; v[i][1] = q.y; v[i][2] = q.z; v[i][3] = q.w;
            } else {
                v[i][0] = src[0];
            }
        } else {
            #pragma unroll
            for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
        }
        #pragma unroll
        for (int j = 0; j < VEC; ++j) ss[j] = fmaf(v[i][j], v[i][j], ss[j]);
    }

    #pragma unroll
    for (int j = 0; j < VEC; ++j) part[(warp * VEC + j) * 32 + lane] = ss[j];
    __syncthreads();

    float inv[VEC];
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        float tot = 0.f;
        #pragma unroll
        for (int w = 0; w < NW; ++w) tot += part[(w * VEC + j) * 32 + lane];
        inv[j] = 1.0f / sqrtf(tot / (float)C + eps);
    }

    #pragma unroll
    for (int i = 0; i < CPW; ++i) {
        const int c = warp + i * NW;
        if (active && c < C) {
            float* dst = y + base + (long long)c * S;
            if constexpr (VEC == 4) {
                float4 q;
                q.x = v[i][0] * inv[0];
                q.y = v[i][1] * inv[1];
                q.z = v[i][2] * inv[2];
                q.w = v[i][3] * inv[3];
                *reinterpret_cast<float4*>(dst) = q;
            } else {
                dst[0] = v[i][0] * inv[0];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) rms_c2_v4(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<2, 4>(x, y, P, S, C, eps); }
extern "C" __global__ void __launch_bounds__(256) rms_c4_v4(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<4, 4>(x, y, P, S, C, eps); }
extern "C" __global__ void __launch_bounds__(256) rms_c8_v4(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<8, 4>(x, y, P, S, C, eps); }
extern "C" __global__ void __launch_bounds__(256) rms_c16_v4(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<16, 4>(x, y, P, S, C, eps); }
extern "C" __global__ void __launch_bounds__(256) rms_c2_v1(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<2, 1>(x, y, P, S, C, eps); }
extern "C" __global__ void __launch_bounds__(256) rms_c4_v1(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<4, 1>(x, y, P, S, C, eps); }
extern "C" __global__ void __launch_bounds__(256) rms_c8_v1(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<8, 1>(x, y, P, S, C, eps); }
extern "C" __global__ void __launch_bounds__(256) rms_c16_v1(const float* x, float* y, long long P, long long S, int C, float eps) { rms_body<16, 1>(x, y, P, S, C, eps); }

// Fallback for many channels: one thread per position, two passes over the channels.
extern "C" __global__ void __launch_bounds__(256) rms_generic(const float* x, float* y, long long P, long long S, int C, float eps)
{
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= P) return;
    const long long b = p / S;
    const long long s = p - b * S;
    const long long base = b * (long long)C * S + s;
    float tot = 0.f;
    for (int c = 0; c < C; ++c) {
        const float a = x[base + (long long)c * S];
        tot = fmaf(a, a, tot);
    }
    const float inv = 1.0f / sqrtf(tot / (float)C + eps);
    for (int c = 0; c < C; ++c) {
        const long long o = base + (long long)c * S;
        y[o] = x[o] * inv;
    }
}
"""


class ModelNew(nn.Module):
    """
    RMS normalization over dim 1, one read and one write of the tensor.
    """
    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.num_features = num_features
        self.eps = eps
        self._mod = cudaforge.compile(_SRC, name="rmsnorm.cu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        xf = x if x.dtype == torch.float32 else x.float()
        xf = xf.contiguous()
        y = torch.empty_like(xf)
        if xf.numel() == 0:
            return y if orig_dtype == torch.float32 else y.to(orig_dtype)

        B = xf.shape[0]
        C = xf.shape[1]
        S = xf.numel() // (B * C)
        P = B * S
        eps = float(self.eps)

        cpw_needed = (C + 7) // 8
        cpw = None
        for cand in (2, 4, 8, 16):
            if cpw_needed <= cand:
                cpw = cand
                break

        if cpw is None:
            threads = 256
            grid = (P + threads - 1) // threads
            self._mod.rms_generic(grid, threads, (xf, y, int(P), int(S), int(C), eps))
        else:
            vec = 4 if (S % 4 == 0 and xf.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0) else 1
            kern = getattr(self._mod, "rms_c%d_v%d" % (cpw, vec))
            per_block = 32 * vec
            grid = (P + per_block - 1) // per_block
            kern(grid, 256, (xf, y, int(P), int(S), int(C), eps))

        return y if orig_dtype == torch.float32 else y.to(orig_dtype)
