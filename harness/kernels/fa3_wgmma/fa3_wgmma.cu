// fa3_wgmma: a Hopper (sm_90a) forward: warp specialization, mbarrier pipeline, wgmma.
//
// Persistent CTAs (one per SM), each taking 128-row Q blocks of one head from a counter;
// a CTA is 3 warpgroups (the FA3 design, in its plainest form):
//   - warpgroup 0 is the producer: one of its threads has the Tensor Memory Accelerator
//     bring Q once, then K_j and V_j into a STAGES-deep ring of shared-memory slots
//     (cp.async.bulk.tensor through the tensor maps the harness encodes on the host for
//     the manifest's [[tensor_map]] tables), each slot guarded by "full" mbarriers (the
//     copy's bytes have landed: expect_tx / complete_tx) and "empty" ones. The warpgroup
//     gives its registers away (setmaxnreg.dec), since it computes nothing.
//   - warpgroups 1..NC (NC = 2) are consumers, 64 query rows each (setmaxnreg.inc):
//     S = Q K^T by wgmma m64n128k16 with both operands read from shared memory through matrix
//     descriptors, the online softmax on the fp32 accumulators in registers, then
//     O += P V by wgmma with P as register A-fragments (the S accumulator layout is the
//     A-fragment layout, as with mma.sync) and V read transposed (MN-major) from shared
//     memory. A consumer arrives on the slot's "empty" barrier when its PV has retired.
// Shared-memory tiles use the 128-byte swizzle the tensor cores read: a tile is split into
// 64-column halves (128 bytes per row), rows 128 bytes apart, and 16-byte chunk c of row r
// stored at chunk c ^ (r % 8); every half starts 1024-byte aligned.
// TMA writes shared memory and wgmma reads it through the same (async) proxy, so no proxy
// fence is needed between them; the mbarrier orders them. Rows past the end of Q, K or V
// arrive as zeros (the tensor map's bounds), and are masked or never written.
// Softmax: exp2 domain, the -inf guard of fa2_mma (a row that has seen no key subtracts 0),
// O / l at the end, LSE = ln(sum exp(scale * s)); a row that sees no key: O = 0, LSE = -inf.
// Score modifiers: softcap and ALiBi on each S tile before the mask, a sink in the
// epilogue's sum (then a row that sees no key has LSE = the sink).
// Masks: none, causal (both alignments through causal_offset), key padding; a causal Q
// block stops at its last visible tile, and the longest blocks are taken first.
#include "fa_harness.h"

namespace fa3wg {

// NC consumer warpgroups of 64 query rows each, and the producer's warpgroup. Each entry
// names its NC (2 in every shipped entry; FA3 runs 3 at d = 64, results/notes/2026-12-04.md,
// night): the block is 128 * (NC + 1) threads, the Q block 64 * NC rows.
template <int NC> struct Layout;
template <> struct Layout<2> {
    static constexpr int kProducerRegs = 40;   // the tile loop spills at 24
    static constexpr int kConsumerRegs = 232;  // 128 * 40 + 256 * 232 <= 65536
};
template <> struct Layout<3> {
    static constexpr int kProducerRegs = 32;
    static constexpr int kConsumerRegs = 160;  // 128 * 32 + 384 * 160 = 65536
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// tanh(x) from k2 x = 2 x log2(e), as 1 - 2 / (2^(k2 x) + 1), within 4e-7 of tanh: one ex2
// (the softmax's own exponentials share that unit, MUFU) and the reciprocal by Newton's
// iteration on the FMA pipe from a bit-trick seed (within 5%; three steps square the error
// to ~1e-9). tanh.approx would be one MUFU op too, at 2^-11: a capped logit near c off by
// up to c / 2048. The exponent is clamped below overflow (tanh(22) is 1 in float).
__device__ __forceinline__ float tanh_k2(float x, float k2) {
    const float y = exp2f(fminf(x * k2, 64.f)) + 1.f;
    float r = __int_as_float(0x7ef311c3 - __float_as_int(y));
#pragma unroll
    for (int i = 0; i < 3; ++i) r = r * fmaf(-y, r, 2.f);
    return fmaf(-2.f, r, 1.f);
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(a) : "l"(p));
    return a;
}

// ---- mbarriers ---------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// The producer's arrival: the phase also waits for `bytes` of copies to land on it.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}

// One TMA copy of a box at coordinates (column, row, head, batch) of a 4-D tensor map;
// its bytes complete_tx on `bar`.
__device__ __forceinline__ void tma_load(unsigned dst, const void* tmap, unsigned bar, int col,
                                         int row, int head, int batch) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4, %5, %6}], [%2];\n"
        :: "r"(dst), "l"(tmap), "r"(bar), "r"(col), "r"(row), "r"(head), "r"(batch)
        : "memory");
}

// ---- wgmma -------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Keeps the compiler from moving accumulator registers across an in-flight wgmma.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
__device__ __forceinline__ void reg_fence_u(unsigned& r) { asm volatile("" : "+r"(r) :: "memory"); }

// Matrix descriptor of a 128-byte-swizzled operand: start address, leading and stride byte
// offsets (16-byte units), layout type 1 (128B swizzle) in bits 62-63.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned lbo_bytes) {
    unsigned long long d = 0;
    d |= (unsigned long long)((addr & 0x3FFFF) >> 4);
    d |= (unsigned long long)(lbo_bytes >> 4) << 16;
    d |= (unsigned long long)(1024 >> 4) << 32;   // 8 rows of 128 bytes
    d |= 1ull << 62;
    return d;
}

// The descriptor of a K-major tile whose rows are ROWB bytes, as TMA wrote it: the 128-byte
// swizzle for rows of 128 bytes (sw128_desc), the 64-byte one (layout type 2; 8 rows of 64
// bytes, 512 bytes apart) for the e4m3 rows of d = 64.
template <int ROWB> __device__ __forceinline__ unsigned long long kmajor_desc(unsigned addr) {
    static_assert(ROWB == 64 || ROWB == 128, "rows of 64 or 128 bytes");
    if constexpr (ROWB == 128) return sw128_desc(addr, 16);
    unsigned long long d = 0;
    d |= (unsigned long long)((addr & 0x3FFFF) >> 4);
    d |= 1ull << 16;                               // leading offset: unused here
    d |= (unsigned long long)(512 >> 4) << 32;     // 8 rows of 64 bytes
    d |= 2ull << 62;
    return d;
}

