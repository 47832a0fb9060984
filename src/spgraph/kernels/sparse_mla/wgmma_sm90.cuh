// Hopper (sm_90a) device helpers of the wgmma sparse MLA kernel (sparse_mla_wgmma_kernel.cuh):
// the wgmma shapes the kernel issues, wgmma and proxy fences, mbarriers with a bounded
// wait, named-barrier arrival, register reallocation between warpgroups, cp.async with an L2
// prefetch hint, TMA stores and L2 policies, and the accumulator fragment layouts (the tile
// layout's offsets and the shared-memory matrix descriptors are in wgmma_desc.hpp). Raw PTX, so the encodings
// tests/gpu/test_sparse_mla_wgmma_tiles.cu checks are exactly the ones written here.
//
// Shared-memory tile convention (the "128-byte-swizzle K-major" layout): a [rows x 64*P] bf16 tile
// is stored as P panels of 64 columns, panel p at byte p * rows * 128; within a panel row r sits at
// byte r * 128 and its 16-byte chunk c (columns 8c .. 8c+7) at chunk position c ^ (r % 8). Tiles
// start 1024-byte aligned, so the hardware's 128B swizzle (address bits [4,7) ^= bits [7,10))
// reproduces exactly this placement.
//
// ptxas honours the setmaxnreg budgets and keeps the wgmma ops asynchronous only while the
// consumer path holds no call (printf) and no C++ __trap(): the bounded mbarrier wait therefore
// keeps its loop and its trap in one asm block.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "spgraph/kernels/sparse_mla/sparse_mla_device.cuh"
#include "spgraph/kernels/sparse_mla/wgmma_desc.hpp"

