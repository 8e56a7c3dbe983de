// naive: attention the way the textbook writes it, three kernels with S and P in HBM.
//
//   1. naive_scores_*: S = scale * Q K^T, capped and biased (softcap, ALiBi), invisible
//                      pairs set to -inf                                  (writes S)
//   2. naive_softmax:  three passes over each row of S: max, sum, normalise (reads S 3x,
//                      writes P and LSE); a sink logit joins the max and the sum
//   3. naive_pv_*:     O = P V over d_v columns                           (reads P)
//
// Workspaces (manifest): [0] S, [1] P, both fp32 (B, H, Nq, Nk) row-major.
// FP8 inputs (FaParams.fp8): each e4m3 element is turned into a float times its row's
// descale as it is loaded; the rest runs as for the case dtype.
// This is the baseline whose HBM traffic the seed chapter counts (194 MB at N = 4096).
#include "fa_harness.h"

#define NV_TILE 16      // scores: 16 x 16 output tile per block, 16-wide slices of d
#define NV_PV_ROWS 8    // pv: 8 query rows per block (block = 32 x 8)
#define NV_MAX_CHUNKS 8 // pv: head_dim <= 256

// An input element as a float: an e4m3 byte times its row's descale where the case's fp8
// axis made the tensor e4m3 (FaParams' doc), else an element of the case dtype. `idx` in
// elements (e4m3 ones are bytes).
template <int DT>
__device__ __forceinline__ float nv_in(const void* base, long long idx, bool e4m3, float ds) {
    return e4m3 ? fa_e4m3_to_float(((const unsigned char*)base)[idx]) * ds
                : FaElem<DT>::to_float(((const unsigned short*)base)[idx]);
}

// The descale of row (b, h, n) of an e4m3 tensor (1 where it is not e4m3).
__device__ __forceinline__ float nv_descale(const float* d, long long sb, long long sh,
                                            long long sr, int b, int h, int n) {
    return d != nullptr ? d[b * sb + h * sh + n * sr] : 1.f;
}

// ---- 1. S = scale * Q K^T ---------------------------------------------------------------
template <int DT>
__device__ __forceinline__ void naive_scores(const FaParams& p) {
    __shared__ float qs[NV_TILE][NV_TILE + 1];  // +1: column reads hit distinct banks
    __shared__ float ks[NV_TILE][NV_TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int bh = blockIdx.z;
    const int b = bh / p.heads, h = bh % p.heads;
    const int kvh = h / (p.heads / p.kv_heads);
    const int i0 = blockIdx.y * NV_TILE, j0 = blockIdx.x * NV_TILE;
    const int d = p.head_dim;
    const long long q0 = b * p.q_batch_stride + h * p.q_head_stride;
    const long long k0 = b * p.k_batch_stride + kvh * p.k_head_stride;
    const bool qe = p.fp8 == FA_FP8_QKV, ke = p.fp8 != FA_FP8_NONE;
    const int qi = i0 + ty, kj = j0 + ty;
    const float qd = qe && qi < p.seqlen_q
        ? nv_descale(p.q_descale, p.qd_batch_stride, p.qd_head_stride, p.qd_row_stride, b, h, qi) : 1.f;
    const float kd = ke && kj < p.seqlen_k
        ? nv_descale(p.k_descale, p.kd_batch_stride, p.kd_head_stride, p.kd_row_stride, b, kvh, kj) : 1.f;

    float acc = 0.f;
    for (int d0 = 0; d0 < d; d0 += NV_TILE) {
        const int dd = d0 + tx;
        qs[ty][tx] = (qi < p.seqlen_q && dd < d)
                         ? nv_in<DT>(p.q, q0 + (long long)qi * p.q_row_stride + dd, qe, qd) : 0.f;
        ks[ty][tx] = (kj < p.seqlen_k && dd < d)
                         ? nv_in<DT>(p.k, k0 + (long long)kj * p.k_row_stride + dd, ke, kd) : 0.f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < NV_TILE; ++t) acc += qs[ty][t] * ks[tx][t];
        __syncthreads();
    }
    const int i = i0 + ty, j = j0 + tx;
    if (i < p.seqlen_q && j < p.seqlen_k) {
        const bool vis = j < fa_key_end(p, b, i) && fa_bool_mask_ok(p, b, i, j);
        float* S = (float*)p.workspace[0];
        S[((long long)bh * p.seqlen_q + i) * p.seqlen_k + j] =
            vis ? fa_score_mods(p, acc * p.scale, h, i, j) : FA_NEG_INF;
    }
}