template <bool BF16> struct Mma;

// The wrappers of one element type TY ("f16" or "bf16"), spliced into the asm strings.
// D (64 x N, fp32) = A (smem, K-major) * B (smem, K-major) [+ D when acc != 0], and
// D += A (registers) * B (smem, MN-major: imm-trans-b = 1).
#define FA3_MMA_WRAPPERS(TY)                                                                                       \
__device__ __forceinline__ static void ss_n128(float* d, unsigned long long da,                                    \
                                             unsigned long long db, int acc) {                                     \
    asm volatile(                                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                               \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                                              \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                    \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                          \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                          \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                        \
        "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                                            \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])   \
        : "l"(da), "l"(db), "r"(acc));                                                                             \
}                                                                                                                  \
__device__ __forceinline__ static void ss_n176(float* d, unsigned long long da,                                    \
                                             unsigned long long db, int acc) {                                     \
    asm volatile(                                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"                                                               \
        "wgmma.mma_async.sync.aligned.m64n176k16.f32." TY "." TY " {"                                              \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                    \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                          \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                          \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"                          \
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"                          \
        "%80, %81, %82, %83, %84, %85, %86, %87}, "                                                                \
        "%88, %89, p, 1, 1, 0, 0;\n}\n"                                                                            \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])   \
        : "l"(da), "l"(db), "r"(acc));                                                                             \
}                                                                                                                  \
__device__ __forceinline__ static void ss_n64(float* d, unsigned long long da,                                     \
                                            unsigned long long db, int acc) {                                      \
    asm volatile(                                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                               \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                                               \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                    \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                        \
        "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                                            \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])   \
        : "l"(da), "l"(db), "r"(acc));                                                                             \
}                                                                                                                  \
__device__ __forceinline__ static void ss_n112(float* d, unsigned long long da,                                    \
                                            unsigned long long db, int acc) {                                      \
    asm volatile(                                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n"                                                               \
        "wgmma.mma_async.sync.aligned.m64n112k16.f32." TY "." TY " {"                                              \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                    \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                          \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                          \
        "%48, %49, %50, %51, %52, %53, %54, %55}, "                                                                \
        "%56, %57, p, 1, 1, 0, 0;\n}\n"                                                                            \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])   \
        : "l"(da), "l"(db), "r"(acc));                                                                             \
}                                                                                                                  \
/* The same with both operands MN-major (imm-trans-a = imm-trans-b = 1): the backward's dQ. */                   \
__device__ __forceinline__ static void ss_n64_tt(float* d, unsigned long long da,                                  \
                                               unsigned long long db, int acc) {                                   \
    asm volatile(                                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                               \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                                               \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                    \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                        \
        "%32, %33, p, 1, 1, 1, 1;\n}\n"                                                                            \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])   \
        : "l"(da), "l"(db), "r"(acc));                                                                             \
}                                                                                                                  \
__device__ __forceinline__ static void rs_n64(float* d, const unsigned* a,                                         \
                                            unsigned long long db) {                                               \
    asm volatile(                                                                                                  \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                                               \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                    \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                        \
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                                                 \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])   \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                                    \
}                                                                                                                  \
__device__ __forceinline__ static void rs_n128(float* d, const unsigned* a,                                        \
                                            unsigned long long db) {                                               \
    asm volatile(                                                                                                  \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                                              \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                    \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                          \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                          \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                        \
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"                                                                 \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])   \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                                    \
}

template <> struct Mma<false> { FA3_MMA_WRAPPERS("f16") };
template <> struct Mma<true> { FA3_MMA_WRAPPERS("bf16") };
#undef FA3_MMA_WRAPPERS

template <bool BF16> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    if (BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The producer's copies of one (ROWS x D) tile of EB-byte elements: one TMA box per 128
// bytes of a row (a 64-column half of fp16 / bf16, 128 columns of e4m3), each a swizzled
// (ROWS x 128 bytes) region.
template <int D, int ROWS, int EB = 2>
__device__ __forceinline__ void load_tile(unsigned sbase, const void* tmap, unsigned bar,
                                          int row0, int head, int batch) {
    if constexpr (EB == 1) {   // rows of 64 or 128 bytes: one box
        static_assert(D == 64 || D == 128, "one box per row");
        mbar_expect_tx(bar, ROWS * D);
        tma_load(sbase, tmap, bar, 0, row0, head, batch);
        return;
    }
    mbar_expect_tx(bar, ROWS * D * 2);
    if constexpr (D <= 128) {
#pragma unroll
        for (int half = 0; half < D / 64; ++half)
            tma_load(sbase + half * ROWS * 128, tmap, bar, half * 64, row0, head, batch);
    } else {
        // Rolled: three or four copies unrolled for each of Q, K and V made the producer's
        // tile loop spill at its 40 registers (ptxas hoisted their addresses).
#pragma unroll 1
        for (int half = 0; half < D / 64; ++half)
            tma_load(sbase + half * ROWS * 128, tmap, bar, half * 64, row0, head, batch);
    }
}

// BN keys per K/V tile: 128 at d = 64, 176 at d = 128 (a longer tile amortizes each
// consumer's softmax and turn-taking over more matmul work; 2 slots of 176 x 128 still fit),
// 112 at d = 192 and 128 at d_qk = 192 / d_v = 128 (the longest multiple of 16 whose 2
// slots of K and V fit beside the Q tile in 227 KB), 64 at d = 256: 80 would fit (FA3's
// tile there), but its S and P beside O's 128 accumulators spilled at the consumers' 232
// registers (ptxas, sm_90a), as did the plain and the modifiers' entries. DQK: the head
// dim of Q and K (S = Q K^T); DV: of V and O (O += P V), 128 with DQK = 192 for an MLA
// prefill. FP8: e4m3 Q, K and V (fa3_wgmma_fp8.cu): the matmuls on 8-bit wgmma, a V^T slot
// per stage written by the producer's other warps, P to e4m3 in registers, the descales
// folded into the softmax scale (Q's and K's) and into O (V's).
// MODS: the score modifiers' code (softcap, ALiBi, sinks) is compiled in: the fwdm entries,
// which the manifest launches only for a case that has one (`score_mods`), so the plain
// entries carry none of it (compiled into them, the d = 128 entries' two bodies spilled).
template <int DQK, int DV, bool BF16, int STAGES, int BN, int NC, bool MODS, bool FP8 = false>
__device__ __forceinline__ void fwd(const FaParams& p) {
    using M = Mma<BF16>;
    static_assert(DQK % 64 == 0 && DV % 64 == 0 && BN % 16 == 0, "64-column halves, k16 steps");
    static_assert(BN == 64 || BN == 112 || BN == 128 || BN == 176, "an S wgmma of that N");
    static_assert(!FP8 || (DQK == DV && (DQK == 64 || DQK == 128) && BN == 128),
                  "FP8: d = 64 or 128, 128-key tiles");
    constexpr int BM = 64 * NC;   // query rows per CTA
    constexpr unsigned kConsumers = 128u * NC;   // consumer threads: arrivals per barrier
    constexpr unsigned EB = FP8 ? 1 : 2;   // bytes per element of Q, K, V
    constexpr unsigned Q_BYTES = BM * DQK * EB;
    constexpr unsigned K_BYTES = BN * DQK * EB;
    constexpr unsigned V_BYTES = BN * DV * EB;   // FP8: V's staging slot
    constexpr unsigned VT_BYTES = FP8 ? BN * DV : 0;   // FP8: V^T's slot
    constexpr int NT = 96;   // FP8: the transposing threads (the producer's warps 1-3)
    constexpr int KS_PV = FP8 ? BN / 32 : BN / 16;   // k-steps of P V
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // The swizzle is a function of address bits, so the tiles need 1024-byte alignment;
    // the manifest asks for 1024 bytes more than the tiles use.
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned sQ = base;
    const unsigned sK0 = sQ + Q_BYTES;
    const unsigned sV0 = sK0 + STAGES * K_BYTES;
    const unsigned sVT0 = sV0 + STAGES * V_BYTES;
    const unsigned bars = sVT0 + STAGES * VT_BYTES;
    const unsigned bar_q = bars;
    // Slot s has four barriers: K_s and V_s full (the producer's copies landed), K_s and V_s
    // empty (every consumer is done reading). K and V are released separately: K_j as
    // soon as S_j has landed, V_j once P_j V_j has, so the next K copy starts a whole
    // softmax earlier than it could if the slot were released as one.
#define FA3_KFULL(s) (bars + 8u * (1u + (unsigned)(s)))
#define FA3_VFULL(s) (bars + 8u * (1u + STAGES + (unsigned)(s)))
#define FA3_KEMPTY(s) (bars + 8u * (1u + 2u * STAGES + (unsigned)(s)))
#define FA3_VEMPTY(s) (bars + 8u * (1u + 3u * STAGES + (unsigned)(s)))

    // Persistent: a CTA per SM (the manifest's grid) takes work tiles (a 128-row Q block
    // of one head) from a counter until none is left, so the next tile's Q and first K/V
    // copies run under the current tile's last steps, and no CTA is launched per
    // tile. Tiles are ordered head by head (the CTAs at work share a head's K/V in L2), Q
    // blocks last to first under a causal mask (longest first); taking them from a counter
    // keeps the CTAs even where the blocks' lengths differ. The producer takes each tile and
    // hands it to the consumers through a 2-slot ring in shared memory (its own full/empty
    // mbarriers); Q has an "empty" barrier, released once every consumer's last S of a tile
    // has landed. sched[0] is the counter, sched[1] counts the CTAs done; the last CTA
    // puts both back to 0 for the next launch (the workspace is zeroed when allocated).
    const unsigned bar_qe = bars + 8u * (1u + 4u * STAGES);
    const unsigned bar_tf = bar_qe + 8u;    // tile slot 0 / 1 written
    const unsigned bar_te = bar_tf + 16u;   // tile slot 0 / 1 read by every consumer
    volatile int* tile_slot = (volatile int*)(smem_raw + (bar_te + 16u - smem_u32(smem_raw)));
    // FP8, past the consumers' words: V's staging slot s full (TMA) and empty (read by the
    // transposers), and a word per slot saying whether it holds a tile (1) or the end (0).
    // V_s "full" is then V^T's: written by the NT transposers.
    const unsigned fp8x = bar_te + 16u + 64u + 1024u;
#define FA3_VSFULL(s) (fp8x + 8u * (unsigned)(s))
#define FA3_VSEMPTY(s) (fp8x + 8u * (STAGES + (unsigned)(s)))
    volatile int* vjob = (volatile int*)(smem_raw + (fp8x + 16u * STAGES - smem_u32(smem_raw)));
    int* sched = (int*)p.workspace[0];

    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const bool causal = (p.mask_kind & FA_MASK_CAUSAL) != 0;
    const int nqb = (p.seqlen_q + BM - 1) / BM;
    const int n_work = nqb * p.heads * p.batch;
    const int group = p.heads / p.kv_heads;
    // Work tile w: Q block q0 of head h of batch b; its K/V tiles, n_tiles, end at kend.
    struct Work { int q0, h, b, klimit, n_tiles; };
    auto work = [&](int w) {
        Work t;
        const int hb = w / nqb;
        const int qi = w - hb * nqb;
        t.q0 = (causal ? nqb - 1 - qi : qi) * BM;
        t.h = hb % p.heads;
        t.b = hb / p.heads;
        t.klimit = p.seqlen_k;
        if ((p.mask_kind & FA_MASK_KEY_PADDING) && p.seqlens_k) t.klimit = min(t.klimit, p.seqlens_k[t.b]);
        int kend = t.klimit;
        if (causal) kend = min(kend, min(t.q0 + BM, p.seqlen_q) - 1 + p.causal_offset + 1);
        t.n_tiles = kend > 0 ? (kend + BN - 1) / BN : 0;
        return t;
    };

    if (tid == 0) {
        mbar_init(bar_q, 1);
        mbar_init(bar_qe, kConsumers);
        for (int s = 0; s < 2; ++s) {
            mbar_init(bar_tf + 8u * s, 1);
            mbar_init(bar_te + 8u * s, kConsumers);
        }
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(FA3_KFULL(s), 1);
            mbar_init(FA3_VFULL(s), FP8 ? NT : 1);
            mbar_init(FA3_KEMPTY(s), kConsumers);
            mbar_init(FA3_VEMPTY(s), kConsumers);
            if constexpr (FP8) {
                mbar_init(FA3_VSFULL(s), 1);
                mbar_init(FA3_VSEMPTY(s), NT);
            }
        }
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(Layout<NC>::kProducerRegs));
        if constexpr (FP8) {
            // Warps 1-3 transpose each V tile from its staging slot into its V^T slot, in
            // the order the copies were issued, until the copier says there is no more.
            if (tid >= 32) {
                for (unsigned i = 0;; ++i) {
                    const unsigned s = i % STAGES;
                    const unsigned ph = (i / STAGES) & 1u;
                    mbar_wait(FA3_VSFULL(s), ph);
                    if (vjob[s] == 0) break;
                    mbar_wait(FA3_VEMPTY(s), ph ^ 1u);   // the consumers' last PV on V^T_s
                    fp8_transpose_v<DV, BN, NT>(sV0 + s * V_BYTES, sVT0 + s * VT_BYTES, tid - 32);
                    // The writes are read by wgmma (the async proxy), and the staging
                    // slot is written next by TMA: order both behind these accesses.
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    mbar_arrive(FA3_VSEMPTY(s));
                    mbar_arrive(FA3_VFULL(s));
                }
                return;
            }
        }
        if (tid != 0) return;   // one thread issues every copy
        const char* maps = (const char*)p.tensor_maps;   // Q, K, V (manifest order)
        unsigned kv = 0;        // K/V tiles issued so far: the ring's slot and phase
        unsigned nq = 0;        // Q tiles issued so far
        for (unsigned t = 0;; ++t) {
            const int w = atomicAdd(sched, 1);
            const unsigned slot = t & 1u;
            mbar_wait(bar_te + 8u * slot, ((t >> 1) & 1u) ^ 1u);  // the first round passes
            const Work wk = work(w < n_work ? w : 0);
            volatile int* ts = tile_slot + 8 * slot;
            ts[0] = w < n_work ? wk.n_tiles : -1;   // -1: no tile left
            ts[1] = wk.q0;
            ts[2] = wk.h;
            ts[3] = wk.b;
            ts[4] = wk.klimit;
            mbar_arrive(bar_tf + 8u * slot);
            if (w >= n_work) break;
            if (wk.n_tiles == 0) continue;
            mbar_wait(bar_qe, (nq & 1u) ^ 1u);
            ++nq;
            load_tile<DQK, BM, EB>(sQ, maps, bar_q, wk.q0, wk.h, wk.b);
            const int hk = wk.h / group;
            for (int j = 0; j < wk.n_tiles; ++j, ++kv) {
                const unsigned s = kv % STAGES;
                const unsigned ph = (kv / STAGES) & 1u;
                mbar_wait(FA3_KEMPTY(s), ph ^ 1u);
                load_tile<DQK, BN, EB>(sK0 + s * K_BYTES, maps + 128, FA3_KFULL(s), j * BN, hk,
                                       wk.b);
                if constexpr (FP8) {
                    mbar_wait(FA3_VSEMPTY(s), ph ^ 1u);
                    vjob[s] = 1;
                    load_tile<DV, BN, EB>(sV0 + s * V_BYTES, maps + 256, FA3_VSFULL(s), j * BN,
                                          hk, wk.b);
                } else {
                    mbar_wait(FA3_VEMPTY(s), ph ^ 1u);
                    load_tile<DV, BN>(sV0 + s * V_BYTES, maps + 256, FA3_VFULL(s), j * BN, hk,
                                      wk.b);
                }
            }
        }
        if constexpr (FP8) {   // the transposers' end: a slot that holds no tile
            const unsigned s = kv % STAGES;
            mbar_wait(FA3_VSEMPTY(s), ((kv / STAGES) & 1u) ^ 1u);
            vjob[s] = 0;
            mbar_arrive(FA3_VSFULL(s));
        }
        __threadfence();   // this CTA's last take precedes its count as done
        if (atomicAdd(sched + 1, 1) == (int)gridDim.x - 1) {
            sched[0] = 0;
            sched[1] = 0;
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(Layout<NC>::kConsumerRegs));
    const int cw = wg - 1;            // consumer 0 .. NC - 1: query rows q0 + 64 cw ...
    const int wt = tid & 127;
    const int warp = wt >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int q4 = lane & 3;
    // At d >= 128, a word per consumer thread past the tile slots, written and never read
    // (see its store).
    const unsigned sink = bar_te + 16u + 64u + 4u * (tid - 128);

    // S = Q K_j, issued (not waited for).
    auto issue_s = [&](float* sacc, unsigned sK) {
        if constexpr (FP8) {   // k32 steps along the one row of Q and of K (DQK bytes)
#pragma unroll
            for (int kk = 0; kk < DQK / 32; ++kk)
                Mma8::ss8_n128(sacc, kmajor_desc<DQK>(sQ + cw * (64 * DQK) + kk * 32),
                               kmajor_desc<DQK>(sK + kk * 32), kk > 0);
        } else {
#pragma unroll
            for (int kk = 0; kk < DQK / 16; ++kk) {
                const unsigned qa = sQ + (kk >> 2) * (BM * 128) + cw * (64 * 128) + (kk & 3) * 32;
                const unsigned ka = sK + (kk >> 2) * (BN * 128) + (kk & 3) * 32;
                const unsigned long long dq = sw128_desc(qa, 16), dk = sw128_desc(ka, 16);
                if constexpr (BN == 64) M::ss_n64(sacc, dq, dk, kk > 0);
                else if constexpr (BN == 112) M::ss_n112(sacc, dq, dk, kk > 0);
                else if constexpr (BN == 128) M::ss_n128(sacc, dq, dk, kk > 0);
                else M::ss_n176(sacc, dq, dk, kk > 0);
            }
        }
        wgmma_commit();
    };
    // Ping-pong: the consumers take turns issuing their matmuls (consumer c waits on named
    // barrier c + 1 and passes the turn to c + 1 mod NC), so that one warpgroup's softmax
    // runs while another's wgmma keep the tensor cores busy. The last consumer opens each
    // tile's first turn for consumer 0; every turn taken is passed on except the last
    // consumer's last of a tile, so each tile leaves the barriers as it found them.
    // Barrier ids are immediates: a register id makes ptxas reserve all 16 of them.
    auto wait_turn = [&]() {
        if (cw == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
        else if (NC == 2 || cw == 1) asm volatile("bar.sync 2, 256;\n" ::: "memory");
        else asm volatile("bar.sync 3, 256;\n" ::: "memory");
    };
    auto pass_turn = [&]() {
        if (cw == 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
        else if (NC == 2 || cw == NC - 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
        else asm volatile("bar.arrive 3, 256;\n" ::: "memory");
    };

    unsigned kv = 0;   // K/V tiles consumed so far (the producer's count)
    unsigned nq = 0;   // Q tiles consumed so far
    float o[DV / 2];
    unsigned pf[KS_PV][4];        // P of the previous tile, A-fragments of its PV
    // The last PV of a work tile is not issued at its end: it rides with the first S of
    // the next work tile (and its O is written under that S's softmax), so the tensor
    // cores do not idle through a work tile's tail and the next one's head; at N = 2048
    // a work tile has only 12 K/V tiles, and that tail and head were a few percent of
    // it. `pend`: a work tile waits for its last PV; its tile slot, the index of its
    // last K/V tile, its row max and sum.
    bool pend = false;
    unsigned pend_slot = 0, pend_kv = 0;
    float pm[2], pl[2];
    float pend_vd = 1.f;   // FP8: the pending work tile's V descale

    // O += P V_j, issued: one wgmma per 16 keys and per 128 of O's columns (a pair of
    // V's 64-column halves, BN * 128 bytes apart: the descriptor's leading offset), then
    // one of 64 for an odd half (d_v = 64, 192). A 128-column chunk's accumulators are
    // o[64 c ...]: the 8-column groups of the whole row in order, as the epilogue reads.
    auto issue_pv = [&](unsigned sV) {
        if constexpr (FP8) {   // B = V^T_s (K-major, keys along its rows), k32 steps
            const unsigned vt = sVT0 + (sV - sV0) / V_BYTES * VT_BYTES;
#pragma unroll
            for (int kk = 0; kk < KS_PV; ++kk) {
                if constexpr (DV == 128) Mma8::rs8_n128(o, pf[kk], sw128_desc(vt + kk * 32, 16));
                else Mma8::rs8_n64(o, pf[kk], sw128_desc(vt + kk * 32, 16));
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                const unsigned va = sV + kk * (16 * 128);
#pragma unroll
                for (int c = 0; c < DV / 128; ++c)
                    M::rs_n128(o + 64 * c, pf[kk], sw128_desc(va + 2 * c * (BN * 128), BN * 128));
                if constexpr (DV % 128 != 0)
                    M::rs_n64(o + 64 * (DV / 128), pf[kk],
                              sw128_desc(va + 2 * (DV / 128) * (BN * 128), BN * 128));
            }
        }
        wgmma_commit();
    };
    // O / l and the LSE of the work tile in tile slot `eslot` (the slot is released once
    // its fields are read).
    auto epilogue = [&](unsigned eslot, float* l, const float* m, float vd) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        const volatile int* es = tile_slot + 8 * eslot;
        const int row0 = es[1] + cw * 64 + warp * 16 + g;
        const int h = es[2];
        const int b = es[3];
        mbar_arrive(bar_te + 8u * eslot);
        char* og = (char*)p.o + 2 * (b * p.o_batch_stride + h * p.o_head_stride);
        float* lseg = p.lse ? p.lse + ((long long)b * p.heads + h) * p.seqlen_q : nullptr;
        // A sink z (FaParams' doc) is one more term of the denominator, no value: the sum
        // and max taken again with it, in the exp2 domain (m is the running max there).
        const float zl = MODS && p.sinks != nullptr ? p.sinks[h] * (p.scale_log2 / p.scale)
                                                    : neg_inf();
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + r * 8;
            if (row >= p.seqlen_q) continue;
            float lt = l[r], mt = m[r], sc = 1.f;
            if (MODS && p.sinks != nullptr) {
                mt = fmaxf(m[r], zl);
                sc = l[r] > 0.f ? exp2f(m[r] - mt) : 0.f;
                lt = l[r] * sc + exp2f(zl - mt);
            }
            const float inv = lt > 0.f ? (FP8 ? sc * vd : sc) / lt : 0.f;
            unsigned* orow = (unsigned*)(og + 2 * (long long)row * p.o_row_stride);
#pragma unroll
            for (int t = 0; t < DV / 8; ++t)
                orow[t * 4 + q4] = pack2<BF16>(o[4 * t + 2 * r] * inv, o[4 * t + 2 * r + 1] * inv);
            if (lseg && q4 == 0)
                lseg[row] = lt > 0.f ? mt * FA_LN2 + logf(lt) : neg_inf();
        }
    };
    // The pending work tile's last PV alone, then its O.
    auto flush = [&]() {
        const unsigned ls = pend_kv % STAGES;
        mbar_wait(FA3_VFULL(ls), (pend_kv / STAGES) & 1u);
        wgmma_fence();
        issue_pv(sV0 + ls * V_BYTES);
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < DV / 2; ++i) reg_fence(o[i]);
        mbar_arrive(FA3_VEMPTY(ls));
        epilogue(pend_slot, pl, pm, pend_vd);
        pend = false;
    };

    for (unsigned tw = 0;; ++tw) {
        const unsigned slot = tw & 1u;
        mbar_wait(bar_tf + 8u * slot, (tw >> 1) & 1u);
        // The tile's fields stay in its slot (read where needed: registers are what the
        // accumulators need); the slot is released by the tile's epilogue.
        const volatile int* ts = tile_slot + 8 * slot;
        const int n_tiles = ts[0];
        if (n_tiles <= 0) {   // no work tile left (-1), or one that sees no key (0)
            if (pend) flush();
            if (n_tiles < 0) break;
            float l0[2] = {0.f, 0.f};
            const float m0[2] = {neg_inf(), neg_inf()};
#pragma unroll
            for (int i = 0; i < DV / 2; ++i) o[i] = 0.f;
            epilogue(slot, l0, m0, 1.f);   // O = 0, LSE = -inf
            continue;
        }

        float m_run[2] = {neg_inf(), neg_inf()};
        float l_run[2] = {0.f, 0.f};
        // The softmax scale in the accumulator's units: with FP8, S = Q K^T of the e4m3
        // values, so Q's and K's descales join it (every modifier below is written in
        // those units, through FA3_SCALE and FA3_SCALE_LOG2); V's multiplies O in the
        // epilogue. The 2-byte entries read p.scale and p.scale_log2 where they use them,
        // as before the e4m3 entries existed: the same machine code (bench/sass_same.py).
        float scl8 = p.scale, sl28 = p.scale_log2, vd = 1.f;
        if constexpr (FP8) {
            const int h = ts[2], b = ts[3], hk = h / group;
            const float dqk = p.q_descale[b * p.qd_batch_stride + h * p.qd_head_stride]
                              * p.k_descale[b * p.kd_batch_stride + hk * p.kd_head_stride];
            scl8 *= dqk;
            sl28 *= dqk;
            vd = p.v_descale[b * p.kd_batch_stride + hk * p.kd_head_stride];
        }
#define FA3_SCALE (FP8 ? scl8 : p.scale)
#define FA3_SCALE_LOG2 (FP8 ? sl28 : p.scale_log2)
        // Mask tile j, update the running max and sum, P_j = exp(...) in place of S_j (fp32);
        // alpha rescales O, which the caller applies once the previous PV has retired, and
        // then packs P_j into the A-fragments (the previous tile's are free by then).
        auto softmax = [&](float* sacc, int n0, float* alpha) {
            const int q0 = ts[1];
            const int klimit = ts[4];
            // The score modifiers (FaParams' doc) before the mask, in the accumulator's
            // units (s / scale: the exponentials multiply by scale_log2).
            if (MODS && p.softcap > 0.f) {
                const float k2 = 2.f * FA3_SCALE_LOG2 / p.softcap;
                const float cs = p.softcap / FA3_SCALE;
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) sacc[i] = cs * tanh_k2(sacc[i], k2);
            }
            if (MODS && p.alibi_slopes != nullptr) {   // -slope |i + o - j|, over scale likewise
                const float sl = p.alibi_slopes[ts[2]] / FA3_SCALE;
                const int diag = q0 + cw * 64 + warp * 16 + g
                                 + fa_seq_offset(p, p.seqlen_q, p.seqlen_k) - n0 - q4 * 2;
#pragma unroll
                for (int t = 0; t < BN / 8; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        sacc[4 * t + e] -= sl * fabsf((float)(diag + ((e >> 1) << 3)
                                                             - t * 8 - (e & 1)));
            }
            int unmasked_end = klimit;    // tiles ending at or before it need no element mask
            if (causal) unmasked_end = min(unmasked_end, q0 + cw * 64 + p.causal_offset + 1);
            if (n0 + BN > unmasked_end) {
                const int row0 = q0 + cw * 64 + warp * 16 + g;  // this thread's rows: row0, + 8
#pragma unroll
                for (int t = 0; t < BN / 8; ++t) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = row0 + ((e >> 1) << 3);
                        const int key = n0 + t * 8 + q4 * 2 + (e & 1);
                        int row_end = klimit;
                        if (causal) row_end = min(row_end, row + p.causal_offset + 1);
                        if (key >= row_end) sacc[4 * t + e] = neg_inf();
                    }
                }
            }
            // At d = 64 the row max and the row sum run in CH = 2 partial chains per row, so
            // that a chain's next step does not wait for its last (one FMNMX chain of 2 x 16
            // steps per row pair, each step a wait stall in the SASS): 1.00-1.03x (median
            // 1.018) over the 12 d = 64 shapes on an H100, where the softmax is most of a
            // consumer's work; at d = 128, 0.98-1.04x (median 0.996), so it keeps one chain
            // (results/notes/2026-12-06.md, third session).
            constexpr int CH = DQK == 64 ? 2 : 1;
            float mxc[2][CH];
#pragma unroll
            for (int c = 0; c < CH; ++c) mxc[0][c] = mxc[1][c] = neg_inf();
#pragma unroll
            for (int t = 0; t < BN / 8; ++t) {
                mxc[0][t % CH] = fmaxf(mxc[0][t % CH], fmaxf(sacc[4 * t], sacc[4 * t + 1]));
                mxc[1][t % CH] = fmaxf(mxc[1][t % CH], fmaxf(sacc[4 * t + 2], sacc[4 * t + 3]));
            }
            float mx[2] = {mxc[0][0], mxc[1][0]};
#pragma unroll
            for (int c = 1; c < CH; ++c) {
                mx[0] = fmaxf(mx[0], mxc[0][c]);
                mx[1] = fmaxf(mx[1], mxc[1][c]);
            }
            float m_use[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float m_new = fmaxf(m_run[r], mx[r] * FA3_SCALE_LOG2);
                m_use[r] = (m_new == neg_inf()) ? 0.f : m_new;   // the -inf guard
                alpha[r] = exp2f(m_run[r] - m_use[r]);
                m_run[r] = m_new;
                l_run[r] *= alpha[r];
            }
            float ls[2][CH];
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                ls[0][c] = c == 0 ? l_run[0] : 0.f;
                ls[1][c] = c == 0 ? l_run[1] : 0.f;
            }
#pragma unroll
            for (int t = 0; t < BN / 8; ++t) {
                const float p0 = exp2f(fmaf(sacc[4 * t], FA3_SCALE_LOG2, -m_use[0]));
                const float p1 = exp2f(fmaf(sacc[4 * t + 1], FA3_SCALE_LOG2, -m_use[0]));
                const float p2 = exp2f(fmaf(sacc[4 * t + 2], FA3_SCALE_LOG2, -m_use[1]));
                const float p3 = exp2f(fmaf(sacc[4 * t + 3], FA3_SCALE_LOG2, -m_use[1]));
                ls[0][t % CH] += p0 + p1;
                ls[1][t % CH] += p2 + p3;
                sacc[4 * t] = p0;
                sacc[4 * t + 1] = p1;
                sacc[4 * t + 2] = p2;
                sacc[4 * t + 3] = p3;
            }
            l_run[0] = ls[0][0];
            l_run[1] = ls[1][0];
#pragma unroll
            for (int c = 1; c < CH; ++c) {
                l_run[0] += ls[0][c];
                l_run[1] += ls[1][c];
            }
        };
        auto pack_p = [&](const float* sacc) {
            if constexpr (FP8) {   // 32 keys a step, in V^T's column order (fa3_wgmma_fp8.cu)
#pragma unroll
                for (int c = 0; c < KS_PV; ++c) {
                    const float* a = sacc + 16 * c;
                    pf[c][0] = pack4_e4m3(a[0], a[1], a[4], a[5]);      // row g
                    pf[c][1] = pack4_e4m3(a[2], a[3], a[6], a[7]);      // row g + 8
                    pf[c][2] = pack4_e4m3(a[8], a[9], a[12], a[13]);    // row g, +16
                    pf[c][3] = pack4_e4m3(a[10], a[11], a[14], a[15]);  // row g + 8, +16
                }
            } else {
#pragma unroll
                for (int t = 0; t < BN / 8; ++t) {
                    pf[t >> 1][(t & 1) * 2 + 0] = pack2<BF16>(sacc[4 * t], sacc[4 * t + 1]);
                    pf[t >> 1][(t & 1) * 2 + 1] = pack2<BF16>(sacc[4 * t + 2], sacc[4 * t + 3]);
                }
            }
        };

        if (cw == NC - 1) pass_turn();
        mbar_wait(bar_q, nq & 1u);
        float sacc[BN / 2];
        float alpha[2];
        // Tile 0: S_0, with the pending work tile's last PV when there is one (a copy of
        // the step each way: a branch between a wgmma's fence and its wait makes ptxas
        // serialize every wgmma).
        {
            const unsigned s = kv % STAGES;
            mbar_wait(FA3_KFULL(s), (kv / STAGES) & 1u);
            if (pend) {
                const unsigned ls = pend_kv % STAGES;
                mbar_wait(FA3_VFULL(ls), (pend_kv / STAGES) & 1u);
                wait_turn();
                wgmma_fence();
                issue_s(sacc, sK0 + s * K_BYTES);
                issue_pv(sV0 + ls * V_BYTES);
                if (!(cw == NC - 1 && n_tiles == 1))
                    pass_turn();
                wgmma_wait<1>();
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) reg_fence(sacc[i]);
                mbar_arrive(FA3_KEMPTY(s));
                if (n_tiles == 1) mbar_arrive(bar_qe);   // the tile's last S: Q is free
                softmax(sacc, 0, alpha);
                if constexpr (DQK >= 128)   // the sink of the loop below, for the same reason
                    asm volatile("st.shared.f32 [%0], %1;\n"
                                 :: "r"(sink), "f"(l_run[0] + l_run[1]) : "memory");
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < DV / 2; ++i) reg_fence(o[i]);
#pragma unroll
                for (int kk = 0; kk < KS_PV; ++kk)
#pragma unroll
                    for (int e = 0; e < 4; ++e) reg_fence_u(pf[kk][e]);
                mbar_arrive(FA3_VEMPTY(ls));
                epilogue(pend_slot, pl, pm, pend_vd);
                pend = false;
            } else {
                wait_turn();
                wgmma_fence();
                issue_s(sacc, sK0 + s * K_BYTES);
                if (!(cw == NC - 1 && n_tiles == 1))
                    pass_turn();
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) reg_fence(sacc[i]);
                mbar_arrive(FA3_KEMPTY(s));
                if (n_tiles == 1) mbar_arrive(bar_qe);
                softmax(sacc, 0, alpha);
            }
