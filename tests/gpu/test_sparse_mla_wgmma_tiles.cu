// Device side of the wgmma building-block checks in test_sparse_mla.cpp ("wgmma tiles"): one
// warpgroup runs the three wgmma forms the attention kernel issues, on one 64-row Q tile and one
// 64-row K tile, with the descriptors and fragment helpers of src/spgraph/kernels/sparse_mla/wgmma_sm90.cuh:
//   qk     S = Q K^T, m64n64k16, A and B from 128B-swizzled K-major shared memory, 32 k16 steps
//   pv-rs  O = bf16(S) V, m64n256k16, A from registers (the S accumulator as A fragments), V = the
//          K tile read MN-major, both 256-column halves
//   pv-ss  the same with bf16(S) stored to a swizzled shared panel and read by descriptor
//   panels the P panel as store_acc_panel writes it from S and as store_a_frags_panel writes it
//          from the A fragments (the attention kernel's two ways to store P), both returned
//   n128   both P V forms as m64n128k16 (the split-dv kernel's), over the four 128-column quarters
// A wrong descriptor field or fragment mapping fails here on a single tile, where the attention
// tests would only show a wrong result.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu/sparse_mla_test_util.hpp"
#include "spgraph/kernels/sparse_mla/wgmma_sm90.cuh"

namespace spg::test::mla {

namespace {

namespace d = spg::kernels::detail;

constexpr int kTileSmem = 64 * 1024 + 64 * 1024 + 2 * 8192 + 1024;  // Q, K, two P panels, alignment slack

/// Loads a [64 x 512] bf16 row-major tile into the swizzled K-major layout (8 panels of 64 columns).
__device__ void load_tile_swizzled(unsigned char* dst, const __nv_bfloat16* src, int x) {
#pragma unroll 4
  for (int j = 0; j < 32; ++j) {
    const int c = x + 128 * j;  // 16-byte chunk of the 64 x 1024-byte tile
    const int r = c >> 6;
    const int col = (c & 63) * 8;
    *reinterpret_cast<uint4*>(dst + d::swz_offset(r, col, 64)) = *reinterpret_cast<const uint4*>(src + r * 512 + col);
  }
}

__global__ void __launch_bounds__(128, 1) wgmma_tile_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                            float* s_out, float* o_rs, float* o_ss,
                                                            std::uint32_t* panel_acc, std::uint32_t* panel_frag,
                                                            float* o_rs128, float* o_ss128) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sm = smem_raw + ((1024u - (d::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* sq = sm;
  unsigned char* sk = sm + 65536;
  unsigned char* sp = sm + 131072;
  unsigned char* sp2 = sm + 131072 + 8192;
  const int x = static_cast<int>(threadIdx.x);
  load_tile_swizzled(sq, q, x);
  load_tile_swizzled(sk, k, x);
  d::fence_proxy_async();  // generic-proxy stores -> wgmma (async proxy) reads
  __syncthreads();
  const std::uint32_t qa = d::smem_addr(sq);
  const std::uint32_t ka = d::smem_addr(sk);
  const std::uint32_t pa = d::smem_addr(sp);
  constexpr std::uint32_t kVLbo = 64 * 128;  // the attention kernel's MN-major V strides
  constexpr std::uint32_t kVSbo = 1024;

  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  d::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 32; ++ks)
    d::wgmma_m64n64k16_ss(s, d::desc_kmajor(qa, ks, 64), d::desc_kmajor(ka, ks, 64), ks > 0);
  d::wgmma_commit();
  d::wgmma_wait<0>();
  d::reg_fence(s);
#pragma unroll
  for (int i = 0; i < 32; ++i) s_out[d::acc_row(x, i) * 64 + d::acc_col(x, i)] = s[i];

  std::uint32_t a[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) d::acc_to_a_frag(s, kk, a[kk]);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  for (int half = 0; half < 2; ++half) {
    const std::uint32_t va = ka + static_cast<std::uint32_t>(half * 4 * 8192);
    d::reg_fence(a);
    d::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) d::wgmma_m64n256k16_rs_tb(o, a[kk], d::desc_mnmajor(va, kk, kVLbo, kVSbo), kk > 0);
    d::wgmma_commit();
    d::wgmma_wait<0>();
    d::reg_fence(o);
#pragma unroll
    for (int i = 0; i < 128; ++i) o_rs[d::acc_row(x, i) * 512 + half * 256 + d::acc_col(x, i)] = o[i];
  }

  d::store_acc_panel(d::smem_addr(sp), s, x, 1.0f, 1.0f);
  d::store_a_frags_panel(d::smem_addr(sp2), a, x);
  d::fence_proxy_async();
  __syncthreads();
  for (int i = x; i < 2048; i += 128) {
    panel_acc[i] = reinterpret_cast<const std::uint32_t*>(sp)[i];
    panel_frag[i] = reinterpret_cast<const std::uint32_t*>(sp2)[i];
  }
  for (int half = 0; half < 2; ++half) {
    const std::uint32_t va = ka + static_cast<std::uint32_t>(half * 4 * 8192);
    d::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      d::wgmma_m64n256k16_ss_tb(o, d::desc_kmajor(pa, kk, 64), d::desc_mnmajor(va, kk, kVLbo, kVSbo), kk > 0);
    d::wgmma_commit();
    d::wgmma_wait<0>();
    d::reg_fence(o);
#pragma unroll
    for (int i = 0; i < 128; ++i) o_ss[d::acc_row(x, i) * 512 + half * 256 + d::acc_col(x, i)] = o[i];
  }
  // m64n128: the quarter's V starts two panels on (what the split-dv kernel adds to a half's start).
  float o1[64];
  for (int quarter = 0; quarter < 4; ++quarter) {
    const std::uint32_t va = ka + static_cast<std::uint32_t>(quarter * 2 * 8192);
    d::reg_fence(a);
    d::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) d::wgmma_m64n128k16_rs_tb(o1, a[kk], d::desc_mnmajor(va, kk, kVLbo, kVSbo), kk > 0);
    d::wgmma_commit();
    d::wgmma_wait<0>();
    d::reg_fence(o1);
#pragma unroll
    for (int i = 0; i < 64; ++i) o_rs128[d::acc_row(x, i) * 512 + quarter * 128 + d::acc_col(x, i)] = o1[i];
    d::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      d::wgmma_m64n128k16_ss_tb(o1, d::desc_kmajor(pa, kk, 64), d::desc_mnmajor(va, kk, kVLbo, kVSbo), kk > 0);
    d::wgmma_commit();
    d::wgmma_wait<0>();
    d::reg_fence(o1);
#pragma unroll
    for (int i = 0; i < 64; ++i) o_ss128[d::acc_row(x, i) * 512 + quarter * 128 + d::acc_col(x, i)] = o1[i];
  }
}

}  // namespace

