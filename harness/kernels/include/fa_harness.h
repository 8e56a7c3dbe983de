// fa_harness.h: the one parameter struct every kernel variant receives.
//
// Every entry point of every variant has the signature
//     extern "C" __global__ void ENTRY(FaParams p)
// The harness fills the struct on the host (harness/params.py mirrors this layout field by
// field; a test holds the two together) and passes it by value. Variants include only this
// header: it needs no system header, so it compiles under NVRTC and nvcc alike.
//
// Layout: Q (B, H, Nq, d), K and V (B, Hkv, Nk, d), O like Q, LSE (B, H, Nq) float32.
// Strides are in elements. Head h of Q reads K/V head h / (H / Hkv) (GQA/MQA).
#pragma once

#define FA_MASK_NONE 0
#define FA_MASK_CAUSAL 1       // query i sees key j iff j <= i + causal_offset
#define FA_MASK_KEY_PADDING 2  // batch b sees keys j < seqlens_k[b]
#define FA_MASK_BOOL 4         // mask[b * mask_batch_stride + i * mask_row_stride + j] != 0
#define FA_MASK_TOP_LEFT 8     // causal mask and window aligned top-left (offset 0)
#define FA_MASK_WINDOW 16      // sliding window: window_left / window_right

#define FA_DTYPE_FP16 0
#define FA_DTYPE_BF16 1

#define FA_FP8_NONE 0
#define FA_FP8_QKV 1  // Q, K and V float8 e4m3 (FaParams' doc)
#define FA_FP8_KV 2   // an e4m3 KV cache: K and V e4m3, Q in `dtype`

// Serving layouts (harness/core/serving.py says it in full). Varlen: Q, K, V and O are
// (1, H|Hkv, T, d), sequence b's rows start at cu_seqlens_q[b] (keys at cu_seqlens_k[b]),
// seqlens_q[b] and seqlens_k[b] of them; rows between sequences are padding that must not
// be written. Paged: Q and O dense; K and V are pools (pages, Hkv, page_size, d) with
// k_batch_stride the page stride; key j of sequence b is at page
// block_table[b * block_table_stride + j / page_size], slot j % page_size, j < seqlens_k[b].
// In both, each sequence is its own problem: the causal and window offset is
// seqlens_k[b] - seqlens_q[b], or 0 under FA_MASK_TOP_LEFT (fa_seq_offset).
#define FA_LAYOUT_DENSE 0
#define FA_LAYOUT_VARLEN 1
#define FA_LAYOUT_PAGED 2