#pragma unroll
            for (int i = 0; i < DV / 2; ++i) o[i] = 0.f;
            pack_p(sacc);
        }

        // Tile j: S_j = Q K_j and O += P_{j-1} V_{j-1} in flight together; the softmax
        // of S_j runs while the PV still does, and O is rescaled once it has retired.
        for (int j = 1; j < n_tiles; ++j) {
            const unsigned s = (kv + j) % STAGES;
            const unsigned ps = (kv + j - 1) % STAGES;
            mbar_wait(FA3_KFULL(s), ((kv + j) / STAGES) & 1u);
            mbar_wait(FA3_VFULL(ps), ((kv + j - 1) / STAGES) & 1u);
            wait_turn();
            wgmma_fence();
            issue_s(sacc, sK0 + s * K_BYTES);
            issue_pv(sV0 + ps * V_BYTES);
            if (!(cw == NC - 1 && j == n_tiles - 1))
                pass_turn();
            wgmma_wait<1>();          // S_j has landed; the PV may still run
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) reg_fence(sacc[i]);
            mbar_arrive(FA3_KEMPTY(s));
            if (j == n_tiles - 1) mbar_arrive(bar_qe);
            softmax(sacc, j * BN, alpha);
            // Without this store, ptxas places the PV's wait (below) above the row max,
            // so the softmax never runs under this consumer's own PV (seen in the SASS).
            // The stored word depends on every exponential through the row sums, and
            // ptxas keeps a shared-memory store ahead of a wgmma wait. Measured on the
            // H200 against the kernel without it: 0.996-1.017x (median 1.008) at d = 128;
            // at d = 64, where the PV is short and the exponentials dominate, 0.979-1.011x
            // (median 0.987), so d = 64 goes without (results/notes/2026-12-04.md, night).
            // At d = 192 and 256 it is kept as at 128 (their PV is longer still; not
            // measured without it).
            if constexpr (DQK >= 128)
                asm volatile("st.shared.f32 [%0], %1;\n"
                             :: "r"(sink), "f"(l_run[0] + l_run[1]) : "memory");
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < DV / 2; ++i) reg_fence(o[i]);
#pragma unroll
            for (int kk = 0; kk < KS_PV; ++kk)