WgmmaTileOutputs run_wgmma_tiles(const std::vector<std::uint16_t>& q, const std::vector<std::uint16_t>& k) {
  SPG_EXPECTS(q.size() == 64 * 512 && k.size() == 64 * 512, "tiles are [64 x 512]");
  const DeviceArray<std::uint16_t> dq{std::span<const std::uint16_t>(q)};
  const DeviceArray<std::uint16_t> dk{std::span<const std::uint16_t>(k)};
  DeviceArray<float> ds(64 * 64);
  DeviceArray<float> drs(64 * 512);
  DeviceArray<float> dss(64 * 512);
  DeviceArray<std::uint32_t> dpa(2048);
  DeviceArray<std::uint32_t> dpf(2048);
  DeviceArray<float> drs128(64 * 512);
  DeviceArray<float> dss128(64 * 512);
  drs128.poison();
  dss128.poison();
  ds.poison();
  drs.poison();
  dss.poison();
  dpa.poison();
  dpf.poison();
  SPG_CUDA_TRY(cudaFuncSetAttribute(wgmma_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTileSmem));
  wgmma_tile_kernel<<<1, 128, kTileSmem>>>(reinterpret_cast<const __nv_bfloat16*>(dq.data()),
                                           reinterpret_cast<const __nv_bfloat16*>(dk.data()), ds.data(), drs.data(),
                                           dss.data(), dpa.data(), dpf.data(), drs128.data(), dss128.data());
  SPG_CUDA_TRY(cudaGetLastError());
  SPG_CUDA_TRY(cudaDeviceSynchronize());
  return {ds.download(), drs.download(), dss.download(), dpa.download(), dpf.download(), drs128.download(), dss128.download()};
}

}  // namespace spg::test::mla
