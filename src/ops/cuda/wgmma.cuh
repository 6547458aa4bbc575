// Generic pieces of Hopper's warpgroup MMA (wgmma, sm_90a): the 128-byte-swizzle operand layout
// and its descriptors, the fence / commit / wait instructions, the mbarrier, proxy-fence and
// register-reallocation instructions a warp-specialized kernel around them needs, and the bf16
// MMAs of the prefill attention kernel (attention_prefill_wgmma.cuh). The routed experts' FP8
// tiles (moe_prefill_wgmma.cu) take the fences from here and keep their own FP8 MMAs and
// descriptors. Nothing here knows about attention or experts.
//
// Operand layout (both descriptors below): a bf16 matrix stored as blocks of 64 columns; each
// block is `rows` lines of 128 bytes (64 bf16), line r at r * 128 bytes, and the 16-byte chunk c
// of line r at chunk c ^ (r % 8) (wgmma's 128-byte swizzle: it XORs address bits 4-6 with bits
// 7-9, so every block starts on 1024 bytes). The same bytes serve as a K-major operand (the 64
// columns are K: 8 lines a core-matrix group, groups 1024 bytes apart) and as an MN-major one
// (the 64 columns are N, the lines are K; the next 64 columns of N one block further on).
#pragma once

#include <cstdint>

namespace deepinfer::cuda::wgmma {

constexpr int kLineBytes = 128;
constexpr int kAtomBytes = 8 * kLineBytes;  // the swizzle repeats every 8 lines

// Byte offset of 16-byte chunk `chunk` (0-7: columns 8 chunk + [0, 8)) of line `line` within a
// swizzled block.
__device__ __forceinline__ uint32_t swizzled_offset(int line, int chunk) {
  return static_cast<uint32_t>(line * kLineBytes + ((chunk ^ (line & 7)) << 4));
}

__device__ __forceinline__ uint64_t descriptor_bits(uint32_t address, uint32_t leading,
                                                    uint32_t stride) {
  return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((leading & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((stride & 0x3FFFFu) >> 4) << 32) | (uint64_t{1} << 62);
}

// K-major operand (A, or B with imm-trans-b 0): `address` is a block's start plus 32 bytes per
// k16 step into it; the leading byte offset is unused by swizzled K-major layouts (16), the
// stride byte offset is the next 8 lines.
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t address) {
  return descriptor_bits(address, 16, kAtomBytes);
}

// MN-major B (imm-trans-b 1): `address` is a block's start plus 1024 bytes per 8 lines of K;
// the leading byte offset is the distance to the block of the next 64 columns of N, the stride
// byte offset the next 8 lines of K.
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t address, uint32_t block_bytes) {
  return descriptor_bits(address, block_bytes, kAtomBytes);
}

// This thread's shared-memory stores visible to the async proxy (where wgmma reads operands);
// before the barrier that hands them to the MMA's warpgroup.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// After a wgmma_wait: reads of these registers stay after it (the compiler sees the wgmma as
// writing them when it is issued).
template <int kCount>
__device__ __forceinline__ void hold_after_wait(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Before a wgmma_fence: these registers' values are complete here (the compiler may otherwise
// finish computing them between the MMAs of a stage, which makes ptxas serialize every wgmma of
// the function: C7514).
template <int kCount>
__device__ __forceinline__ void settle(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void settle(uint32_t (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
__device__ __forceinline__ void settle(float& d) {
  asm volatile("" : "+f"(d)::"memory");
}

// Register reallocation between warpgroups (each warpgroup's role one branch; the kernel needs
// a register cap at entry: __launch_bounds__(threads, 1)).
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- mbarriers (CTA scope) ----------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint32_t barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}
// Release: this thread's earlier shared-memory accesses happen before the phase completes.
__device__ __forceinline__ void mbarrier_arrive(uint32_t barrier) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(barrier)
      : "memory");
}
// mbarrier_arrive where `arrive` (no branch: the caller's wgmma may be in flight).
__device__ __forceinline__ void mbarrier_arrive_if(uint32_t barrier, bool arrive) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 state;\nsetp.ne.b32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(barrier),
      "r"(static_cast<int>(arrive))
      : "memory");
}
// Acquire: returns once the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t barrier, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "waiting:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra waiting;\n}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// Starts copying `bytes` (a multiple of 16, from 16-byte-aligned `global`) into L2 (the bulk
// copy engine; no registers or shared memory held while it runs).
__device__ __forceinline__ void prefetch_l2(const void* global, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(global), "r"(bytes) : "memory");
}

// ---- the MMAs -------------------------------------------------------------------------------
// d (64 x N, f32) = A . B (accumulate 0) or d + A . B (accumulate 1). d[4j + {0, 1, 2, 3}] of
// lane (g = lane / 4, q = lane % 4) of warp w of the warpgroup is (row 16w + g, col 8j + 2q),
// (16w + g, 8j + 2q + 1), (16w + g + 8, 8j + 2q), (16w + g + 8, 8j + 2q + 1). A register
// operand a[4] of k16: (row 16w + g, k 2q + {0, 1}), (16w + g + 8, same), (16w + g, 8 + 2q +
// {0, 1}), (16w + g + 8, same), bf16x2 with the lower k in bits 0-15: the accumulator layout of
// an n16 slice, so a product's accumulators become the next MMA's A without shuffles.

// A and B from K-major descriptors (both bf16).
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate)
      : "memory");
}

// d = A . B: d's old values unused (outputs only: nothing carries them from before).
__device__ __forceinline__ void wgmma_m64n64k16_ss_fresh(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(a), "l"(b)
      : "memory");
}

// A from registers, B from an MN-major descriptor (imm-trans-b 1).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, {%128,%129,%130,%131}, %132, accumulate, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate)
      : "memory");
}

}  // namespace deepinfer::cuda::wgmma
