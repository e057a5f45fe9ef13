import torch
import torch.nn as nn
import cudaforge

_BM, _BN, _BK, _STAGES, _THREADS = 128, 128, 32, 3, 256
_SMEM_BYTES = _STAGES * (_BM + _BN) * _BK * 4   # 96 KB -> 2 blocks per SM

_SRC = r"""
#define BM 128
#define BN 128
#define BK 32
#define STAGES 3
#define THREADS 256
#define STAGE_FLOATS ((BM + BN) * BK)

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// cvt-free 3xTF32 split (as in CUTLASS's fast-FP32 path):
//   hi = x rounded (on magnitude) to nearest TF32, low 13 mantissa bits cleared;
//   lo = exact FP32 residual x - hi, passed raw: the tensor core reads only the top 19 bits
//        of a .tf32 operand, so lo is simply truncated by the hardware.
// 3 instructions (IADD, LOP3, FADD) instead of two cvt.rna.tf32 sequences.
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
    const unsigned u = __float_as_uint(x);
    hi = (u + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4],
                                         unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared tile layout: [rows][BK] floats, no padding; the 16-byte chunk index inside a row
// is XOR-swizzled with ((row & 1) << 2) so that both the cp.async stores and the
// 128-bit fragment loads are bank-conflict free.
__device__ __forceinline__ void load_tile(float* As, float* Bs,
                                          const float* __restrict__ X,
                                          const float* __restrict__ W,
                                          int M, int N, int K, int bm, int bn, int k0, int tid)
{
    #pragma unroll
    for (int it = 0; it < (BM * BK / 4) / THREADS; ++it) {
        const int c = tid + it * THREADS;
        const int r = c >> 3;
        const int ch = c & 7;
        const int gm = bm + r;
        const int gk = k0 + (ch << 2);
        const bool ok = (gm < M) && (gk < K);
        const float* src = ok ? (X + (long long)gm * K + gk) : X;
        float* dst = As + r * BK + ((ch ^ ((r & 1) << 2)) << 2);
        cp_async16(smem_u32(dst), src, ok ? 16 : 0);
    }
    #pragma unroll
    for (int it = 0; it < (BN * BK / 4) / THREADS; ++it) {
        const int c = tid + it * THREADS;
        const int r = c >> 3;
        const int ch = c & 7;
        const int gn = bn + r;
        const int gk = k0 + (ch << 2);
        const bool ok = (gn < N) && (gk < K);
        const float* src = ok ? (W + (long long)gn * K + gk) : W;
        float* dst = Bs + r * BK + ((ch ^ ((r & 1) << 2)) << 2);
        cp_async16(smem_u32(dst), src, ok ? 16 : 0);
    }
}

// Y[M,N] = relu(X[M,K] * W[N,K]^T + bias[N]);  requires K % 4 == 0 and 16B-aligned X, W.
// 3xTF32 split: a*b ~= a_lo*b_hi + a_hi*b_lo + a_hi*b_hi  (FP32-level accuracy).
extern "C" __global__ void __launch_bounds__(THREADS, 2)
gemm_tf32_bias_relu(const float* __restrict__ X, const float* __restrict__ W,
                    const float* __restrict__ bias, float* __restrict__ Y,
                    int M, int N, int K)
{
    extern __shared__ __align__(16) float smem[];

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp >> 2;         // 0..1 : 64-row slab
    const int wn = warp & 3;          // 0..3 : 32-col slab
    const int g = lane >> 2;          // groupID
    const int t = lane & 3;           // thread in group
    const int swz = (g & 1) << 2;

    const int bm = blockIdx.x * BM;
    const int bn = blockIdx.y * BN;
    const int KT = (K + BK - 1) / BK;

    float acc[4][4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) {
            float* As = smem + s * STAGE_FLOATS;
            load_tile(As, As + BM * BK, X, W, M, N, K, bm, bn, s * BK, tid);
        }
        cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();

        const int nk = kt + STAGES - 1;
        if (nk < KT) {
            float* As = smem + (nk % STAGES) * STAGE_FLOATS;
            load_tile(As, As + BM * BK, X, W, M, N, K, bm, bn, nk * BK, tid);
        }
        cp_async_commit();

        const float* As = smem + (kt % STAGES) * STAGE_FLOATS;
        const float* Bs = As + BM * BK;

        // Within each 16-wide k group, thread (g,t) reads physical k = 4t..4t+3 for both
        // operands; k-step 0 uses (4t, 4t+1), k-step 1 uses (4t+2, 4t+3). The same
        // permutation of k is applied to A and B, so the dot products are unchanged.
        #pragma unroll
        for (int q = 0; q < BK / 16; ++q) {
            const int coff = ((((q << 2) + t) ^ swz) << 2);

            #pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                // B fragments (hi/lo) for this k-step only.
                unsigned bh[4][2], bl[4][2];
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float4 v = *reinterpret_cast<const float4*>(Bs + (wn * 32 + j * 8 + g) * BK + coff);
                    const float b0 = ks ? v.z : v.x;
                    const float b1 = ks ? v.w : v.y;
                    split_tf32(b0, bh[j][0], bl[j][0]);
                    split_tf32(b1, bh[j][1], bl[j][1]);
                }

                #pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = wm * 64 + i * 16 + g;
                    const float4 lo = *reinterpret_cast<const float4*>(As + r * BK + coff);
                    const float4 hi = *reinterpret_cast<const float4*>(As + (r + 8) * BK + coff);
                    const float l0 = ks ? lo.z : lo.x;
                    const float l1 = ks ? lo.w : lo.y;
                    const float h0 = ks ? hi.z : hi.x;
                    const float h1 = ks ? hi.w : hi.y;
                    unsigned ah[4], al[4];
                    split_tf32(l0, ah[0], al[0]);
                    split_tf32(h0, ah[1], al[1]);
                    split_tf32(l1, ah[2], al[2]);
                    split_tf32(h1, ah[3], al[3]);
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        mma_tf32(acc[i][j], al, bh[j][0], bh[j][1]);
                        mma_tf32(acc[i][j], ah, bl[j][0], bl[j][1]);
                        mma_tf32(acc[i][j], ah, bh[j][0], bh[j][1]);
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue: + bias, ReLU, store.
    const bool vec2 = ((N & 1) == 0);
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = bn + wn * 32 + j * 8 + 2 * t;
        const float b0 = (col < N) ? __ldg(bias + col) : 0.f;
        const float b1 = (col + 1 < N) ? __ldg(bias + col + 1) : 0.f;
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = bm + wm * 64 + i * 16 + g + 8 * h;
                if (row < M) {
                    const float v0 = fmaxf(acc[i][j][2 * h + 0] + b0, 0.f);
                    const float v1 = fmaxf(acc[i][j][2 * h + 1] + b1, 0.f);
                    float* yp = Y + (long long)row * N + col;
                    if (vec2 && col + 1 < N) {
                        *reinterpret_cast<float2*>(yp) = make_float2(v0, v1);
                    } else {
                        if (col < N) yp[0] = v0;
                        if (col + 1 < N) yp[1] = v1;
                    }
                }
            }
        }
    }
}

// Generic FP32 fallback (any K, any alignment).
extern "C" __global__ void gemm_bias_relu_simple(const float* __restrict__ X, const float* __restrict__ W,
                                                 const float* __restrict__ bias, float* __restrict__ Y,
                                                 int M, int N, int K)
{
    __shared__ float Xs[16][17];
    __shared__ float Ws[16][17];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * 16 + ty;
    const int col = blockIdx.x * 16 + tx;
    const int wn = blockIdx.x * 16 + ty;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        const int k = k0 + tx;
        Xs[ty][tx] = (row < M && k < K) ? X[(long long)row * K + k] : 0.f;
        Ws[ty][tx] = (wn < N && k < K) ? W[(long long)wn * K + k] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 16; ++kk) acc = fmaf(Xs[ty][kk], Ws[tx][kk], acc);
        __syncthreads();
    }
    if (row < M && col < N) Y[(long long)row * N + col] = fmaxf(acc + bias[col], 0.f);
}
"""