// ---- 2. P = softmax(S), three passes --------------------------------------------------
// Block-wide reduction; `red` is reused, hence the trailing barrier.
__device__ __forceinline__ float nv_block_reduce(float x, bool take_max) {
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = take_max ? fa_warp_max(x) : fa_warp_sum(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float y = lane < nw ? red[lane] : (take_max ? FA_NEG_INF : 0.f);
        y = take_max ? fa_warp_max(y) : fa_warp_sum(y);
        if (lane == 0) red[0] = y;
    }
    __syncthreads();
    const float r = red[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void __launch_bounds__(256) naive_softmax(FaParams p) {
    const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const long long row = ((long long)b * p.heads + h) * p.seqlen_q + i;
    const float* S = (const float*)p.workspace[0] + row * p.seqlen_k;
    float* P = (float*)p.workspace[1] + row * p.seqlen_k;
    const int n = p.seqlen_k;

    // A sink logit (FaParams.sinks) is one more key with no value: in the max and the sum,
    // not in P. A row that sees no key then has P = 0 and LSE = the sink.
    const float z = p.sinks != nullptr ? p.sinks[h] : FA_NEG_INF;
    float m = FA_NEG_INF;  // pass 1: row max
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, S[j]);
    m = fmaxf(nv_block_reduce(m, true), z);
    // -inf guard: a fully masked row has m = -inf; subtracting 0 instead keeps
    // exp(-inf - 0) = 0 where exp(-inf - -inf) would be NaN.
    const float m_use = m == FA_NEG_INF ? 0.f : m;
    float l = 0.f;  // pass 2: row sum
    for (int j = threadIdx.x; j < n; j += blockDim.x) l += expf(S[j] - m_use);
    l = nv_block_reduce(l, false) + (p.sinks != nullptr ? expf(z - m_use) : 0.f);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) P[j] = expf(S[j] - m_use) * inv;  // pass 3
    if (threadIdx.x == 0 && p.lse != nullptr) p.lse[row] = l > 0.f ? m + logf(l) : FA_NEG_INF;
}

// ---- 3. O = P V -------------------------------------------------------------------------
template <int DT>
__device__ __forceinline__ void naive_pv(const FaParams& p) {
    const int lane = threadIdx.x;  // block (32, NV_PV_ROWS): x walks head dims, y rows
    const int i = blockIdx.x * NV_PV_ROWS + threadIdx.y;
    const int h = blockIdx.y, b = blockIdx.z;
    if (i >= p.seqlen_q) return;
    const int kvh = h / (p.heads / p.kv_heads);
    const int d = p.head_dim_v;  // V's and O's columns (d_v, = head_dim unless the case sets it)
    const float* P = (const float*)p.workspace[1] +
                     (((long long)b * p.heads + h) * p.seqlen_q + i) * p.seqlen_k;
    const long long v0 = b * p.v_batch_stride + kvh * p.v_head_stride;
    const bool ve = p.fp8 != FA_FP8_NONE;
    float acc[NV_MAX_CHUNKS];
#pragma unroll
    for (int c = 0; c < NV_MAX_CHUNKS; ++c) acc[c] = 0.f;
    for (int j = 0; j < p.seqlen_k; ++j) {
        const float pj = P[j];
        const long long vj = v0 + (long long)j * p.v_row_stride;
        const float vd = ve ? nv_descale(p.v_descale, p.kd_batch_stride, p.kd_head_stride,
                                         p.kd_row_stride, b, kvh, j) : 1.f;
#pragma unroll
        for (int c = 0; c < NV_MAX_CHUNKS; ++c) {
            const int dim = c * 32 + lane;
            if (dim < d) acc[c] += pj * nv_in<DT>(p.v, vj + dim, ve, vd);
        }
    }
    unsigned short* O = (unsigned short*)p.o + b * p.o_batch_stride + h * p.o_head_stride +
                        (long long)i * p.o_row_stride;
#pragma unroll
    for (int c = 0; c < NV_MAX_CHUNKS; ++c) {
        const int dim = c * 32 + lane;
        if (dim < d) O[dim] = FaElem<DT>::from_float(acc[c]);
    }
}

extern "C" __global__ void __launch_bounds__(256) naive_scores_fp16(FaParams p) { naive_scores<FA_DTYPE_FP16>(p); }
extern "C" __global__ void __launch_bounds__(256) naive_scores_bf16(FaParams p) { naive_scores<FA_DTYPE_BF16>(p); }
extern "C" __global__ void __launch_bounds__(256) naive_pv_fp16(FaParams p) { naive_pv<FA_DTYPE_FP16>(p); }
extern "C" __global__ void __launch_bounds__(256) naive_pv_bf16(FaParams p) { naive_pv<FA_DTYPE_BF16>(p); }
