// fa1: FlashAttention-1 forward, the loop order of the FA1 paper's Algorithm 1.
//
// One block per (batch, head), as in FA1. The OUTER loop walks K/V blocks of 32 keys,
// which are staged in shared memory once; the INNER loop walks the query rows (each warp
// takes rows warp, warp + 8, ...). Because the outer loop is over keys, a row's state
// (accumulator O_i, max m_i, sum l_i) cannot stay on chip: it lives in HBM workspaces and
// is read back and written again on every outer iteration - exactly the traffic FA2 removes
// by swapping the loops. A second kernel divides by l and writes O and LSE.
//
// Workspaces: [0] acc fp32 (B, H, Nq, d), [1] m fp32 (B, H, Nq) (log2 domain),
//             [2] l fp32 (B, H, Nq).
#include "fa_harness.h"

#define F1_BK 32        // keys per outer block: one key per lane when scoring
#define F1_MAX_CHUNKS 4 // head_dim <= 128: each lane owns dims lane, lane + 32, ...

template <int DT>
__device__ __forceinline__ void fa1_fwd(const FaParams& p) {
    extern __shared__ float4 f1_smem4[];
    float* smem = reinterpret_cast<float*>(f1_smem4);
    const int d = p.head_dim;
    const int nwarps = blockDim.x >> 5;
    const int ks_stride = d + 1;  // odd stride for even d: lane j reading K row j is conflict-free
    float* Ks = smem;                       // [F1_BK][d + 1]
    float* Vs = Ks + F1_BK * ks_stride;     // [F1_BK][d]
    float* Qs = Vs + F1_BK * d;             // [nwarps][d] one query row per warp
    float* Ps = Qs + nwarps * d;            // [nwarps][32] probabilities of the current row
    const unsigned int need = (unsigned int)(F1_BK * ks_stride + F1_BK * d + nwarps * d + nwarps * 32) * 4u;
    if (fa_dynamic_smem_bytes() < need) __trap();  // manifest's shared_mem too small

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x, b = blockIdx.y;
    const int kvh = h / (p.heads / p.kv_heads);
    const int nq = p.seqlen_q, nk = p.seqlen_k;
    const long long rowbase = ((long long)b * p.heads + h) * nq;
    float* acc_g = (float*)p.workspace[0] + rowbase * d;
    float* m_g = (float*)p.workspace[1] + rowbase;
    float* l_g = (float*)p.workspace[2] + rowbase;
    const unsigned short* Q = (const unsigned short*)p.q + b * p.q_batch_stride + h * p.q_head_stride;
    const unsigned short* K = (const unsigned short*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
    const unsigned short* V = (const unsigned short*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
    const bool causal = (p.mask_kind & FA_MASK_CAUSAL) != 0;

    // Algorithm 1, line 2: O = 0, l = 0, m = -inf in HBM.
    for (long long t = tid; t < (long long)nq * d; t += blockDim.x) acc_g[t] = 0.f;
    for (int t = tid; t < nq; t += blockDim.x) {
        m_g[t] = FA_NEG_INF;
        l_g[t] = 0.f;
    }
    // Keys any row of this batch entry can see: the last row sees the most under causality.
    const int kend = fa_key_end(p, b, nq - 1);

    for (int k0 = 0; k0 < kend; k0 += F1_BK) {  // OUTER: K/V blocks
        __syncthreads();  // previous block's rows are done with Ks/Vs (and the init is visible)
        for (int t = tid; t < F1_BK * d; t += blockDim.x) {
            const int r = t / d, c = t - r * d;
            const int j = k0 + r;
            const bool in = j < nk;
            Ks[r * ks_stride + c] = in ? FaElem<DT>::to_float(K[(long long)j * p.k_row_stride + c]) : 0.f;
            Vs[r * d + c] = in ? FaElem<DT>::to_float(V[(long long)j * p.v_row_stride + c]) : 0.f;
        }
        __syncthreads();
        // Rows before i_first see no key of this block under causality: skip them.
        int i_first = causal ? k0 - p.causal_offset : 0;
        i_first = i_first < 0 ? 0 : (i_first / nwarps) * nwarps;
        for (int i = i_first + warp; i < nq; i += nwarps) {  // INNER: query rows
            const int rend = fa_key_end(p, b, i);
            const unsigned short* qrow = Q + (long long)i * p.q_row_stride;
            float* qs = Qs + warp * d;
            for (int c = lane; c < d; c += 32) qs[c] = FaElem<DT>::to_float(qrow[c]) * p.scale_log2;
            __syncwarp();
            const int j = k0 + lane;
            float s = FA_NEG_INF;
            if (j < rend && fa_bool_mask_ok(p, b, i, j)) {
                const float* kr = Ks + lane * ks_stride;
                float dot = 0.f;
                for (int c = 0; c < d; ++c) dot += qs[c] * kr[c];
                s = dot;
            }
            const float mt = fa_warp_max(s);
            if (mt != FA_NEG_INF) {  // warp-uniform; else this block leaves the row unchanged
                // Re-read the row's running state from HBM (FA1's extra traffic).
                const float m_old = m_g[i];
                const float l_old = l_g[i];
                const float m_new = fmaxf(m_old, mt);         // finite
                const float alpha = exp2f(m_old - m_new);     // 0 when m_old = -inf
                const float pj = exp2f(s - m_new);            // 0 for invisible keys
                const float l_new = l_old * alpha + fa_warp_sum(pj);
                Ps[warp * 32 + lane] = pj;
                __syncwarp();
#pragma unroll
                for (int cc = 0; cc < F1_MAX_CHUNKS; ++cc) {
                    const int c = cc * 32 + lane;
                    if (c < d) {
                        float o = acc_g[(long long)i * d + c] * alpha;
                        for (int jj = 0; jj < F1_BK; ++jj) o += Ps[warp * 32 + jj] * Vs[jj * d + c];
                        acc_g[(long long)i * d + c] = o;
                    }
                }
                if (lane == 0) {
                    m_g[i] = m_new;
                    l_g[i] = l_new;
                }
            }
            __syncwarp();  // qs / Ps are reused by this warp's next row
        }
    }
}

// O = acc / l, LSE = (m + log2 l) ln 2; a row that saw no key gets O = 0, LSE = -inf.
template <int DT>
__device__ __forceinline__ void fa1_finalize(const FaParams& p) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i = blockIdx.x * (blockDim.x >> 5) + warp;
    const int h = blockIdx.y, b = blockIdx.z;
    if (i >= p.seqlen_q) return;
    const int d = p.head_dim;
    const long long row = ((long long)b * p.heads + h) * p.seqlen_q + i;
    const float* acc = (const float*)p.workspace[0] + row * d;
    const float m = ((const float*)p.workspace[1])[row];
    const float l = ((const float*)p.workspace[2])[row];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    unsigned short* O = (unsigned short*)p.o + b * p.o_batch_stride + h * p.o_head_stride +
                        (long long)i * p.o_row_stride;
    for (int c = lane; c < d; c += 32) O[c] = FaElem<DT>::from_float(acc[c] * inv);
    if (lane == 0 && p.lse != nullptr) p.lse[row] = l > 0.f ? (m + log2f(l)) * FA_LN2 : FA_NEG_INF;
}

extern "C" __global__ void __launch_bounds__(256) fa1_fwd_fp16(FaParams p) { fa1_fwd<FA_DTYPE_FP16>(p); }
extern "C" __global__ void __launch_bounds__(256) fa1_fwd_bf16(FaParams p) { fa1_fwd<FA_DTYPE_BF16>(p); }
extern "C" __global__ void __launch_bounds__(256) fa1_finalize_fp16(FaParams p) { fa1_finalize<FA_DTYPE_FP16>(p); }
extern "C" __global__ void __launch_bounds__(256) fa1_finalize_bf16(FaParams p) { fa1_finalize<FA_DTYPE_BF16>(p); }
