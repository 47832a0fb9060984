// Hopper (sm_90a) cluster helpers of the wgmma kernel's cluster-pair form (SparseMlaKernel::
// wgmma_pair, sparse_mla_wgmma_kernel.cuh with kPair): the two CTAs of a token (heads 0-63 and
// 64-127) form a cluster of two, each gathers half of every 64-row kv block into registers and
// writes it into its own shared memory and, with st.async, into the partner's at the same offset,
// completing on the partner's full mbarrier. Raw PTX, like wgmma_sm90.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "spgraph/kernels/sparse_mla/sparse_mla_device.cuh"
#include "spgraph/kernels/sparse_mla/wgmma_sm90.cuh"

namespace spg::kernels::detail {

/// This CTA's rank in its cluster (0 or 1 for a pair).
__device__ __forceinline__ std::uint32_t cluster_rank() {
  std::uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

/// The shared::cluster address of the partner CTA `rank`'s copy of this CTA's shared address.
__device__ __forceinline__ std::uint32_t map_to_rank(std::uint32_t smem_addr_bytes, std::uint32_t rank) {
  std::uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr_bytes), "r"(rank));
  return r;
}

/// Every thread of both CTAs: arrive (release) and wait (acquire) at cluster scope. After the
/// barrier init, so neither CTA writes into or arrives on the other's barriers before they exist.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/// Arrival (release, cluster scope) on an mbarrier of another CTA of the cluster (`remote_bar`
/// from map_to_rank).
__device__ __forceinline__ void mbar_arrive_remote(std::uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

/// mbar_arrive_remote where `arrive` is true; the condition stays inside the asm (a predicate), so
/// the consumer path holds no divergent branch (see wgmma_sm90.cuh).
__device__ __forceinline__ void mbar_arrive_remote_if(std::uint32_t remote_bar, bool arrive) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n@p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n}\n" ::"r"(
          remote_bar),
      "r"(static_cast<std::uint32_t>(arrive))
      : "memory");
}

/// Arrival on a local mbarrier that also raises its expected transaction bytes by `bytes` (the
/// bytes the partner's st.async writes will complete on it).
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

/// mbar_wait (wgmma_sm90.cuh) with acquire at cluster scope: for phases completed by the partner
/// CTA's arrivals or st.async bytes. Bounded the same way (trap after 2^34 cycles).
__device__ __forceinline__ void mbar_wait_cluster(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .u64 t0, t1;\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE_%=;\n"
      "mov.u64 t0, %%clock64;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
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

/// 16 bytes of read-only global memory into registers, not kept in L1, with a 256-byte L2
/// prefetch.
__device__ __forceinline__ uint4 ld_global_nc_16(const void* src) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src));
  return v;
}

__device__ __forceinline__ void st_shared_16(std::uint32_t dst, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

/// 16 bytes into another CTA's shared memory (`remote_dst` from map_to_rank), completing
/// 16 transaction bytes on that CTA's mbarrier `remote_bar` once written.
__device__ __forceinline__ void st_async_16(std::uint32_t remote_dst, const uint4& v, std::uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(remote_dst),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

/// The cluster-pair producer's gather, split in two so that a fill's loads run ahead of its
/// buffer's release (128 producer threads, thread x: chunk x % 8 of rows x / 8 and x / 8 + 16 of
/// this CTA's 32 rows of the block, rank r owning rows 32 r .. 32 r + 31).
/// The right half holds 4 panels at d_qk 512 and 5 at 576 (the left half 4).
template <int D>
inline constexpr int kPairMaxPanels = D / 64 - 4;

/// Panels [pn0, pn1) of this thread's two rows (`id0`, `id1`: kv rows, -1 for a masked row, which
/// becomes zeros) into registers.
template <int D>
__device__ __forceinline__ void pair_load(uint4 (&v)[2][kPairMaxPanels<D>], const SparseMlaParams& p, int id0, int id1,
                                          int pn0, int pn1, int x) {
  const int c8 = x & 7;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int id = j == 0 ? id0 : id1;
    const __nv_bfloat16* src = p.kv + c8 * 8;
    if (id >= 0) src += static_cast<std::int64_t>(id) * p.kv_row_stride;
#pragma unroll
    for (int k = 0; k < kPairMaxPanels<D>; ++k) {
      if (k < pn1 - pn0) {
        if (id >= 0) {
          v[j][k] = ld_global_nc_16(src + (pn0 + k) * 64);
        } else {
          v[j][k] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  }
}

/// The registers of pair_load into this CTA's buffer `buf` and the partner's (`peer_delta` bytes
/// on in the shared::cluster window), the 128B-swizzled tile of wgmma_sm90.cuh; then the arrivals
/// on the local full barrier `full_bar`: thread 0's also expects the partner's bytes (32 rows x
/// 128 bytes per panel), which its st.async writes complete on that barrier.
template <int D>
__device__ __forceinline__ void pair_store(const uint4 (&v)[2][kPairMaxPanels<D>], std::uint32_t buf,
                                           std::uint32_t peer_delta, std::uint32_t full_bar, int pn0, int pn1, int x,
                                           int rank) {
  const int c8 = x & 7;
  const int rsub = x >> 3;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = 32 * rank + rsub + 16 * j;
    const std::uint32_t dst = buf + static_cast<std::uint32_t>(r * 128 + ((c8 ^ (r & 7)) << 4));
#pragma unroll
    for (int k = 0; k < kPairMaxPanels<D>; ++k) {
      if (k < pn1 - pn0) {
        const std::uint32_t a = dst + static_cast<std::uint32_t>((pn0 + k) * 8192);
        st_shared_16(a, v[j][k]);
        st_async_16(a + peer_delta, v[j][k], full_bar + peer_delta);
      }
    }
  }
  fence_proxy_async();  // this thread's generic stores, before the consumers' wgmma reads
  if (x == 0) {
    mbar_arrive_expect_tx(full_bar, static_cast<std::uint32_t>(32 * 128 * (pn1 - pn0)));
  } else {
    mbar_arrive(full_bar);
  }
}

}  // namespace spg::kernels::detail
