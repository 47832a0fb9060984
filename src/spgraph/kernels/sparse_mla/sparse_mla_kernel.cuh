// Device code of the mma.sync sparse MLA attention kernels (SparseMlaKernel::mma_single_pass and
// mma_split_topk, see sparse_mla.hpp): persistent CTAs, each walking items of (token, 64 heads
// [, top-k slice]), and the kernel that merges the split-top-k partials. Any sm_80+ device runs
// them; the wgmma single pass (sparse_mla_wgmma_kernel.cuh) is the sm_90 production path.
//
// The CTA keeps an item's 64 query rows in shared memory and streams the token's kv rows through a
// double-buffered shared-memory stage, 64 rows at a time, gathered with 16-byte cp.async (masked
// rows are zero-filled, never read, and their scores forced to -inf). Eight warps share the work
// of a block:
//   S = Q K^T (64 heads x 64 rows): d_qk 512 splits the 512-deep product in two halves per warp
//       pair (32 heads x 32 rows each) and the pair swaps partial sums through shared memory,
//       which reads fewer operand bytes than 32 x 16 tiles over the full depth; d_qk 576 uses
//       32 x 16 tiles over the full depth (its operands leave no room for the swap buffer).
//   online softmax in the log2 domain (scores pre-scaled by sm_scale * log2 e); the four warps
//       of a 32-head half trade row maxima through shared memory; P goes to shared memory as bf16.
//   O += P V: warp w owns output columns [64 w, 64 w + 64) of all 64 heads (128 fp32 registers).
// Formulas: docs/pipeline.md, "Sparse attention semantics".
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "spgraph/kernels/sparse_mla/sparse_mla_device.cuh"