struct FaParams {
    // 8-byte fields first so the host mirror needs no padding rules.
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;                    // null when the variant does not write LSE
    const unsigned char* mask;     // boolean mask (FA_MASK_BOOL), else null
    const int* seqlens_k;          // valid keys per batch (FA_MASK_KEY_PADDING), else null
    void* workspace[4];            // harness-allocated buffers declared in the manifest
    long long q_batch_stride, q_head_stride, q_row_stride;
    long long k_batch_stride, k_head_stride, k_row_stride;
    long long v_batch_stride, v_head_stride, v_row_stride;
    long long o_batch_stride, o_head_stride, o_row_stride;
    long long mask_batch_stride, mask_row_stride;  // 0 broadcasts
    // The backward's (null in a forward launch): dO is read, dQ, dK, dV written; o and
    // lse then hold the forward's O and LSE, which the backward only reads. What a
    // backward launch receives (harness/core/check_grad.py, harness/candidates/
    // cuda_candidate.py):
    // - o and lse are the harness's, never the variant's own forward output: the float64
    //   oracle's O rounded to the case dtype and its LSE in float32 (the correctness
    //   check, the submissions' timed calls, compute-sanitizer), or the same-precision
    //   naive implementation's (the perf run's timed calls). lse is (B, H, Nq) contiguous
    //   and never null in a backward launch, even for a variant whose forward writes none.
    // - lse is in natural log, LSE_i = ln sum_j exp(scale * q_i . k_j), as the forward
    //   writes it: scale_log2 is only for an exp2-based softmax, so a backward using exp2
    //   computes P = exp2(s * scale_log2 - lse * log2(e)). A row that sees no key has
    //   lse = -inf (+inf when the manifest declares masked_lse = "+inf"); its dQ must be
    //   exactly 0.
    // - dq, dk and dv are poisoned (NaN) before every call: every element must be written
    //   (a key no query sees gets dK = dV = 0); under GQA each K/V head's dK and dV are
    //   summed over its group.
    // - workspace[] holds the [[backward.workspace]] buffers (not the forward's), zeroed
    //   once when the harness first runs a case (again for a new case or stream), not
    //   before each call: the harness calls a backward at least twice per case and judges
    //   every call, so what a launch accumulates there (a dQ accumulator) it zeroes itself
    //   on every call, as fa_bwd_pre does.
    const void* dout;
    void* dq;
    void* dk;
    void* dv;
    long long do_batch_stride, do_head_stride, do_row_stride;
    long long dq_batch_stride, dq_head_stride, dq_row_stride;
    long long dk_batch_stride, dk_head_stride, dk_row_stride;
    long long dv_batch_stride, dv_head_stride, dv_row_stride;
    // 4-byte fields.
    int batch, heads, kv_heads;
    int seqlen_q, seqlen_k, head_dim;
    int mask_kind;       // OR of FA_MASK_* bits
    int causal_offset;   // Nk - Nq for bottom-right alignment, 0 for top-left
    int dtype;           // FA_DTYPE_*
    int num_splits;      // split-KV: resolved split count (>= 1)
    float scale;         // softmax scale, 1/sqrt(d) by default
    float scale_log2;    // scale * log2(e), for exp2-based softmax
    // Serving layouts (FA_LAYOUT_*) and the sliding window.
    const int* cu_seqlens_q;      // varlen: B + 1 slot starts of the packed rows
    const int* cu_seqlens_k;
    const int* seqlens_q;         // varlen and paged: query rows per sequence
    const int* block_table;       // paged: (B, block_table_stride) page indices
    long long block_table_stride;
    int layout;                   // FA_LAYOUT_*
    int page_size;                // paged: keys per page
    // Row i sees keys i + o - window_left <= j <= i + o + window_right (-1: unbounded),
    // o the alignment offset (causal_offset for dense cases, bottom-right unless the
    // causal mask is top-left).
    int window_left, window_right;
    // TMA descriptors (CUtensorMap, 128 bytes each, 64-byte aligned, in global memory) of
    // the tensors the manifest's [[tensor_map]] tables name, in their order; null when it
    // names none. Pass `(const char*)p.tensor_maps + 128 * i` to cp.async.bulk.tensor.
    const void* tensor_maps;
    // Score modifiers and d_v (docs/score-mods.md; harness/core/reference.py says the
    // exact semantics), filled on every launch and read only by a variant declaring them
    // in [supports]. For query row i of head h, key j, s = scale * q_i . k_j, then:
    // softcap c > 0: s = c * tanh(s / c); ALiBi: s += -alibi_slopes[h] * |i + o - j| (o
    // the alignment offset, as the window's); the mask; a sink z = sinks[h] joins the
    // softmax's denominator only (m = max(max_j s_j, z), LSE = log(e^z + sum_j e^s_j); a
    // row seeing no key has O = 0 and LSE = z). Null / 0 when the case has none.
    const float* alibi_slopes;     // (heads,) float32
    const float* sinks;            // (heads,) float32, natural-log units of s
    float softcap;                 // 0: none
    int head_dim_v;                // V's and O's head dim (= head_dim unless the case sets it)
    // FP8 inputs (docs/fp8.md), read only by a variant declaring fp8 / fp8_kv. `fp8`:
    // FA_FP8_NONE, FA_FP8_QKV (Q, K and V e4m3) or FA_FP8_KV (K and V e4m3, Q in `dtype`);
    // an e4m3 tensor's pointer is to its bytes (strides in elements, so in bytes). Element
    // (b, h, n, i) of an e4m3 tensor x means fa_e4m3_to_float(x[...]) * x_descale[b *
    // xd_batch_stride + h * xd_head_stride + n * xd_row_stride]: b the batch entry (a page
    // of a paged pool, as k_batch_stride), h the head, n the row (a page's slot); a stride
    // is 0 where one descale covers that dim. V's descales have K's strides. Null / 0 when
    // the tensor is not e4m3.
    const float* q_descale;
    const float* k_descale;
    const float* v_descale;
    long long qd_batch_stride, qd_head_stride, qd_row_stride;
    long long kd_batch_stride, kd_head_stride, kd_row_stride;
    int fp8;
};

