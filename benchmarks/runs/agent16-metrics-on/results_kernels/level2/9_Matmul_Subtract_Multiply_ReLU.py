import torch
import torch.nn as nn
import cudaforge

_BM, _BN, _BK, _STAGES, _SROW = 128, 128, 32, 3, 36
_SMEM_BYTES = _STAGES * (_BM + _BN) * _SROW * 4  # 110592 bytes -> 2 blocks / SM

_SRC = r'''
#define BM 128
#define BN 128
#define BK 32
#define SROW 36          // BK + 4 floats of padding: conflict-free LDS.64 fragment reads
#define STAGES 3
#define NTHREADS 128

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// 3xTF32 split without cvt: f ~= hi + lo.
//  hi: round-to-nearest (ties away) to TF32 with integer ops, low 13 bits zero.
//  lo: the exact FP32 residual f - hi, passed raw; the .tf32 MMA ignores its low
//      13 mantissa bits (truncation), which costs at most 2^-21 |f| per operand.
// Inputs are finite, so no NaN/Inf handling is needed.
__device__ __forceinline__ void split_tf32(float f, unsigned& h, unsigned& l) {
    const unsigned u = __float_as_uint(f);
    h = (u + 0x1000u) & 0xffffe000u;
    l = __float_as_uint(f - __uint_as_float(h));
}

__device__ __forceinline__ void mma_tf32(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float epi(float acc, float b, float sub_v, float mul_v) {
    float v = acc + b;
    v = v - sub_v;
    v = v * mul_v;
    return (v < 0.f) ? 0.f : v;   // relu (propagates NaN like torch.relu)
}

// out[M,N] = relu(((A[M,K] @ W[N,K]^T) + bias[N] - sub) * mul)
// 3xTF32 tensor-core GEMM (FP32-level accuracy).
// Requirements: K % 4 == 0, A and W 16-byte aligned. Any M, N handled.
extern "C" __global__ void __launch_bounds__(NTHREADS, 2)
linear_sub_mul_relu_3xtf32(const float* __restrict__ A, const float* __restrict__ W,
                           const float* __restrict__ bias, float* __restrict__ out,
                           int M, int N, int K, float sub_v, float mul_v)
{
    extern __shared__ __align__(16) float smem[];

    const int tid  = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g    = lane >> 2;     // groupID
    const int t    = lane & 3;      // threadID_in_group
    const int wm   = warp >> 1;     // 0..1  (64 rows each)
    const int wn   = warp & 1;      // 0..1  (64 cols each)
    const int bm   = blockIdx.x * BM;
    const int bn   = blockIdx.y * BN;
    const int KT   = (K + BK - 1) / BK;

    const int STAGE_FLOATS = (BM + BN) * SROW;
    const unsigned smem_base = smem_u32(smem);

    // loader coordinates: 8 threads cover one 128-byte row chunk of the k-tile
    const int lrow = tid >> 3;          // 0..15
    const int lk   = (tid & 7) * 4;     // 0..28

    auto load_tile = [&](int stage, int kt) {
        const int k0 = kt * BK + lk;
        const bool kok = k0 < K;        // K % 4 == 0 -> whole 16B chunk valid
        const unsigned sA = smem_base + (unsigned)(stage * STAGE_FLOATS) * 4u;
        const unsigned sB = sA + (unsigned)(BM * SROW) * 4u;
        #pragma unroll
        for (int i = 0; i < BM / 16; ++i) {
            const int r  = lrow + i * 16;
            const int gr = bm + r;
            const bool ok = kok && (gr < M);
            const float* src = ok ? (A + (size_t)gr * (size_t)K + k0) : A;
            cp_async16(sA + (unsigned)(r * SROW + lk) * 4u, src, ok ? 16 : 0);
        }
        #pragma unroll
        for (int i = 0; i < BN / 16; ++i) {
            const int r  = lrow + i * 16;
            const int gn = bn + r;
            const bool ok = kok && (gn < N);
            const float* src = ok ? (W + (size_t)gn * (size_t)K + k0) : W;
            cp_async16(sB + (unsigned)(r * SROW + lk) * 4u, src, ok ? 16 : 0);
        }
    };

    float acc[4][8][4];
    #pragma unroll
    for (int mi = 0; mi < 4; ++mi)
        #pragma unroll
        for (int ni = 0; ni < 8; ++ni)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    // Physical k offset (within the 32-wide k-tile) of this thread's fragment pair.
    // k-step s reads the float2 at koff + 4*s: .x is logical k = t, .y is logical k = t+4.
    // For t = 0..3, s = 0..3 this covers the 32 physical columns exactly once, and A and B
    // use the same mapping, so each k-tile's dot product is only permuted.
    // Banks per half-warp LDS.64: 4g + {0,2,16,18} + 4s -> 16 distinct bank pairs.
    const int koff = (t & 1) * 2 + (t >> 1) * 16;

    // prologue
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_tile(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // tile kt visible to all; stage (kt-1)%STAGES free for reuse

        const int nk = kt + STAGES - 1;
        if (nk < KT) load_tile(nk % STAGES, nk);
        cp_async_commit();

        const float* As = smem + (kt % STAGES) * STAGE_FLOATS;
        const float* Bs = As + BM * SROW;
        const float* Ap = As + (wm * 64 + g) * SROW + koff;
        const float* Bp = Bs + (wn * 64 + g) * SROW + koff;

        #pragma unroll
        for (int s = 0; s < 4; ++s) {
            // A fragments of this k-step, split once into TF32 hi / lo (32 registers).
            unsigned ah[4][4], al[4][4];
            #pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                const float2 lo = *reinterpret_cast<const float2*>(Ap + (mi * 16) * SROW + 4 * s);
                const float2 hi = *reinterpret_cast<const float2*>(Ap + (mi * 16 + 8) * SROW + 4 * s);
                split_tf32(lo.x, ah[mi][0], al[mi][0]);   // row g,   logical k=t
                split_tf32(hi.x, ah[mi][1], al[mi][1]);   // row g+8, logical k=t
                split_tf32(lo.y, ah[mi][2], al[mi][2]);   // row g,   logical k=t+4
                split_tf32(hi.y, ah[mi][3], al[mi][3]);   // row g+8, logical k=t+4
            }

            // Stream B one n-fragment at a time.
            #pragma unroll
            for (int ni = 0; ni < 8; ++ni) {
                const float2 bv = *reinterpret_cast<const float2*>(Bp + (ni * 8) * SROW + 4 * s);
                unsigned bh0, bl0, bh1, bl1;
                split_tf32(bv.x, bh0, bl0);   // logical k=t,   col g
                split_tf32(bv.y, bh1, bl1);   // logical k=t+4, col g

                #pragma unroll
                for (int mi = 0; mi < 4; ++mi) {
                    // small terms first, then the big one
                    mma_tf32(acc[mi][ni], al[mi][0], al[mi][1], al[mi][2], al[mi][3], bh0, bh1);   // a_lo * b_hi
                    mma_tf32(acc[mi][ni], ah[mi][0], ah[mi][1], ah[mi][2], ah[mi][3], bl0, bl1);   // a_hi * b_lo
                    mma_tf32(acc[mi][ni], ah[mi][0], ah[mi][1], ah[mi][2], ah[mi][3], bh0, bh1);   // a_hi * b_hi
                }
            }
        }
    }
    cp_async_wait<0>();

    // fused epilogue
    const bool even_n = (N & 1) == 0;
    #pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
        const int col = bn + wn * 64 + ni * 8 + 2 * t;
        const float b0 = (col < N)     ? __ldg(bias + col)     : 0.f;
        const float b1 = (col + 1 < N) ? __ldg(bias + col + 1) : 0.f;
        #pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = bm + wm * 64 + mi * 16 + g + h * 8;
                if (r < M) {
                    const float v0 = epi(acc[mi][ni][2 * h],     b0, sub_v, mul_v);
                    const float v1 = epi(acc[mi][ni][2 * h + 1], b1, sub_v, mul_v);
                    float* o = out + (size_t)r * (size_t)N + col;
                    if (even_n && (col + 1 < N)) {
                        *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
                    } else {
                        if (col < N)     o[0] = v0;
                        if (col + 1 < N) o[1] = v1;
                    }
                }
            }
        }
    }
}

// Generic FP32 fallback (any K / alignment).
extern "C" __global__ void __launch_bounds__(256)
linear_sub_mul_relu_fallback(const float* __restrict__ A, const float* __restrict__ W,
                             const float* __restrict__ bias, float* __restrict__ out,
                             int M, int N, int K, float sub_v, float mul_v)
{
    __shared__ float As[16][17];
    __shared__ float Ws[16][17];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * 16 + ty;
    const int col = blockIdx.x * 16 + tx;
    const int wrow = blockIdx.x * 16 + ty;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        const int k = k0 + tx;
        As[ty][tx] = (row < M && k < K)  ? A[(size_t)row * K + k]  : 0.f;
        Ws[ty][tx] = (wrow < N && k < K) ? W[(size_t)wrow * K + k] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 16; ++kk) acc += As[ty][kk] * Ws[tx][kk];
        __syncthreads();
    }
    if (row < M && col < N) out[(size_t)row * N + col] = epi(acc, bias[col], sub_v, mul_v);
}
'''