namespace spg::kernels::detail {

struct SparseMlaMergeParams {
  const float* part_o;
  const float2* part_ml;
  const float* attn_sink;
  int num_splits;
  int s_q;
  int h_q;
  __nv_bfloat16* out;
  std::int64_t out_token_stride;  ///< elements between tokens of out
  float* max_logits;
  float* lse;
  const std::int32_t* token_offset;  ///< a chunk of a step: its first output row (null: 0)
  const std::int32_t* num_tokens;    ///< with token_offset: rows past it are other chunks'
};

inline constexpr int kMlaThreads = 256;
inline constexpr int kMlaMergeThreads = 256;

/// Shared-memory plan for one d_qk. Rows of Q, K and P are stored with 16-byte chunks XOR-swizzled
/// by (row & 7), so ldmatrix over 8 rows of one column chunk touches 8 distinct bank groups.
template <int D>
struct MlaSmem {
  static constexpr int kRowBytes = 2 * D;
  static constexpr bool kSplitK = D == 512;
  static constexpr int kQBytes = 64 * kRowBytes;
  static constexpr int kStageBytes = 64 * kRowBytes;
  // P rows of the two 32-head halves sit kPHalf apart; with the split product each half's slot
  // first carries the pair-swap partials of that half's four warps (8 KiB).
  static constexpr int kPHalf = kSplitK ? 8192 : 4096;
  static constexpr int kOffQ = 0;
  static constexpr int kOffStage = kQBytes;
  static constexpr int kOffP = kOffStage + 2 * kStageBytes;
  static constexpr int kOffRedMax = kOffP + 2 * kPHalf;  // [64 heads][4 row quarters] f32
  static constexpr int kOffAlpha = kOffRedMax + 64 * 16; // [64] f32
  static constexpr int kOffMask = kOffAlpha + 64 * 4;    // [2 stages][64 rows] f32: 0 or -inf
  static constexpr int kBytes = kOffMask + 2 * 64 * 4;
  // Epilogue scratch, in the P region (free once the last block's P V is done).
  static constexpr int kOffRedL = kOffP;            // [64][4] f32
  static constexpr int kOffMFinal = kOffP + 1024;   // [64] f32
  static constexpr int kOffInv = kOffP + 1280;      // [64] f32
  static_assert(kBytes <= 232448, "shared memory plan exceeds the 227 KiB a CTA may hold");
  static_assert(64 * 1024 <= kStageBytes, "output staging reuses a kv stage");
};

__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(std::uint32_t addr, std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                        std::uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(std::uint32_t addr, std::uint32_t& r0, std::uint32_t& r1,
                                              std::uint32_t& r2, std::uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

/// c += a * b for one m16n8k16 tile, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// One unit of work: 64 heads of one token over one slice of its top-k range.
struct MlaItem {
  int token;
  int head0;
  int split;
  int len;      ///< valid prefix of the top-k row (0 for a token past num_tokens)
  int b_begin;  ///< 64-row blocks [b_begin, b_end) of this slice
  int b_end;
};

template <int D>
__global__ void __launch_bounds__(kMlaThreads, 1) sparse_mla_kernel(const SparseMlaParams p) {
  using L = MlaSmem<D>;
  constexpr int kRB = L::kRowBytes;
  constexpr bool kSplitK = L::kSplitK;
  constexpr int kNt = kSplitK ? 4 : 2;               // 8-row n-tiles of S per warp before the swap
  constexpr int kSteps = kSplitK ? D / 32 : D / 16;  // k16 steps per warp
  constexpr int kChunksPerThread = D / 64;           // 16-byte chunks per gathered row per thread

  extern __shared__ __align__(1024) unsigned char smem[];
  const std::uint32_t sbase = smem_addr(smem);

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;  // mma row group
  const int t = lane & 3;   // mma thread in group

  // Persistent CTAs: CTA c takes items c, c + gridDim.x, ...; item = (token * halves + half) *
  // num_splits + split. While an item's last block is in flight the next item's first kv block
  // and its Q rows are already loading, so a CTA never waits on a cold start between items.
  const int n_items = p.num_items;
  const int stride_items = static_cast<int>(gridDim.x);
  const int halves = p.h_q >> 6;
  const int live_tokens = p.num_tokens != nullptr ? __ldg(p.num_tokens) : p.s_q;
  const std::int64_t rows_total = static_cast<std::int64_t>(p.s_q) * p.h_q;

  auto make_item = [&](int i) {
    MlaItem it;
    it.split = i % p.num_splits;
    const int th = i / p.num_splits;
    it.head0 = (th % halves) * 64;
    it.token = th / halves;
    int len = 0;
    if (it.token < live_tokens) {
      len = p.topk;
      if (p.topk_length != nullptr) len = min(max(__ldg(p.topk_length + it.token), 0), p.topk);
    }
    it.len = len;
    it.b_begin = it.split * p.blocks_per_split;
    it.b_end = min(it.b_begin + p.blocks_per_split, (len + 63) >> 6);
    return it;
  };
  auto row_of = [&](const MlaItem& it) { return static_cast<std::int64_t>(it.token) * p.h_q + it.head0; };
  // A chunk of a step: its q and output rows start at row_base (the partials are the chunk's own).
  const std::int64_t row_base = step_row_base(p.token_offset);
  const std::int64_t out_row_base = row_base * p.h_q;
  // The item's first out row and first q row: tokens sit at their own strides, heads contiguous.
  auto out_of = [&](const MlaItem& it) { return p.out + (row_base + it.token) * p.out_token_stride + it.head0 * 512; };
  auto q_of = [&](const MlaItem& it) { return p.q + (row_base + it.token) * p.q_token_stride + it.head0 * D; };
  // An item with no block to run: out 0, max_logits -inf, lse +inf (or an empty partial); a padded
  // token of a step's chunk writes nothing.
  auto write_empty = [&](const MlaItem& it) {
    const std::int64_t row0 = row_of(it);
    if (p.write_partials) {
      if (tid < 64) p.part_ml[it.split * rows_total + row0 + tid] = make_float2(-CUDART_INF_F, 0.0f);
      return;
    }
    if (p.token_offset != nullptr && it.token >= live_tokens) return;
    if (tid < 64) {
      p.max_logits[out_row_base + row0 + tid] = -CUDART_INF_F;
      p.lse[out_row_base + row0 + tid] = CUDART_INF_F;
    }
    uint4* gout = reinterpret_cast<uint4*>(out_of(it));
#pragma unroll
    for (int i = 0; i < 16; ++i) gout[tid + 256 * i] = make_uint4(0u, 0u, 0u, 0u);
  };
  // First item at or after `from` (in this CTA's stride) with work; empty ones are written on the way.
  auto next_nonempty = [&](int from, MlaItem& it) {
    for (int i = from; i < n_items; i += stride_items) {
      it = make_item(i);
      if (it.b_begin < it.b_end) return i;
      write_empty(it);
    }
    return n_items;
  };

  // ---- gather mapping: thread -> rows (lrow, lrow + 32), chunks lsub + 8 k
  const int lrow = tid >> 3;
  const int lsub = tid & 7;
  const std::uint32_t ld_dst = static_cast<std::uint32_t>(lrow * kRB + ((lsub ^ (lrow & 7)) << 4));
  float* mask_s = reinterpret_cast<float*>(smem + L::kOffMask);

  auto load_indices = [&](const MlaItem& it, int b, int (&idx)[2]) {
    const std::int32_t* idx_row = index_row(p, it.token) + b * 64 + lrow;
    idx[0] = __ldg(idx_row);
    idx[1] = __ldg(idx_row + 32);
  };
  auto issue_block = [&](const MlaItem& it, int b, int stage, const int (&idx)[2]) {
    const std::uint32_t dst_stage = sbase + L::kOffStage + stage * L::kStageBytes + ld_dst;
#pragma unroll
    for (int pp = 0; pp < 2; ++pp) {
      const int r = lrow + 32 * pp;
      const int j = b * 64 + r;
      const int id = idx[pp];
      const bool valid = j < it.len && id >= 0 && id < p.s_kv;
      const char* src = reinterpret_cast<const char*>(p.kv) + lsub * 16;
      if (valid) src += static_cast<std::int64_t>(id) * p.kv_row_stride * 2;
      const int bytes = valid ? 16 : 0;  // 0: cp.async zero-fills and reads nothing
      const std::uint32_t dst = dst_stage + 32 * pp * kRB;
#pragma unroll
      for (int k = 0; k < kChunksPerThread; ++k) cp_async_16(dst + 128 * k, src + 128 * k, bytes);
      if (lsub == 0) mask_s[stage * 64 + r] = valid ? 0.0f : -CUDART_INF_F;
    }
  };
  auto issue_q = [&](const MlaItem& it) {
    const char* qsrc = reinterpret_cast<const char*>(q_of(it)) + lsub * 16;
    const std::uint32_t qdst = sbase + L::kOffQ + ld_dst;
#pragma unroll
    for (int pp = 0; pp < 2; ++pp)
#pragma unroll
      for (int k = 0; k < kChunksPerThread; ++k)
        cp_async_16(qdst + 32 * pp * kRB + 128 * k, qsrc + (lrow + 32 * pp) * kRB + 128 * k, 16);
  };

  // ---- warp roles
  const int hh = warp >> 2;  // 32-head half of S
  const int q4 = warp & 3;   // 16-row quarter of the block that the warp's final S tile covers
  const int xa = (lane >> 4) ^ (lane & 7);         // swizzle key of A-style (x4, rows 0-15) loads
  const int xb = ((lane >> 3) & 1) ^ (lane & 7);   // swizzle key of B-style (x4, two n-tiles) loads
  std::uint32_t a_off[4];
  std::uint32_t b_off[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    a_off[c] = static_cast<std::uint32_t>(((2 * c) ^ xa) << 4);
    b_off[c] = static_cast<std::uint32_t>(((2 * c) ^ xb) << 4);
  }
  // S tile origin: kv rows and the byte offset of the warp's slice of the d_qk product.
  const int s_row0 = kSplitK ? (q4 >> 1) * 32 : q4 * 16;
  const int k_byte0 = kSplitK ? (q4 & 1) * D : 0;  // (q4 & 1) * (D / 2) elements
  const std::uint32_t q_base = sbase + L::kOffQ + (hh * 32 + (lane & 15)) * kRB + k_byte0;
  const std::uint32_t k_lane = (s_row0 + (lane & 7) + ((lane >> 4) << 3)) * kRB + k_byte0;
  const std::uint32_t v_lane = ((lane & 7) + (((lane >> 3) & 1) << 3)) * kRB + warp * 128;
  const std::uint32_t p_base = sbase + L::kOffP + (lane & 15) * 128;
  float* alpha_s = reinterpret_cast<float*>(smem + L::kOffAlpha);
  float* red_max = reinterpret_cast<float*>(smem + L::kOffRedMax);

  MlaItem it;
  int cur = next_nonempty(blockIdx.x, it);
  if (cur >= n_items) return;
  int idx[2];
  issue_q(it);
  load_indices(it, it.b_begin, idx);
  issue_block(it, it.b_begin, 0, idx);
  cp_async_commit();
  if (it.b_begin + 1 < it.b_end) load_indices(it, it.b_begin + 1, idx);

  int step = 0;  // blocks run so far by this CTA: picks the stage
  while (true) {
    float o[4][8][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
    float m_run[2][2];  // [m-tile][row half] running max, log2 units
    float l_run[2][2];  // partial sums over this thread's columns
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_run[mt][h] = -CUDART_INF_F;
        l_run[mt][h] = 0.0f;
      }

    MlaItem nx{};
    int nxt = n_items;
    for (int b = it.b_begin; b < it.b_end; ++b, ++step) {
      const int stage = step & 1;
      const bool last = b + 1 == it.b_end;
      cp_async_wait_all();
      __syncthreads();  // block b landed for every thread; every warp is done with the previous block
      // Gathers the next block (of this item, or the next item's first) into the other stage.
      auto issue_next = [&]() {
        if (!last) {
          issue_block(it, b + 1, stage ^ 1, idx);
          cp_async_commit();
          if (b + 2 < it.b_end) load_indices(it, b + 2, idx);
        } else {
          nxt = next_nonempty(cur + stride_items, nx);
          if (nxt < n_items) {
            load_indices(nx, nx.b_begin, idx);
            issue_block(nx, nx.b_begin, stage ^ 1, idx);
            cp_async_commit();
            if (nx.b_begin + 1 < nx.b_end) load_indices(nx, nx.b_begin + 1, idx);
          }
        }
      };
      // Issued before the S tile, so the gather has the whole tile to hide behind
      // (docs/benchmark_history.md).
      issue_next();
      const std::uint32_t st = sbase + L::kOffStage + stage * L::kStageBytes;

      // ---- S = Q K^T for the warp's tile
      float s[2][kNt][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
      const std::uint32_t k_base = st + k_lane;
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const std::uint32_t co = (ks >> 2) * 128;
        std::uint32_t a[2][4];
        ldsm_x4(q_base + co + a_off[ks & 3], a[0][0], a[0][1], a[0][2], a[0][3]);
        ldsm_x4(q_base + 16 * kRB + co + a_off[ks & 3], a[1][0], a[1][1], a[1][2], a[1][3]);
        std::uint32_t bk[kNt][2];
#pragma unroll
        for (int np = 0; np < kNt / 2; ++np)
          ldsm_x4(k_base + np * 16 * kRB + co + b_off[ks & 3], bk[2 * np][0], bk[2 * np][1], bk[2 * np + 1][0],
                  bk[2 * np + 1][1]);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) mma_bf16(s[mt][nt], a[mt], bk[nt][0], bk[nt][1]);
      }

      // ---- final S tile: 32 heads x 16 rows [q4 * 16, q4 * 16 + 16)
      float f[2][2][4];
      if constexpr (kSplitK) {
        // The pair (kh = 0, 1) holds partial sums over the two halves of d_qk for 32 rows; each
        // keeps 16 rows and receives the partner's partials for them.
        const int kh = q4 & 1;
        float4* xbuf = reinterpret_cast<float4*>(smem + L::kOffP + hh * L::kPHalf);
        float send[2][2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              send[mt][j][e] = kh ? s[mt][j][e] : s[mt][j + 2][e];
              f[mt][j][e] = kh ? s[mt][j + 2][e] : s[mt][j][e];
            }
#pragma unroll
        for (int i = 0; i < 4; ++i)
          xbuf[((q4 * 4) + i) * 32 + lane] =
              make_float4(send[i >> 1][i & 1][0], send[i >> 1][i & 1][1], send[i >> 1][i & 1][2], send[i >> 1][i & 1][3]);
        named_barrier(3 + (warp >> 1), 64);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 v = xbuf[(((q4 ^ 1) * 4) + i) * 32 + lane];
          f[i >> 1][i & 1][0] += v.x;
          f[i >> 1][i & 1][1] += v.y;
          f[i >> 1][i & 1][2] += v.z;
          f[i >> 1][i & 1][3] += v.w;
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f[mt][j][e] = s[mt][j][e];
      }

      // ---- online softmax: scale, mask, block max across the four warps of this head half
      const float* mask_b = mask_s + stage * 64 + q4 * 16 + 2 * t;
      const float2 bias0 = *reinterpret_cast<const float2*>(mask_b);
      const float2 bias1 = *reinterpret_cast<const float2*>(mask_b + 8);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          f[mt][0][2 * h] = fmaf(f[mt][0][2 * h], p.scale_log2, bias0.x);
          f[mt][0][2 * h + 1] = fmaf(f[mt][0][2 * h + 1], p.scale_log2, bias0.y);
          f[mt][1][2 * h] = fmaf(f[mt][1][2 * h], p.scale_log2, bias1.x);
          f[mt][1][2 * h + 1] = fmaf(f[mt][1][2 * h + 1], p.scale_log2, bias1.y);
          float v = fmaxf(fmaxf(f[mt][0][2 * h], f[mt][0][2 * h + 1]), fmaxf(f[mt][1][2 * h], f[mt][1][2 * h + 1]));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
          if (t == 0) red_max[(hh * 32 + mt * 16 + h * 8 + g) * 4 + q4] = v;
        }
      named_barrier(1 + hh, 128);
      unsigned char* p_s = smem + L::kOffP + hh * L::kPHalf;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int hr = mt * 16 + h * 8 + g;  // head row within the half
          const float4 r = *reinterpret_cast<const float4*>(red_max + (hh * 32 + hr) * 4);
          const float m_blk = fmaxf(fmaxf(r.x, r.y), fmaxf(r.z, r.w));
          const float m_new = fmaxf(m_run[mt][h], m_blk);
          // A row with nothing valid so far keeps -inf; subtract 0 instead so exp2 gives 0, not NaN.
          const float m_use = m_new == -CUDART_INF_F ? 0.0f : m_new;
          const float alpha = fast_exp2(m_run[mt][h] - m_use);
          m_run[mt][h] = m_new;
          const float p00 = fast_exp2(f[mt][0][2 * h] - m_use);
          const float p01 = fast_exp2(f[mt][0][2 * h + 1] - m_use);
          const float p10 = fast_exp2(f[mt][1][2 * h] - m_use);
          const float p11 = fast_exp2(f[mt][1][2 * h + 1] - m_use);
          l_run[mt][h] = fmaf(l_run[mt][h], alpha, (p00 + p01) + (p10 + p11));
          // P[hr][q4 * 16 + j * 8 + 2t], 16-byte chunk (2 q4 + j) swizzled by hr & 7 == g
          unsigned char* prow = p_s + hr * 128 + 4 * t;
          *reinterpret_cast<std::uint32_t*>(prow + (((2 * q4) ^ g) << 4)) = pack_bf16(p00, p01);
          *reinterpret_cast<std::uint32_t*>(prow + (((2 * q4 + 1) ^ g) << 4)) = pack_bf16(p10, p11);
          if (q4 == 0 && t == 0) alpha_s[hh * 32 + hr] = alpha;
        }
      __syncthreads();  // P and alpha of this block are complete; every warp is done reading Q
      if (last && nxt < n_items) {
        issue_q(nx);
        cp_async_commit();
      }

      // ---- O = alpha O + P V over the warp's 64 output columns
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const float al0 = alpha_s[mt * 16 + g];
        const float al1 = alpha_s[mt * 16 + 8 + g];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          o[mt][nt][0] *= al0;
          o[mt][nt][1] *= al0;
          o[mt][nt][2] *= al1;
          o[mt][nt][3] *= al1;
        }
      }
      const std::uint32_t v_base = st + v_lane;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        std::uint32_t a[4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
          ldsm_x4(p_base + (mt >> 1) * L::kPHalf + (mt & 1) * 2048 + a_off[kk], a[mt][0], a[mt][1], a[mt][2],
                  a[mt][3]);
        std::uint32_t bv[8][2];
#pragma unroll
        for (int np = 0; np < 4; ++np)
          ldsm_x4_trans(v_base + kk * 16 * kRB + a_off[np], bv[2 * np][0], bv[2 * np][1], bv[2 * np + 1][0],
                        bv[2 * np + 1][1]);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) mma_bf16(o[mt][nt], a[mt], bv[nt][0], bv[nt][1]);
      }
    }

    // ---- epilogue of `it`: per-head statistics, then out (or the partials)
    const std::int64_t row0 = row_of(it);
    __syncthreads();  // the P region and the last block's stage become scratch
    float* red_l = reinterpret_cast<float*>(smem + L::kOffRedL);
    float* m_fin = reinterpret_cast<float*>(smem + L::kOffMFinal);
    float* inv_s = reinterpret_cast<float*>(smem + L::kOffInv);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = l_run[mt][h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        const int hd = hh * 32 + mt * 16 + h * 8 + g;
        if (t == 0) {
          red_l[hd * 4 + q4] = v;
          if (q4 == 0) m_fin[hd] = m_run[mt][h];
        }
      }
    __syncthreads();
    if (tid < 64) {
      const float4 r = *reinterpret_cast<const float4*>(red_l + tid * 4);
      const float l = (r.x + r.y) + (r.z + r.w);
      const float m = m_fin[tid];
      if (p.write_partials) {
        p.part_ml[it.split * rows_total + row0 + tid] = make_float2(m, l);
      } else {
        const RowFinal fin = finalize_row(m, l, p.attn_sink, it.head0 + tid);
        p.max_logits[out_row_base + row0 + tid] = fin.max_logit;
        p.lse[out_row_base + row0 + tid] = fin.lse;
        inv_s[tid] = fin.inv;
      }
    }
    __syncthreads();

    if (p.write_partials) {
      // Unnormalized fp32 O; the merge kernel weighs the slices.
      float* po = p.part_o + (it.split * rows_total + row0) * 512 + warp * 64 + 2 * t;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float* prow = po + (mt * 16 + h * 8 + g) * 512;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            *reinterpret_cast<float2*>(prow + nt * 8) = make_float2(o[mt][nt][2 * h], o[mt][nt][2 * h + 1]);
        }
    } else {
      // bf16 out, staged through the stage the last block used (the next item's first block went
      // to the other one, its Q to the Q region), so global stores are 16-byte and coalesced.
      unsigned char* o_s = smem + L::kOffStage + ((step - 1) & 1) * L::kStageBytes;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int hd = mt * 16 + h * 8 + g;
          const float inv = inv_s[hd];
          unsigned char* orow = o_s + hd * 1024 + 4 * t;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            *reinterpret_cast<std::uint32_t*>(orow + (((warp * 8 + nt) ^ g) << 4)) =
                pack_bf16(o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv);
        }
      __syncthreads();
      uint4* gout = reinterpret_cast<uint4*>(out_of(it));
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int c = tid + 256 * i;  // 16-byte chunk of the 64 x 1024-byte tile
        const int r = c >> 6;
        const int cc = c & 63;
        gout[c] = *reinterpret_cast<const uint4*>(o_s + r * 1024 + ((cc ^ (r & 7)) << 4));
      }
    }
    if (nxt >= n_items) break;
    cur = nxt;
    it = nx;
  }
}