// True when (row i, key j) of batch b is visible. Kernels may inline their own faster
// tests, but this is the definition every mask kind follows.
__device__ __forceinline__ bool fa_visible(const FaParams& p, int b, int i, int j) {
    if (j >= p.seqlen_k) return false;
    if ((p.mask_kind & FA_MASK_CAUSAL) && j > i + p.causal_offset) return false;
    if ((p.mask_kind & FA_MASK_KEY_PADDING) && j >= p.seqlens_k[b]) return false;
    if ((p.mask_kind & FA_MASK_WINDOW) && p.window_right >= 0 &&
        j > i + p.causal_offset + p.window_right) return false;
    if ((p.mask_kind & FA_MASK_WINDOW) && p.window_left >= 0 &&
        j < i + p.causal_offset - p.window_left) return false;
    if ((p.mask_kind & FA_MASK_BOOL) &&
        !p.mask[b * p.mask_batch_stride + (long long)i * p.mask_row_stride + j]) return false;
    return true;
}

// Exclusive upper bound of the keys row i of batch b can see (before a bool mask).
__device__ __forceinline__ int fa_key_end(const FaParams& p, int b, int i) {
    int end = p.seqlen_k;
    if (p.mask_kind & FA_MASK_KEY_PADDING) end = min(end, p.seqlens_k[b]);
    if (p.mask_kind & FA_MASK_CAUSAL) end = min(end, i + p.causal_offset + 1);
    if ((p.mask_kind & FA_MASK_WINDOW) && p.window_right >= 0)
        end = min(end, i + p.causal_offset + p.window_right + 1);
    return end < 0 ? 0 : end;
}

// First key row i sees under the window (0 without one).
__device__ __forceinline__ int fa_key_begin(const FaParams& p, int i) {
    if (!(p.mask_kind & FA_MASK_WINDOW) || p.window_left < 0) return 0;
    const int lo = i + p.causal_offset - p.window_left;
    return lo < 0 ? 0 : lo;
}

// The alignment offset of sequence b of a varlen or paged case.
__device__ __forceinline__ int fa_seq_offset(const FaParams& p, int q_len, int k_len) {
    return (p.mask_kind & FA_MASK_TOP_LEFT) ? 0 : k_len - q_len;
}

// Steps 2 and 3 of the score modifiers (FaParams' doc) on a scaled score s of query row
// i, key j, head h of a dense case: the cap, then the ALiBi bias (o the alignment offset:
// 0 under a top-left causal mask, else Nk - Nq). Leaves s as it is when the case has none.
__device__ __forceinline__ float fa_score_mods(const FaParams& p, float s, int h, int i, int j) {
    if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
    if (p.alibi_slopes != nullptr)
        s -= p.alibi_slopes[h] * fabsf((float)(i + fa_seq_offset(p, p.seqlen_q, p.seqlen_k) - j));
    return s;
}

// Compile-time check the harness appends after a variant's source: each declared entry
// must be a kernel taking exactly one FaParams by value.
template <typename A, typename B> struct fa_same_type { static const bool value = false; };
template <typename A> struct fa_same_type<A, A> { static const bool value = true; };
#define FA_CHECK_ENTRY(name)                                                        \
    static_assert(fa_same_type<decltype(&name), void (*)(FaParams)>::value,         \
                  "entry point '" #name "' must be: extern \"C\" __global__ void " \
                  #name "(FaParams p)")

// ---------------------------------------------------------------------------------------
// Helpers for the project's kernels. No system header is needed: conversions use PTX
// directly, so the same text compiles under NVRTC and nvcc. fp16/bf16 elements are
// handled as raw 16-bit patterns (unsigned short).
// ---------------------------------------------------------------------------------------
#define FA_NEG_INF (__uint_as_float(0xff800000u))
#define FA_LN2 0.69314718055994531f

__device__ __forceinline__ float fa_half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short fa_float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float fa_bf16_to_float(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short fa_float_to_bf16(float f) {
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));  // sm_80+
    return b;
}

// Element access by dtype code (FA_DTYPE_FP16 / FA_DTYPE_BF16) as a template argument.
// float8 e4m3 (the OCP "fn" format: bias 7, no infinities, 0x7f / 0xff NaN) to float,
// exactly, by moving the bits (any architecture: no cvt from e4m3 before sm_89).
__device__ __forceinline__ float fa_e4m3_to_float(unsigned char x) {
    const unsigned sign = (x & 0x80u) << 24, e = (x >> 3) & 0xfu, m = x & 0x7u;
    if ((x & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u);
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));  // m 2^-9
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