_mod = cudaforge.compile(_SRC)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, subtract_value, multiply_value):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.subtract_value = subtract_value
        self.multiply_value = multiply_value

    def forward(self, x):
        w = self.linear.weight
        b = self.linear.bias
        N, K = w.shape[0], w.shape[1]
        lead = x.shape[:-1]

        x2 = x.reshape(-1, K)
        if x2.dtype != torch.float32:
            x2 = x2.to(torch.float32)
        x2 = x2.contiguous()
        wc = w.contiguous()
        if wc.dtype != torch.float32:
            wc = wc.to(torch.float32)
        bc = b.contiguous()
        if bc.dtype != torch.float32:
            bc = bc.to(torch.float32)

        M = x2.shape[0]
        out = torch.empty((M, N), dtype=torch.float32, device=x.device)
        if M > 0 and N > 0:
            sub_v = float(self.subtract_value)
            mul_v = float(self.multiply_value)
            if K % 4 == 0 and x2.data_ptr() % 16 == 0 and wc.data_ptr() % 16 == 0:
                grid = ((M + _BM - 1) // _BM, (N + _BN - 1) // _BN)
                _mod.linear_sub_mul_relu_3xtf32(
                    grid, 128, (x2, wc, bc, out, M, N, K, sub_v, mul_v),
                    shared_mem=_SMEM_BYTES)
            else:
                grid = ((N + 15) // 16, (M + 15) // 16)
                _mod.linear_sub_mul_relu_fallback(
                    grid, (16, 16), (x2, wc, bc, out, M, N, K, sub_v, mul_v))
        return out.reshape(*lead, N)