/// Merges the split-top-k partials of one (token, head) per warp: rescale each slice to the
/// common max, add, normalize (sink included), write out, max_logits and lse.
__global__ void __launch_bounds__(kMlaMergeThreads) sparse_mla_merge_kernel(const SparseMlaMergeParams p) {
  // Launched with programmatic serialization after the partial kernel: the partials are read only
  // once it has completed.
  wait_for_previous_grid();
  const std::int64_t rows = static_cast<std::int64_t>(p.s_q) * p.h_q;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (kMlaMergeThreads / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  // A chunk of a step: its output rows start at *token_offset, and a padded token's are another chunk's.
  const std::int64_t out_row = row + static_cast<std::int64_t>(step_row_base(p.token_offset)) * p.h_q;
  if (p.token_offset != nullptr && row / p.h_q >= __ldg(p.num_tokens)) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int head = static_cast<int>(row % p.h_q);

  float m = -CUDART_INF_F;
  for (int s = 0; s < p.num_splits; ++s) {
    const float2 ml = p.part_ml[s * rows + row];
    if (ml.y > 0.0f) m = fmaxf(m, ml.x);
  }
  float l = 0.0f;
  float4 acc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s = 0; s < p.num_splits; ++s) {
    const float2 ml = p.part_ml[s * rows + row];
    if (!(ml.y > 0.0f)) continue;  // an empty slice: its O is not read
    const float w = exp2f(ml.x - m);
    l = fmaf(ml.y, w, l);
    const float4* po = reinterpret_cast<const float4*>(p.part_o + (s * rows + row) * 512) + lane;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = po[32 * i];
      acc[i].x = fmaf(w, v.x, acc[i].x);
      acc[i].y = fmaf(w, v.y, acc[i].y);
      acc[i].z = fmaf(w, v.z, acc[i].z);
      acc[i].w = fmaf(w, v.w, acc[i].w);
    }
  }
  const RowFinal fin = finalize_row(m, l, p.attn_sink, head);
  uint2* gout = reinterpret_cast<uint2*>(p.out + (out_row / p.h_q) * p.out_token_stride + head * 512) + lane;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    gout[32 * i] = make_uint2(pack_bf16(acc[i].x * fin.inv, acc[i].y * fin.inv),
                              pack_bf16(acc[i].z * fin.inv, acc[i].w * fin.inv));
  if (lane == 0) {
    p.max_logits[out_row] = fin.max_logit;
    p.lse[out_row] = fin.lse;
  }
}

}  // namespace spg::kernels::detail
