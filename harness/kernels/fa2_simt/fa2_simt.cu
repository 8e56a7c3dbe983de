// fa2_simt: FlashAttention-2 forward on CUDA cores (fp32 FMA, no tensor cores).
//
// The seed chapter's 14.5 pseudocode, one block per (query block of 64 rows, head, batch):
//   outer loop (grid):  query block Q_i (64 rows) staged once in shared memory
//   inner loop:         K_j, V_j tiles of 32 keys staged in shared memory
//       S = Q_i K_j^T          each warp owns 16 rows, each lane one key of the tile
//       online softmax         m, l per row in registers, with the -inf guard
//       O_i = alpha O_i + P V  each lane owns head dims lane, lane + 32, ... of its 16 rows
//   O_i / l and LSE = (m + log2 l) ln 2 are written once at the end.
//
// Entry points are instantiated per head-dim capacity DC (a multiple of 32); odd head dims
// (40, 59, 111, ...) run on the next capacity with zero-filled padding columns, which add
// nothing to the dot products and are never stored.
#include "fa_harness.h"

#define F2_BQ 64       // query rows per block
#define F2_BK 32       // keys per inner tile (one per lane)
#define F2_RW 16       // query rows per warp (4 warps x 16 = 64)
#define F2_THREADS 128

// Stage rows [row0, row0 + nvalid) of a (seq, d) matrix into shared memory (stride `sst`
// floats), multiplied by `scale`; rows past nvalid and columns past d are zero. Uses one
// 16-byte load per 8 elements where the address allows it.
template <int DT, int DC, int ROWS>
__device__ __forceinline__ void f2_stage(float* dst, int sst, const unsigned short* src,
                                         long long rs, int row0, int nvalid, int d, float scale) {
    constexpr int CPR = DC / 8;  // 8-element chunks per row
    for (int t = threadIdx.x; t < ROWS * CPR; t += F2_THREADS) {
        const int r = t / CPR;
        const int c = (t - r * CPR) * 8;
        float f[8];
        if (r < nvalid) {
            const unsigned short* g = src + (long long)(row0 + r) * rs + c;
            if (c + 8 <= d && (reinterpret_cast<unsigned long long>(g) & 15ull) == 0) {
                const uint4 u = __ldg(reinterpret_cast<const uint4*>(g));
                fa_unpack8<DT>(u, f);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) f[e] = (c + e < d) ? FaElem<DT>::to_float(g[e]) : 0.f;
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) f[e] = 0.f;
        }
        float4* o = reinterpret_cast<float4*>(dst + r * sst + c);
        o[0] = make_float4(f[0] * scale, f[1] * scale, f[2] * scale, f[3] * scale);
        o[1] = make_float4(f[4] * scale, f[5] * scale, f[6] * scale, f[7] * scale);
    }
}