#pragma unroll
                for (int e = 0; e < 4; ++e) reg_fence_u(pf[kk][e]);
            mbar_arrive(FA3_VEMPTY(ps));
#pragma unroll
            for (int t = 0; t < DV / 8; ++t) {
                o[4 * t] *= alpha[0];
                o[4 * t + 1] *= alpha[0];
                o[4 * t + 2] *= alpha[1];
                o[4 * t + 3] *= alpha[1];
            }
            pack_p(sacc);
        }
        // The last tile's PV waits for the next work tile's first S (or the flush).
        pend = true;
        pend_slot = slot;
        pend_kv = kv + n_tiles - 1;
        pm[0] = m_run[0];
        pm[1] = m_run[1];
        pl[0] = l_run[0];
        pl[1] = l_run[1];
        pend_vd = vd;
        kv += n_tiles;
        ++nq;
    }
#undef FA3_KFULL
#undef FA3_VFULL
#undef FA3_KEMPTY
#undef FA3_VEMPTY
#undef FA3_VSFULL
#undef FA3_VSEMPTY
#undef FA3_SCALE
#undef FA3_SCALE_LOG2
}

}  // namespace fa3wg

// The block (the manifest's [[launch]] block) is 128 * (NC + 1) threads.
#define FA3WG_ENTRY(NAME, DQK, DV, BF16, STAGES, BN, NC, MODS)                              \
    extern "C" __global__ void __launch_bounds__(128 * ((NC) + 1), 1) NAME(FaParams p) { \
        fa3wg::fwd<DQK, DV, BF16, STAGES, BN, NC, MODS>(p);                                 \
    }
