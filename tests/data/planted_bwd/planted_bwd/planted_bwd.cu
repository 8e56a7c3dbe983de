// planted_bwd: a forward and backward in the project's ABI, written to be checked by
// reading, and the two bugs its flavors plant (manifest.toml):
//   PLANT_FIRST_CALL_ONLY  the pre-pass does not zero the dQ accumulator: it counts on the
//                          harness, which zeroes workspaces once per case, so every call
//                          after the first adds the previous calls' dQ to its own;
//   PLANT_FAR_WRITE        the main pass writes one element 3 MiB past the end of dK.
//
// Forward: the template's (one warp per query row, online softmax in the log2 domain),
// LSE written in natural log.
// Backward (FA2's equations; the harness gives the forward's O and natural-log LSE):
//   pre:  D_i = rowsum(dO_i * O_i), dq_acc row i zeroed (one warp per query row);
//   main: one warp per key j of a K/V head: for each query head of its group and each
//         query row i that sees j, P_ij = exp(scale q_i.k_j - LSE_i),
//         dS_ij = P_ij (dO_i.v_j - D_i); dV_j += P_ij dO_i, dK_j += scale dS_ij q_i,
//         dq_acc_i += dS_ij k_j by fp32 atomics;
//   post: dQ_i = scale dq_acc_i in the input dtype.
#include "fa_harness.h"

#define PB_MAX_CHUNKS 8  // head_dim <= 32 * 8 = 256 (max_head_dim in the manifest)

template <int DT>
__device__ __forceinline__ void pb_fwd(const FaParams& p) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const int kvh = h / (p.heads / p.kv_heads);
    const int d = p.head_dim;
    const unsigned short* q = (const unsigned short*)p.q + b * p.q_batch_stride +
                              h * p.q_head_stride + (long long)row * p.q_row_stride;
    const unsigned short* kb = (const unsigned short*)p.k + b * p.k_batch_stride +
                               kvh * p.k_head_stride;
    const unsigned short* vb = (const unsigned short*)p.v + b * p.v_batch_stride +
                               kvh * p.v_head_stride;
    float qf[PB_MAX_CHUNKS], acc[PB_MAX_CHUNKS];
#pragma unroll
    for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
        const int dim = c * 32 + lane;
        qf[c] = dim < d ? FaElem<DT>::to_float(q[dim]) * p.scale_log2 : 0.f;
        acc[c] = 0.f;
    }
    float m = FA_NEG_INF, l = 0.f;
    const int end = fa_key_end(p, b, row);
    for (int j = 0; j < end; ++j) {
        if (!fa_bool_mask_ok(p, b, row, j)) continue;  // the same on every lane
        const unsigned short* kj = kb + (long long)j * p.k_row_stride;
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
            const int dim = c * 32 + lane;
            if (dim < d) s += qf[c] * FaElem<DT>::to_float(kj[dim]);
        }
        s = fa_warp_sum(s);
        const float m_new = fmaxf(m, s);
        const float alpha = exp2f(m - m_new);
        const float pj = exp2f(s - m_new);
        l = l * alpha + pj;
        const unsigned short* vj = vb + (long long)j * p.v_row_stride;
#pragma unroll
        for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
            const int dim = c * 32 + lane;
            if (dim < d) acc[c] = acc[c] * alpha + pj * FaElem<DT>::to_float(vj[dim]);
        }
        m = m_new;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    unsigned short* o = (unsigned short*)p.o + b * p.o_batch_stride + h * p.o_head_stride +
                        (long long)row * p.o_row_stride;
#pragma unroll
    for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
        const int dim = c * 32 + lane;
        if (dim < d) o[dim] = FaElem<DT>::from_float(acc[c] * inv);
    }
    if (lane == 0 && p.lse != nullptr)
        p.lse[((long long)b * p.heads + h) * p.seqlen_q + row] =
            l > 0.f ? (m + log2f(l)) * FA_LN2 : FA_NEG_INF;
}

// The query row (b, h, i) of this warp in the pre- and post-pass; false past the end.
__device__ __forceinline__ bool pb_row(const FaParams& p, long long& row, int& b, int& h,
                                       int& i) {
    row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (long long)p.batch * p.heads * p.seqlen_q) return false;
    i = (int)(row % p.seqlen_q);
    h = (int)((row / p.seqlen_q) % p.heads);
    b = (int)(row / ((long long)p.seqlen_q * p.heads));
    return true;
}

template <int DT>
__device__ __forceinline__ void pb_pre(const FaParams& p) {
    long long row;
    int b, h, i;
    if (!pb_row(p, row, b, h, i)) return;
    const int lane = threadIdx.x & 31;
    const unsigned short* o = (const unsigned short*)p.o + b * p.o_batch_stride +
                              h * p.o_head_stride + (long long)i * p.o_row_stride;
    const unsigned short* dO = (const unsigned short*)p.dout + b * p.do_batch_stride +
                               h * p.do_head_stride + (long long)i * p.do_row_stride;
    float* dq_acc = (float*)p.workspace[1] + row * p.head_dim;
    float acc = 0.f;
    for (int c = lane; c < p.head_dim; c += 32) {
        acc += FaElem<DT>::to_float(o[c]) * FaElem<DT>::to_float(dO[c]);
#ifndef PLANT_FIRST_CALL_ONLY
        dq_acc[c] = 0.f;  // every call: the workspace holds the previous call's sums
#endif
    }
    acc = fa_warp_sum(acc);
    if (lane == 0) ((float*)p.workspace[0])[row] = acc;
}

