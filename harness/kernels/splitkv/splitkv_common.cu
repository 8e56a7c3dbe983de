// splitkv_common.cu: what the split-KV kernels (splitkv.cu) share: tile constants, the
// PTX wrappers (cp.async, ldmatrix, mma.sync m16n8k16), the swizzled tile layout, and the
// geometry of a sequence and a query row in every layout (dense, varlen, paged).
#include "fa_harness.h"

#ifndef SK_STAGES
#define SK_STAGES 3  // K/V slices in flight per warp (the manifest's `stages` tile)
#endif
#ifndef SK_STAGES8
#define SK_STAGES8 SK_STAGES  // the same for an e4m3 cache, whose slices are half the bytes
#endif
#ifndef SK_FUSED_COMBINE
// 1: the last CTA of each row chunk to finish combines the splits (a ticket counter per
// row chunk in workspace[2], zero when allocated and reset by that CTA), no second kernel.
#define SK_FUSED_COMBINE 0
#endif
#ifndef SK_MIN_BLOCKS
#define SK_MIN_BLOCKS 2  // resident CTAs per SM the registers are capped for
#endif

namespace sk {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int ROWS = 16;          // query rows per CTA: the mma M
constexpr int WK = 16;            // keys per warp per stage: one mma k-step of P V
constexpr int CHUNK = kWarps * WK;  // keys per CTA chunk (the manifest's block_k)
constexpr int NST = SK_STAGES;
constexpr int NST8 = SK_STAGES8;
static_assert(NST >= 2 && NST <= 6, "SK_STAGES out of range");
static_assert(NST8 >= 2 && NST8 <= 8, "SK_STAGES8 out of range");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(a) : "l"(p));
    return a;
}
// 16-byte async copy global -> shared; src_bytes = 0 zero-fills (keys outside the piece).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
}
// 4-byte async copy (the descales of an e4m3 cache, one per key); src_bytes = 0 zero-fills.
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void lds_v2(unsigned addr, unsigned& a, unsigned& b) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(a), "=r"(b) : "r"(addr));
}
__device__ __forceinline__ void lds_v2f(unsigned addr, float& a, float& b) {
    asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(a), "=f"(b) : "r"(addr));
}
// Bytes of a and b picked by the selector's nibbles (0-3: a's bytes, 4-7: b's), low first.
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned sel) {
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
// Bytes of x (the low two) spread to the low byte of each 16-bit half: (b1 << 16) | b0.
__device__ __forceinline__ unsigned spread_bytes(unsigned x) { return prmt(x, 0u, 0x4140u); }

#ifndef SK_E4M3_CVT
// 1: the hardware's e4m3 -> f16x2 cvt (sm_89+) for fp16 fragments, and from there
// cvt to bf16 for bf16 ones; 0: bit moves and one multiply (e4m3x2_bits_*), which
// compile for any architecture and keep the conversion units free.
#define SK_E4M3_CVT 1
#endif

// Two e4m3 values (the low 16 bits of x) as f16x2, the low half from the low byte,
// exactly: sign, exponent and mantissa moved into fp16's places, which reads the
// exponent with fp16's bias (15) for e4m3's (7), then times 2^8. Every e4m3 value is an
// fp16 normal and an e4m3 subnormal lands on an fp16 subnormal of the same mantissa, so
// the product is exact.
__device__ __forceinline__ unsigned e4m3x2_bits_f16x2(unsigned x) {
    const unsigned y = spread_bytes(x);
    const unsigned bits = ((y & 0x00800080u) << 8) | ((y & 0x007f007fu) << 7);
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(bits), "r"(0x5c005c00u));  // x 2^8
    return r;
}
// The same as bf16x2: bf16's bias is 127, so the factor is 2^120 (by fma with -0: exact,
// bf16 arithmetic keeps subnormals).
__device__ __forceinline__ unsigned e4m3x2_bits_bf16x2(unsigned x) {
    const unsigned y = spread_bytes(x);
    const unsigned bits = ((y & 0x00800080u) << 8) | ((y & 0x007f007fu) << 4);
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n"
        : "=r"(r) : "r"(bits), "r"(0x7b807b80u), "r"(0x80008000u));  // x 2^120 + (-0)
    return r;
}
__device__ __forceinline__ unsigned e4m3x2_f16x2(unsigned x) {
#if SK_E4M3_CVT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"((unsigned short)x));
    return r;
#else
    return e4m3x2_bits_f16x2(x);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1,
                                        unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1,
                                          unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

template <int DT> struct Mma;
template <> struct Mma<FA_DTYPE_FP16> {
    __device__ __forceinline__ static void mma(float* c, const unsigned* a, unsigned b0,
                                               unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // lo goes to the low 16 bits (the lower column index), hi to the high 16 bits.
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
    // Two e4m3 values (low 16 bits of x) as an operand register of this type, exactly.
    __device__ __forceinline__ static unsigned e4m3x2(unsigned x) { return e4m3x2_f16x2(x); }
};
template <> struct Mma<FA_DTYPE_BF16> {
    __device__ __forceinline__ static void mma(float* c, const unsigned* a, unsigned b0,
                                               unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
    // SK_E4M3_CVT: through f16x2 (no e4m3 -> bf16 cvt on sm_90), then cvt to bf16;
    // every e4m3 value is exact in both.
    __device__ __forceinline__ static unsigned e4m3x2(unsigned x) {
#if SK_E4M3_CVT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        unsigned r;
        asm("{ .reg .b16 l, h, bl, bh;\n"
            "  mov.b32 {l, h}, %1;\n"
            "  cvt.rn.bf16.f16 bl, l;\n"
            "  cvt.rn.bf16.f16 bh, h;\n"
            "  mov.b32 %0, {bl, bh}; }\n"
            : "=r"(r) : "r"(e4m3x2_f16x2(x)));
        return r;
#else
        return e4m3x2_bits_bf16x2(x);
#endif
    }
};

// Byte offset of 16-byte chunk `ch` of row `row` in a tile of D-element rows. XOR with
// (row & 7) spreads the 8 rows one ldmatrix reads over all 32 banks.
template <int D> __device__ __forceinline__ unsigned swz(int row, int ch) {
    return row * (D * 2) + ((ch ^ (row & 7)) << 4);
}

// The same for rows of RB bytes (an e4m3 cache's, RB = D). Rows of 64 bytes put 8 rows
// over all 32 banks by XOR with row / 2 (two rows share a 128-byte line).
template <int RB> __device__ __forceinline__ unsigned swzb(int row, int ch) {
    if constexpr (RB >= 128) return row * RB + ((ch ^ (row & 7)) << 4);
    else return row * RB + ((ch ^ ((row >> 1) & 3)) << 4);
}

// One sequence of the batch: its lengths, where its rows start, its mask offset.
struct Seq {
    int q_len, k_len, q_start, k_start, off;
};

__device__ __forceinline__ Seq sequence(const FaParams& p, int b) {
    Seq s;
    s.q_len = p.seqlen_q;
    s.k_len = p.seqlen_k;
    s.q_start = 0;
    s.k_start = 0;
    if (p.layout == FA_LAYOUT_VARLEN) {
        s.q_len = p.seqlens_q[b];
        s.k_len = p.seqlens_k[b];
        s.q_start = p.cu_seqlens_q[b];
        s.k_start = p.cu_seqlens_k[b];
    } else if (p.layout == FA_LAYOUT_PAGED) {
        if (p.seqlens_q != nullptr) s.q_len = p.seqlens_q[b];
        s.k_len = p.seqlens_k[b];
    } else if (p.mask_kind & FA_MASK_KEY_PADDING) {
        s.k_len = min(s.k_len, p.seqlens_k[b]);
    }
    s.off = p.layout == FA_LAYOUT_DENSE ? p.causal_offset : fa_seq_offset(p, s.q_len, s.k_len);
    return s;
}

// Query row r (0..ROWS) of row chunk rc: its head, query position, whether the kernel
// writes it, and the keys [lo, hi) it can see (before a boolean mask). Varlen rows past
// a sequence's length are padding or another sequence's: not ours, never written. A
// paged sequence keeps the dense query rows: rows past its length are fully masked.
struct Row {
    int h, i, lo, hi;
    bool mine;
};

__device__ __forceinline__ Row query_row(const FaParams& p, const Seq& s, int kvh, int rc,
                                         int r, int group) {
    Row w;
    const int lr = rc * ROWS + r;
    const int g = p.seqlen_q == 1 ? lr : lr / p.seqlen_q;  // decoding: no division
    w.i = lr - g * p.seqlen_q;
    w.h = kvh * group + g;
    w.mine = lr < group * p.seqlen_q && (p.layout != FA_LAYOUT_VARLEN || w.i < s.q_len);
    int lo = 0, hi = s.k_len;
    if (w.i >= s.q_len) hi = 0;
    const int d = w.i + s.off;  // the diagonal
    if (p.mask_kind & FA_MASK_CAUSAL) hi = min(hi, d + 1);
    if (p.mask_kind & FA_MASK_WINDOW) {
        if (p.window_right >= 0) hi = min(hi, d + p.window_right + 1);
        if (p.window_left >= 0) lo = max(lo, d - p.window_left);
    }
    if (!w.mine || hi <= lo) lo = hi = 0;
    w.lo = lo;
    w.hi = hi;
    return w;
}

// Element offset of query row (h, i) of sequence b (its output row has the same place).
__device__ __forceinline__ long long q_offset(const FaParams& p, const Seq& s, int b, int h,
                                              int i, long long bs, long long hs, long long rs) {
    if (p.layout == FA_LAYOUT_VARLEN) return h * hs + (long long)(s.q_start + i) * rs;
    return b * bs + h * hs + (long long)i * rs;
}

// Index of LSE row (h, i) of sequence b in the harness's LSE ((B, H, Nq), varlen (1, H, T)).
__device__ __forceinline__ long long lse_index(const FaParams& p, const Seq& s, int b, int h,
                                               int i) {
    if (p.layout == FA_LAYOUT_VARLEN)
        return (long long)h * p.cu_seqlens_q[p.batch] + s.q_start + i;
    return ((long long)b * p.heads + h) * p.seqlen_q + i;
}

// N consecutive floats through L2 (the partials were written by another kernel).
template <int N> __device__ __forceinline__ void load_cg(const float* src, float* v);
template <> __device__ __forceinline__ void load_cg<4>(const float* src, float* v) {
    const float4 x = __ldcg(reinterpret_cast<const float4*>(src));
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
}
template <> __device__ __forceinline__ void load_cg<2>(const float* src, float* v) {
    const float2 x = __ldcg(reinterpret_cast<const float2*>(src));
    v[0] = x.x;
    v[1] = x.y;
}

}  // namespace sk