// e4m3 Q, K and V at d = 64 and 128: 3 stages of 128-key tiles (one more than the 2-byte
// entries keep at d = 128: a V tile is transposed between its copy and its PV, and the
// third slot gives that a whole step more; not yet measured against 2), 2 consumer
// warpgroups.
#define FA3WG_ENTRY8(NAME, D, BF16, MODS)                                                 \
    extern "C" __global__ void __launch_bounds__(384, 1) NAME(FaParams p) {              \
        fa3wg::fwd<D, D, BF16, 3, 128, 2, MODS, true>(p);                                  \
    }

FA3WG_ENTRY(fa3_wgmma_fwd_fp16_d64, 64, 64, false, 3, 128, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwd_fp16_d128, 128, 128, false, 2, 176, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwd_bf16_d64, 64, 64, true, 3, 128, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwd_bf16_d128, 128, 128, true, 2, 176, 2, false)
// d = 192 and 256: 112- and 64-key tiles, under every mask.
FA3WG_ENTRY(fa3_wgmma_fwd_fp16_d192, 192, 192, false, 2, 112, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwd_bf16_d192, 192, 192, true, 2, 112, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwd_fp16_d256, 256, 256, false, 2, 64, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwd_bf16_d256, 256, 256, true, 2, 64, 2, false)
// d_qk = 192, d_v = 128 (the manifest's fourth launch table).
FA3WG_ENTRY(fa3_wgmma_fwdv_fp16_d192v128, 192, 128, false, 2, 128, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwdv_bf16_d192v128, 192, 128, true, 2, 128, 2, false)
// Under a causal mask of at most 3072 keys (the manifest's second launch table).
FA3WG_ENTRY(fa3_wgmma_fwdc_fp16_d128, 128, 128, false, 2, 128, 2, false)
FA3WG_ENTRY(fa3_wgmma_fwdc_bf16_d128, 128, 128, true, 2, 128, 2, false)
// With score modifiers (the third table): 128-key tiles at d = 64 and 128, and the
// plain entries' tiles at the larger head dims.
FA3WG_ENTRY(fa3_wgmma_fwdm_fp16_d64, 64, 64, false, 3, 128, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdm_bf16_d64, 64, 64, true, 3, 128, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdm_fp16_d128, 128, 128, false, 2, 128, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdm_bf16_d128, 128, 128, true, 2, 128, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdm_fp16_d192, 192, 192, false, 2, 112, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdm_bf16_d192, 192, 192, true, 2, 112, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdm_fp16_d256, 256, 256, false, 2, 64, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdm_bf16_d256, 256, 256, true, 2, 64, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdvm_fp16_d192v128, 192, 128, false, 2, 128, 2, true)
FA3WG_ENTRY(fa3_wgmma_fwdvm_bf16_d192v128, 192, 128, true, 2, 128, 2, true)
// e4m3 Q, K and V (the manifest's last four tables), O in fp16 / bf16.
FA3WG_ENTRY8(fa3_wgmma_fwd8_fp16_d128, 128, false, false)
FA3WG_ENTRY8(fa3_wgmma_fwd8_bf16_d128, 128, true, false)
FA3WG_ENTRY8(fa3_wgmma_fwd8m_fp16_d128, 128, false, true)
FA3WG_ENTRY8(fa3_wgmma_fwd8m_bf16_d128, 128, true, true)
FA3WG_ENTRY8(fa3_wgmma_fwd8_fp16_d64, 64, false, false)
FA3WG_ENTRY8(fa3_wgmma_fwd8_bf16_d64, 64, true, false)
FA3WG_ENTRY8(fa3_wgmma_fwd8m_fp16_d64, 64, false, true)
FA3WG_ENTRY8(fa3_wgmma_fwd8m_bf16_d64, 64, true, true)
