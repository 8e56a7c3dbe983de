// template: the smallest correct variant. Copy this folder to start a new one.
//
// One warp computes one query row: the 32 lanes split the head dim (lane c holds
// dimensions c, c + 32, ...), walk the visible keys one by one and keep the online
// softmax state (running max m, running sum l, accumulator acc) in registers.
// It is slow (every key is a warp-wide reduction), but every line is easy to check.
#include "fa_harness.h"

#define TPL_MAX_CHUNKS 8  // head_dim <= 32 * 8 = 256 (the manifest says max_head_dim = 256)

template <int DT>  // DT: FA_DTYPE_FP16 or FA_DTYPE_BF16, fixed per entry point
__device__ __forceinline__ void template_fwd(const FaParams& p) {
    const int lane = threadIdx.x & 31;
    // Rows per block = warps per block; the manifest's grid divides seqlen_q by the same.
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (row >= p.seqlen_q) return;  // `row` is the same for the whole warp: no divergence
    const int kvh = h / (p.heads / p.kv_heads);  // GQA: query head h reads kv head h / group
    const int d = p.head_dim;

    const unsigned short* q = (const unsigned short*)p.q + b * p.q_batch_stride +
                              h * p.q_head_stride + (long long)row * p.q_row_stride;
    const unsigned short* kb = (const unsigned short*)p.k + b * p.k_batch_stride +
                               kvh * p.k_head_stride;
    const unsigned short* vb = (const unsigned short*)p.v + b * p.v_batch_stride +
                               kvh * p.v_head_stride;

    // q pre-multiplied by scale * log2(e): scores come out in the log2 domain, so the
    // softmax uses exp2 (one instruction) and LSE is converted back with ln(2) at the end.
    float qf[TPL_MAX_CHUNKS], acc[TPL_MAX_CHUNKS];
#pragma unroll
    for (int c = 0; c < TPL_MAX_CHUNKS; ++c) {
        const int dim = c * 32 + lane;
        qf[c] = dim < d ? FaElem<DT>::to_float(q[dim]) * p.scale_log2 : 0.f;
        acc[c] = 0.f;
    }
    float m = FA_NEG_INF;  // running max of the visible scores (log2 domain)
    float l = 0.f;         // running sum of exp2(score - m)

    // Keys past `end` are invisible (sequence end, key padding, causal limit).
    const int end = fa_key_end(p, b, row);
    for (int j = 0; j < end; ++j) {
        if (!fa_bool_mask_ok(p, b, row, j)) continue;  // same answer on every lane
        const unsigned short* kj = kb + (long long)j * p.k_row_stride;
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < TPL_MAX_CHUNKS; ++c) {
            const int dim = c * 32 + lane;
            if (dim < d) s += qf[c] * FaElem<DT>::to_float(kj[dim]);
        }
        s = fa_warp_sum(s);  // every lane now holds the full dot product
        // Only visible keys reach here, so s and m_new are finite: the first key gives
        // alpha = exp2(-inf) = 0, never exp2(-inf - -inf) = NaN.
        const float m_new = fmaxf(m, s);
        const float alpha = exp2f(m - m_new);
        const float pj = exp2f(s - m_new);
        l = l * alpha + pj;
        const unsigned short* vj = vb + (long long)j * p.v_row_stride;
#pragma unroll
        for (int c = 0; c < TPL_MAX_CHUNKS; ++c) {
            const int dim = c * 32 + lane;
            if (dim < d) acc[c] = acc[c] * alpha + pj * FaElem<DT>::to_float(vj[dim]);
        }
        m = m_new;
    }

    // A row that saw no key has l == 0: O = 0 and LSE = -inf (the project's convention).
    const float inv = l > 0.f ? 1.f / l : 0.f;
    unsigned short* o = (unsigned short*)p.o + b * p.o_batch_stride + h * p.o_head_stride +
                        (long long)row * p.o_row_stride;
#pragma unroll
    for (int c = 0; c < TPL_MAX_CHUNKS; ++c) {
        const int dim = c * 32 + lane;
        if (dim < d) o[dim] = FaElem<DT>::from_float(acc[c] * inv);
    }
    if (lane == 0 && p.lse != nullptr) {
        p.lse[((long long)b * p.heads + h) * p.seqlen_q + row] =
            l > 0.f ? (m + log2f(l)) * FA_LN2 : FA_NEG_INF;
    }
}

// Entry points: one per dtype, named as the manifest's entry template expands them.
extern "C" __global__ void __launch_bounds__(128) template_fwd_fp16(FaParams p) {
    template_fwd<FA_DTYPE_FP16>(p);
}
extern "C" __global__ void __launch_bounds__(128) template_fwd_bf16(FaParams p) {
    template_fwd<FA_DTYPE_BF16>(p);
}