namespace spg::kernels::detail {

// ---- wgmma synchronization
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Orders this thread's generic-proxy shared-memory accesses against later async-proxy (wgmma) ones.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/// Keeps the compiler from moving accesses of an accumulator register across a wgmma fence/wait.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void reg_fence(std::uint32_t (&r)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// ---- wgmma ops (bf16 inputs, fp32 accumulators; scale-d from `accumulate`)
/// D[64 x 64] (+)= A[64 x 16] * B[16 x 64]; A K-major, B K-major, both from shared-memory descriptors.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The 128 fp32 accumulators of an m64n256 op: their placeholders (operands %0-%127) and their
// read-write operand list, shared by the two m64n256k16 wrappers below.
#define SPG_WGMMA_N256_D_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63," \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95," \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define SPG_WGMMA_N256_D_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/// D[64 x 256] (+)= A[64 x 16] * B[16 x 256]; A K-major, B MN-major (imm-trans-b = 1), both from shared-memory descriptors.
__device__ __forceinline__ void wgmma_m64n256k16_ss_tb(float (&d)[128], std::uint64_t desc_a, std::uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" SPG_WGMMA_N256_D_REGS "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : SPG_WGMMA_N256_D_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/// D[64 x 256] (+)= A[64 x 16] * B[16 x 256]; A from registers (4 x bf16x2 per thread), B MN-major (imm-trans-b = 1) from a descriptor.
__device__ __forceinline__ void wgmma_m64n256k16_rs_tb(float (&d)[128], const std::uint32_t (&a)[4], std::uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" SPG_WGMMA_N256_D_REGS "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : SPG_WGMMA_N256_D_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

#undef SPG_WGMMA_N256_D_OPERANDS
#undef SPG_WGMMA_N256_D_REGS

// The 64 fp32 accumulators of an m64n128 op (the column-half single pass, SparseMlaKernel::
// wgmma_split_dv), shared by the two m64n128k16 wrappers below.
#define SPG_WGMMA_N128_D_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SPG_WGMMA_N128_D_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/// D[64 x 128] (+)= A[64 x 16] * B[16 x 128]; A K-major, B MN-major (imm-trans-b = 1), both from shared-memory descriptors.
__device__ __forceinline__ void wgmma_m64n128k16_ss_tb(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" SPG_WGMMA_N128_D_REGS "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      : SPG_WGMMA_N128_D_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/// D[64 x 128] (+)= A[64 x 16] * B[16 x 128]; A from registers (4 x bf16x2 per thread), B MN-major (imm-trans-b = 1) from a descriptor.
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" SPG_WGMMA_N128_D_REGS "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : SPG_WGMMA_N128_D_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

#undef SPG_WGMMA_N128_D_OPERANDS
#undef SPG_WGMMA_N128_D_REGS

// ---- mbarriers (CTA scope)
__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
/// Arrives on `bar` once every cp.async this thread issued so far has landed (pending count is
/// raised now and dropped at completion, so it adds no expected arrival of its own).
__device__ __forceinline__ void mbar_arrive_on_cp_async(std::uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
/// The same with .noinc: the arrival at completion is one of the barrier's expected arrivals, so
/// a thread that fills and arrives makes exactly one arrival per phase (no plain arrive after it).
__device__ __forceinline__ void mbar_arrive_on_cp_async_noinc(std::uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
/// Waits for the phase of `bar` with parity `parity`. The spin is bounded: after 2^34 cycles
/// (about 9 s at the H200's clock, far past any legitimate wait of this kernel) it traps, so a
/// protocol bug ends the launch with an error instead of hanging the stream. Loop and trap live in
/// one asm block (see the file comment).
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .u64 t0, t1;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE_%=;\n"
      "mov.u64 t0, %%clock64;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE_%=;\n"
      "mov.u64 t1, %%clock64;\n"
      "sub.u64 t1, t1, t0;\n"
      "setp.lt.u64 p, t1, 17179869184;\n"
      "@p bra WAIT_%=;\n"
      "trap;\n"
      "DONE_%=:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

/// bar.arrive on named barrier `id` for `count` threads (the producer side of named_barrier).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---- register reallocation between warpgroups
template <int N>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// stmatrix: four 8x8 bf16 tiles from mma-fragment registers (thread l holds row l / 4, columns
/// 2 (l % 4) and + 1 of tile i in r[i]); lane l gives the shared address of row l % 8 of tile l / 8.
__device__ __forceinline__ void stmatrix_x4(std::uint32_t row_addr, std::uint32_t r0, std::uint32_t r1, std::uint32_t r2,
                                            std::uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row_addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

/// TMA store of one [64 heads x 64 columns] bf16 box from a 128B-swizzled K-major panel at `src`
/// (8 KiB, the layout of swz_offset with 64 rows) to the 3-D tensor {columns, heads, tokens} `map`
/// describes, at column `col`, head `head` and token `token`, with an L2 policy. Completes
/// asynchronously (bulk group).
__device__ __forceinline__ void tma_store_box(const void* map, std::uint32_t src, int col, int head, int token,
                                              std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;\n" ::"l"(map),
      "r"(src), "r"(col), "r"(head), "r"(token), "l"(policy)
      : "memory");
}
/// Arrives on `bar` (one of its expected arrivals) and raises its expected transaction bytes by
/// `bytes`: the phase completes once the copies that signal it have delivered them.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/// TMA load of one [64 rows x 64 columns] bf16 box of the 3-D tensor {columns, rows, tokens} `map`
/// describes (at column `col`, row `row`, token `token`) into a 128B-swizzled K-major panel at `dst`
/// (8 KiB, 1024-byte aligned), with an L2 policy; completes its bytes on `bar`.
__device__ __forceinline__ void tma_load_box(const void* map, std::uint32_t dst, std::uint32_t bar, int col, int row,
                                             int token, std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(col), "r"(row), "r"(token), "l"(policy)
      : "memory");
}
/// Brings a tensor map (a kernel parameter) into the TMA unit's descriptor cache ahead of its use.
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
/// L2 policy "evict first" for every line an access touches: for data read or written once (a
/// CTA's query rows, its output rows), so it does not push out the kv rows that many CTAs reread.
__device__ __forceinline__ std::uint64_t l2_evict_first() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
/// L2 policy "evict normal" (the default priority) for every line an access touches.
__device__ __forceinline__ std::uint64_t l2_evict_normal() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
/// Prefetch of the 128-byte line holding `src` into L2; nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* src) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src) : "memory");
}
/// Bulk prefetch of `bytes` (a multiple of 16, 16-byte aligned) of global memory into L2; nothing
/// to wait for.
__device__ __forceinline__ void prefetch_l2_bulk(const void* src, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
/// Closes this thread's bulk group (nothing waits for it).
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// Waits until every bulk group this thread committed has read its shared source.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

/// cp.async of 16 bytes global -> shared with a 256-byte L2 prefetch; src_bytes 0 zero-fills the
/// destination and reads nothing.
__device__ __forceinline__ void cp_async_16_l2(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
/// The same with an L2 eviction policy.
__device__ __forceinline__ void cp_async_16_l2_hint(std::uint32_t dst, const void* src, int src_bytes, std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}
/// L2 policy "evict last" for the lines of a `fraction` of the addresses an access touches (the
/// rest keep their priority): lines that may take the persisting set-aside of L2
/// (cudaLimitPersistingL2CacheSize; with none set aside, evict-last acts as normal).
__device__ __forceinline__ std::uint64_t l2_evict_last_fraction(float fraction) {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.L2::evict_unchanged.b64 %0, %1;\n" : "=l"(policy) : "f"(fraction));
  return policy;
}
/// cp.async of 16 bytes with an L2 eviction policy and no L2 prefetch.
__device__ __forceinline__ void cp_async_16_hint_no_l2_prefetch(std::uint32_t dst, const void* src, int src_bytes,
                                                                std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(src_bytes),
               "l"(policy)
               : "memory");
}
/// cp.async of 16 bytes without an L2 prefetch: a miss fetches only the sectors the access needs.
__device__ __forceinline__ void cp_async_16_no_l2_prefetch(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// ---- fragment layouts (PTX ISA "Register Fragments" of wgmma, m64nNk16, f32 accumulator):
// thread x of the warpgroup (warp w = x / 32, lane l, g = l / 4, t = l % 4) holds accumulator
// element i (0 <= i < N / 2) at row 16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 t + (i & 1).
__host__ __device__ constexpr int acc_row(int x, int i) { return 16 * (x >> 5) + ((x & 31) >> 2) + 8 * ((i >> 1) & 1); }
__host__ __device__ constexpr int acc_col(int x, int i) { return 8 * (i >> 2) + 2 * (x & 3) + (i & 1); }

/// bf16 A fragment of k16 step kk from a 64 x 64 fp32 accumulator (S or P). The A layout of
/// m64k16 puts a[0] = (row g, k 2t..2t+1), a[1] = (row g+8, same k), a[2] = (row g, k 2t+8..),
/// a[3] = (row g+8, k 2t+8..), rows offset by 16 w: exactly accumulator elements 8kk+0..7 in order.
__device__ __forceinline__ void acc_to_a_frag(const float (&s)[32], int kk, std::uint32_t (&a)[4]) {
  a[0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
  a[1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
  a[2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
  a[3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
}

/// Stores a thread's 16 words of a 64 x 64 bf16 P panel (8 KiB at shared address `panel`,
/// 1024-byte aligned, the 128B-swizzled K-major layout of swz_offset with 64 rows); w[n][h] packs
/// the thread's accumulator elements 4n + 2h, 4n + 2h + 1 (row g + 8h of its warp's 16, columns
/// 8n + 2t ..); x: the thread in its warpgroup. Four stmatrix.x4, one per 16 columns: lane l
/// addresses row l % 8 of tile l / 8, the tiles of step j being (column group 2j, rows 0-7), (2j,
/// rows 8-15), (2j + 1, 0-7), (2j + 1, 8-15) of the warp's rows. Group 2j + b of row r sits at
/// chunk (2j + b) ^ (r % 8) = (b ^ r % 8) ^ 2j, so step j is step 0's address with j in bits 5-6
/// (the epilogue's out staging uses the same addressing). Eight rows of a tile hit distinct banks.
__device__ __forceinline__ void store_panel_words(std::uint32_t panel, const std::uint32_t (&w)[8][2], int x) {
  const int lane = x & 31;
  const int tile = lane >> 3;
  const std::uint32_t base = panel + static_cast<std::uint32_t>(16 * (x >> 5) + (lane & 7) + 8 * (tile & 1)) * 128u +
                             static_cast<std::uint32_t>(((tile >> 1) ^ (lane & 7)) << 4);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    stmatrix_x4(base ^ static_cast<std::uint32_t>(j << 5), w[2 * j][0], w[2 * j][1], w[2 * j + 1][0], w[2 * j + 1][1]);
}

/// Stores a 64 x 64 fp32 accumulator, times per-row factors (f0 for rows g, f1 for rows g + 8),
/// as bf16 into a P panel (store_panel_words' layout).
__device__ __forceinline__ void store_acc_panel(std::uint32_t panel, const float (&s)[32], int x, float f0, float f1) {
  std::uint32_t w[8][2];
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    w[n][0] = pack_bf16(s[4 * n] * f0, s[4 * n + 1] * f0);
    w[n][1] = pack_bf16(s[4 * n + 2] * f1, s[4 * n + 3] * f1);
  }
  store_panel_words(panel, w, x);
}

/// Stores a 64 x 64 accumulator already packed as the four k-steps' A fragments (acc_to_a_frag)
/// into a P panel: the same bits as store_acc_panel(panel, s, x, 1, 1) of the accumulator the
/// fragments were packed from, with no conversion. Elements 4n + 2h, 4n + 2h + 1 are
/// a[n / 2][2 (n % 2) + h].
__device__ __forceinline__ void store_a_frags_panel(std::uint32_t panel, const std::uint32_t (&a)[4][4], int x) {
  std::uint32_t w[8][2];
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    w[n][0] = a[n >> 1][2 * (n & 1)];
    w[n][1] = a[n >> 1][2 * (n & 1) + 1];
  }
  store_panel_words(panel, w, x);
}

}  // namespace spg::kernels::detail