template <int DT>
__device__ __forceinline__ void pb_main(const FaParams& p) {
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int group = p.heads / p.kv_heads;
    const int d = p.head_dim;
    const unsigned short* kj = (const unsigned short*)p.k + b * p.k_batch_stride +
                               kvh * p.k_head_stride + (long long)j * p.k_row_stride;
    const unsigned short* vj = (const unsigned short*)p.v + b * p.v_batch_stride +
                               kvh * p.v_head_stride + (long long)j * p.v_row_stride;
    const float* delta = (const float*)p.workspace[0];
    float* dq_acc = (float*)p.workspace[1];
    float kf[PB_MAX_CHUNKS], vf[PB_MAX_CHUNKS], dk[PB_MAX_CHUNKS], dv[PB_MAX_CHUNKS];
#pragma unroll
    for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
        const int dim = c * 32 + lane;
        kf[c] = dim < d ? FaElem<DT>::to_float(kj[dim]) : 0.f;
        vf[c] = dim < d ? FaElem<DT>::to_float(vj[dim]) : 0.f;
        dk[c] = dv[c] = 0.f;
    }
    for (int g = 0; g < group; ++g) {
        const int h = kvh * group + g;
        const long long row0 = ((long long)b * p.heads + h) * p.seqlen_q;
        for (int i = 0; i < p.seqlen_q; ++i) {
            if (!fa_visible(p, b, i, j)) continue;  // the same on every lane
            const unsigned short* qi = (const unsigned short*)p.q + b * p.q_batch_stride +
                                       h * p.q_head_stride + (long long)i * p.q_row_stride;
            const unsigned short* doi = (const unsigned short*)p.dout +
                                        b * p.do_batch_stride + h * p.do_head_stride +
                                        (long long)i * p.do_row_stride;
            float qf[PB_MAX_CHUNKS], dof[PB_MAX_CHUNKS], s = 0.f, dp = 0.f;
#pragma unroll
            for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
                const int dim = c * 32 + lane;
                qf[c] = dim < d ? FaElem<DT>::to_float(qi[dim]) : 0.f;
                dof[c] = dim < d ? FaElem<DT>::to_float(doi[dim]) : 0.f;
                s += qf[c] * kf[c];
                dp += dof[c] * vf[c];
            }
            s = fa_warp_sum(s) * p.scale;
            dp = fa_warp_sum(dp);
            // Row i sees key j, so its LSE is finite: natural log, as `scale` is.
            const float pij = expf(s - p.lse[row0 + i]);
            const float ds = pij * (dp - delta[row0 + i]);
#pragma unroll
            for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
                const int dim = c * 32 + lane;
                if (dim < d) {
                    dv[c] += pij * dof[c];
                    dk[c] += ds * qf[c];
                    atomicAdd(dq_acc + (row0 + i) * d + dim, ds * kf[c]);
                }
            }
        }
    }
    unsigned short* dkj = (unsigned short*)p.dk + b * p.dk_batch_stride +
                          kvh * p.dk_head_stride + (long long)j * p.dk_row_stride;
    unsigned short* dvj = (unsigned short*)p.dv + b * p.dv_batch_stride +
                          kvh * p.dv_head_stride + (long long)j * p.dv_row_stride;
#pragma unroll
    for (int c = 0; c < PB_MAX_CHUNKS; ++c) {
        const int dim = c * 32 + lane;
        if (dim < d) {
            dkj[dim] = FaElem<DT>::from_float(dk[c] * p.scale);
            dvj[dim] = FaElem<DT>::from_float(dv[c]);
        }
    }
#ifdef PLANT_FAR_WRITE
    if (b == 0 && kvh == 0 && j == 0 && lane == 0) {
        const long long end = (long long)(p.batch - 1) * p.dk_batch_stride +
                              (long long)(p.kv_heads - 1) * p.dk_head_stride +
                              (long long)(p.seqlen_k - 1) * p.dk_row_stride + d;
        ((unsigned short*)p.dk)[end + (3 << 20) / 2] = 0;  // 3 MiB past dK's last element
    }
#endif
}

template <int DT>
__device__ __forceinline__ void pb_post(const FaParams& p) {
    long long row;
    int b, h, i;
    if (!pb_row(p, row, b, h, i)) return;
    const int lane = threadIdx.x & 31;
    const float* dq_acc = (const float*)p.workspace[1] + row * p.head_dim;
    unsigned short* dq = (unsigned short*)p.dq + b * p.dq_batch_stride +
                         h * p.dq_head_stride + (long long)i * p.dq_row_stride;
    for (int c = lane; c < p.head_dim; c += 32)
        dq[c] = FaElem<DT>::from_float(dq_acc[c] * p.scale);
}

#define PB_ENTRIES(suffix, DT)                                                              \
    extern "C" __global__ void __launch_bounds__(128) planted_bwd_fwd_##suffix(FaParams p) { \
        pb_fwd<DT>(p);                                                                      \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(128) planted_bwd_pre_##suffix(FaParams p) { \
        pb_pre<DT>(p);                                                                      \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(32) planted_bwd_main_##suffix(FaParams p) { \
        pb_main<DT>(p);                                                                     \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(128) planted_bwd_post_##suffix(FaParams p) { \
        pb_post<DT>(p);                                                                     \
    }

PB_ENTRIES(fp16, FA_DTYPE_FP16)
PB_ENTRIES(bf16, FA_DTYPE_BF16)
