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

#define FA_DTYPE_FP16 0
#define FA_DTYPE_BF16 1

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
    // 4-byte fields.
    int batch, heads, kv_heads;
    int seqlen_q, seqlen_k, head_dim;
    int mask_kind;       // OR of FA_MASK_* bits
    int causal_offset;   // Nk - Nq for bottom-right alignment, 0 for top-left
    int dtype;           // FA_DTYPE_*
    int num_splits;      // split-KV: resolved split count (>= 1)
    float scale;         // softmax scale, 1/sqrt(d) by default
    float scale_log2;    // scale * log2(e), for exp2-based softmax
};

// True when (row i, key j) of batch b is visible. Kernels may inline their own faster
// tests, but this is the definition every mask kind follows.
__device__ __forceinline__ bool fa_visible(const FaParams& p, int b, int i, int j) {
    if (j >= p.seqlen_k) return false;
    if ((p.mask_kind & FA_MASK_CAUSAL) && j > i + p.causal_offset) return false;
    if ((p.mask_kind & FA_MASK_KEY_PADDING) && j >= p.seqlens_k[b]) return false;
    if ((p.mask_kind & FA_MASK_BOOL) &&
        !p.mask[b * p.mask_batch_stride + (long long)i * p.mask_row_stride + j]) return false;
    return true;
}

// Exclusive upper bound of the keys row i of batch b can see (before a bool mask).
__device__ __forceinline__ int fa_key_end(const FaParams& p, int b, int i) {
    int end = p.seqlen_k;
    if (p.mask_kind & FA_MASK_KEY_PADDING) end = min(end, p.seqlens_k[b]);
    if (p.mask_kind & FA_MASK_CAUSAL) end = min(end, i + p.causal_offset + 1);
    return end < 0 ? 0 : end;
}

// Compile-time check the harness appends after a variant's source: each declared entry
// must be a kernel taking exactly one FaParams by value.
template <typename A, typename B> struct fa_same_type { static const bool value = false; };
template <typename A> struct fa_same_type<A, A> { static const bool value = true; };
#define FA_CHECK_ENTRY(name)                                                        \
    static_assert(fa_same_type<decltype(&name), void (*)(FaParams)>::value,         \
                  "entry point '" #name "' must be: extern \"C\" __global__ void " \
                  #name "(FaParams p)")