template <int DT> struct FaElem;
template <> struct FaElem<FA_DTYPE_FP16> {
    static __device__ __forceinline__ float to_float(unsigned short x) { return fa_half_to_float(x); }
    static __device__ __forceinline__ unsigned short from_float(float f) { return fa_float_to_half(f); }
};
template <> struct FaElem<FA_DTYPE_BF16> {
    static __device__ __forceinline__ float to_float(unsigned short x) { return fa_bf16_to_float(x); }
    static __device__ __forceinline__ unsigned short from_float(float f) { return fa_float_to_bf16(f); }
};

// Unpack one 16-byte load (8 elements, lowest address first) into floats.
template <int DT>
__device__ __forceinline__ void fa_unpack8(const uint4& u, float* f) {
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = FaElem<DT>::to_float((unsigned short)(w[i] & 0xffffu));
        f[2 * i + 1] = FaElem<DT>::to_float((unsigned short)(w[i] >> 16));
    }
}

__device__ __forceinline__ float fa_warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float fa_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// The first and last launches of an FA2-style backward (outer K/V loop, dQ accumulated in
// fp32 by atomics or bulk reductions), one warp per query row, 4 rows per 128-thread block:
//   fa_bwd_pre:  delta[row] = rowsum(dO * O) (the D term of dS), dq_acc's row zeroed;
//   fa_bwd_post: dQ = scale * dq_acc, in the input dtype.
// delta is (B, H, Nq) float32; dq_acc holds element (row, c) at index(row, c), row counting
// (b * H + h) * Nq + i: FaRowMajor by default, a kernel's own order otherwise.
struct FaRowMajor {
    template <int D> __device__ __forceinline__ long long at(long long row, int c) const {
        return row * D + c;
    }
};
__device__ __forceinline__ bool fa_bwd_row(const FaParams& p, long long& row, int& b, int& h,
                                           int& i) {
    row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (row >= (long long)p.batch * p.heads * p.seqlen_q) return false;
    i = (int)(row % p.seqlen_q);
    h = (int)((row / p.seqlen_q) % p.heads);
    b = (int)(row / ((long long)p.seqlen_q * p.heads));
    return true;
}
template <int D, int DT, class Index = FaRowMajor>
__device__ __forceinline__ void fa_bwd_pre(const FaParams& p, float* delta, float* dq_acc,
                                           Index index = Index()) {
    long long row;
    int b, h, i;
    if (!fa_bwd_row(p, row, b, h, i)) return;
    const int lane = threadIdx.x & 31;
    const unsigned short* o = (const unsigned short*)p.o + b * p.o_batch_stride +
                              h * p.o_head_stride + (long long)i * p.o_row_stride;
    const unsigned short* dO = (const unsigned short*)p.dout + b * p.do_batch_stride +
                               h * p.do_head_stride + (long long)i * p.do_row_stride;
    float acc = 0.f;
#pragma unroll
    for (int c = lane; c < D; c += 32) {
        acc += FaElem<DT>::to_float(o[c]) * FaElem<DT>::to_float(dO[c]);
        dq_acc[index.template at<D>(row, c)] = 0.f;
    }
    acc = fa_warp_sum(acc);
    if (lane == 0) delta[row] = acc;
}
template <int D, int DT, class Index = FaRowMajor>
__device__ __forceinline__ void fa_bwd_post(const FaParams& p, const float* dq_acc,
                                            Index index = Index()) {
    long long row;
    int b, h, i;
    if (!fa_bwd_row(p, row, b, h, i)) return;
    const int lane = threadIdx.x & 31;
    unsigned short* dq = (unsigned short*)p.dq + b * p.dq_batch_stride + h * p.dq_head_stride +
                         (long long)i * p.dq_row_stride;
#pragma unroll
    for (int c = lane; c < D; c += 32)
        dq[c] = FaElem<DT>::from_float(dq_acc[index.template at<D>(row, c)] * p.scale);
}

// Row i of batch b, key j: bool-mask test only (fa_key_end covers length and causality).
__device__ __forceinline__ bool fa_bool_mask_ok(const FaParams& p, int b, int i, int j) {
    return !(p.mask_kind & FA_MASK_BOOL) ||
           p.mask[b * p.mask_batch_stride + (long long)i * p.mask_row_stride + j] != 0;
}

// Dynamic shared memory the launch provided (bytes). Kernels whose layout is fixed at
// compile time compare it with what they need and trap: a manifest asking for too little
// becomes a reported crash instead of silent corruption.
__device__ __forceinline__ unsigned int fa_dynamic_smem_bytes() {
    unsigned int n;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}