template <int DT, int DC>
__device__ __forceinline__ void fa2_simt_fwd(const FaParams& p) {
    constexpr int NC = DC / 32;   // head dims per lane in the PV product
    constexpr int QS = DC + 4;    // padded row stride of Qs/Ks: float4 reads stay conflict-free
    extern __shared__ float4 f2_smem4[];
    float* Qs = reinterpret_cast<float*>(f2_smem4);  // [F2_BQ][QS], pre-scaled by scale*log2(e)
    float* Ks = Qs + F2_BQ * QS;                      // [F2_BK][QS]
    float* Vs = Ks + F2_BK * QS;                      // [F2_BK][DC]
    float* Ps = Vs + F2_BK * DC;                      // [F2_BQ][F2_BK] probabilities
    constexpr unsigned int kNeed = (F2_BQ * QS + F2_BK * QS + F2_BK * DC + F2_BQ * F2_BK) * 4;
    if (fa_dynamic_smem_bytes() < kNeed || p.head_dim > DC) __trap();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q0 = blockIdx.x * F2_BQ;
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (p.heads / p.kv_heads);
    const int d = p.head_dim, nq = p.seqlen_q, nk = p.seqlen_k;
    const bool causal = (p.mask_kind & FA_MASK_CAUSAL) != 0;
    // Keys of this batch entry (sequence end and key padding); causality is per row.
    int kb_end = nk;
    if (p.mask_kind & FA_MASK_KEY_PADDING) kb_end = min(kb_end, p.seqlens_k[b]);
    const int q_last = min(q0 + F2_BQ, nq) - 1;
    const int blk_end = fa_key_end(p, b, q_last);  // no row of the block sees a key past this

    const unsigned short* Q = (const unsigned short*)p.q + b * p.q_batch_stride + h * p.q_head_stride;
    const unsigned short* K = (const unsigned short*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
    const unsigned short* V = (const unsigned short*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;

    f2_stage<DT, DC, F2_BQ>(Qs, QS, Q, p.q_row_stride, q0, min(F2_BQ, nq - q0), d, p.scale_log2);

    const int r0 = warp * F2_RW;  // this warp's first row within the block
    float m[F2_RW], l[F2_RW], acc[F2_RW][NC];
#pragma unroll
    for (int r = 0; r < F2_RW; ++r) {
        m[r] = FA_NEG_INF;
        l[r] = 0.f;  // per-lane partial sum; reduced across the warp once at the end
#pragma unroll
        for (int t = 0; t < NC; ++t) acc[r][t] = 0.f;
    }

    for (int k0 = 0; k0 < blk_end; k0 += F2_BK) {
        __syncthreads();  // Q staged (first pass) / everyone done with the previous K, V tile
        const int kvalid = min(F2_BK, blk_end - k0);  // keys past blk_end are never needed
        f2_stage<DT, DC, F2_BK>(Ks, QS, K, p.k_row_stride, k0, kvalid, d, 1.f);
        f2_stage<DT, DC, F2_BK>(Vs, DC, V, p.v_row_stride, k0, kvalid, d, 1.f);
        __syncthreads();

        // S = Q K^T: lane computes key (k0 + lane) against the warp's 16 rows.
        float s[F2_RW];
#pragma unroll
        for (int r = 0; r < F2_RW; ++r) s[r] = 0.f;
        const float* krow = Ks + lane * QS;
#pragma unroll 2
        for (int c = 0; c < DC; c += 4) {
            const float4 kv = *reinterpret_cast<const float4*>(krow + c);
#pragma unroll
            for (int r = 0; r < F2_RW; ++r) {
                const float4 qv = *reinterpret_cast<const float4*>(Qs + (r0 + r) * QS + c);
                s[r] = fmaf(qv.x, kv.x, s[r]);
                s[r] = fmaf(qv.y, kv.y, s[r]);
                s[r] = fmaf(qv.z, kv.z, s[r]);
                s[r] = fmaf(qv.w, kv.w, s[r]);
            }
        }

        // Mask, then the online softmax update of each row.
        const int j = k0 + lane;
#pragma unroll
        for (int r = 0; r < F2_RW; ++r) {
            const int i = q0 + r0 + r;
            const int rend = causal ? min(kb_end, i + p.causal_offset + 1) : kb_end;
            const bool vis = i < nq && j < rend && fa_bool_mask_ok(p, b, i, j);
            const float sv = vis ? s[r] : FA_NEG_INF;
            const float m_new = fmaxf(m[r], fa_warp_max(sv));
            // -inf guard: while a row has seen nothing, m_new = -inf; use 0 as the
            // reference so exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
            const float m_use = m_new == FA_NEG_INF ? 0.f : m_new;
            const float alpha = exp2f(m[r] - m_use);
            const float pv = exp2f(sv - m_use);
            l[r] = l[r] * alpha + pv;
#pragma unroll
            for (int t = 0; t < NC; ++t) acc[r][t] *= alpha;
            m[r] = m_new;
            Ps[(r0 + r) * F2_BK + lane] = pv;
        }
        __syncwarp();

        // O += P V: lane owns dims lane + 32 t; four keys per step.
#pragma unroll 2
        for (int jj = 0; jj < F2_BK; jj += 4) {
            float vv[4][NC];
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int t = 0; t < NC; ++t) vv[u][t] = Vs[(jj + u) * DC + lane + 32 * t];
#pragma unroll
            for (int r = 0; r < F2_RW; ++r) {
                const float4 pp = *reinterpret_cast<const float4*>(Ps + (r0 + r) * F2_BK + jj);
#pragma unroll
                for (int t = 0; t < NC; ++t) {
                    float a = acc[r][t];
                    a = fmaf(pp.x, vv[0][t], a);
                    a = fmaf(pp.y, vv[1][t], a);
                    a = fmaf(pp.z, vv[2][t], a);
                    a = fmaf(pp.w, vv[3][t], a);
                    acc[r][t] = a;
                }
            }
        }
    }

    // Epilogue: O = acc / l, LSE = (m + log2 l) ln 2; rows that saw nothing: 0 and -inf.
#pragma unroll
    for (int r = 0; r < F2_RW; ++r) {
        const int i = q0 + r0 + r;
        const float lsum = fa_warp_sum(l[r]);  // all lanes take part (outside the row test)
        if (i < nq) {
            const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
            unsigned short* o = (unsigned short*)p.o + b * p.o_batch_stride + h * p.o_head_stride +
                                (long long)i * p.o_row_stride;
#pragma unroll
            for (int t = 0; t < NC; ++t) {
                const int c = lane + 32 * t;
                if (c < d) o[c] = FaElem<DT>::from_float(acc[r][t] * inv);
            }
            if (lane == 0 && p.lse != nullptr)
                p.lse[((long long)b * p.heads + h) * nq + i] =
                    lsum > 0.f ? (m[r] + log2f(lsum)) * FA_LN2 : FA_NEG_INF;
        }
    }
}

// Entry points: fa2_simt_fwd_<dtype>_d<head_dim>, each running on capacity DC >= head_dim.
#define F2_ENTRY(SHORT, DT, D, DC)                                                       \
    extern "C" __global__ void __launch_bounds__(F2_THREADS)                            \
        fa2_simt_fwd_##SHORT##_d##D(FaParams p) { fa2_simt_fwd<DT, DC>(p); }
#define F2_ENTRIES(SHORT, DT)       \
    F2_ENTRY(SHORT, DT, 40, 64)     \
    F2_ENTRY(SHORT, DT, 59, 64)     \
    F2_ENTRY(SHORT, DT, 64, 64)     \
    F2_ENTRY(SHORT, DT, 96, 96)     \
    F2_ENTRY(SHORT, DT, 111, 128)   \
    F2_ENTRY(SHORT, DT, 128, 128)
F2_ENTRIES(fp16, FA_DTYPE_FP16)
F2_ENTRIES(bf16, FA_DTYPE_BF16)