class ModelNew(nn.Module):
    """
    relu(x @ W^T + bias) with a fused 3xTF32 (FP32-accurate) tensor-core GEMM kernel.
    The hi/lo operand split is cvt-free (integer round + raw FP32 residual).
    """

    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self._mod = cudaforge.compile(_SRC)

    def forward(self, x):
        W = self.gemm.weight
        N, K = W.shape
        lead = x.shape[:-1]
        out_dtype = x.dtype

        x2 = x.reshape(-1, K)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        x2 = x2.contiguous()
        Wc = W.detach()
        if Wc.dtype != torch.float32:
            Wc = Wc.float()
        Wc = Wc.contiguous()
        b = self.bias.detach().reshape(-1)
        if b.dtype != torch.float32:
            b = b.float()
        if b.numel() == 1 and N != 1:
            b = b.expand(N)
        b = b.contiguous()

        M = x2.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        if M > 0 and N > 0:
            fast = (K % 4 == 0 and x2.data_ptr() % 16 == 0 and Wc.data_ptr() % 16 == 0)
            if fast:
                grid = ((M + _BM - 1) // _BM, (N + _BN - 1) // _BN)
                self._mod.gemm_tf32_bias_relu(grid, _THREADS, (x2, Wc, b, y, M, N, K),
                                              shared_mem=_SMEM_BYTES)
            else:
                grid = ((N + 15) // 16, (M + 15) // 16)
                self._mod.gemm_bias_relu_simple(grid, (16, 16), (x2, Wc, b, y, M, N, K))

        y = y.reshape(*lead, N)
        if out_dtype != torch.float32:
            y = y.to(out_dtype)
        return y
