// Device code of the wgmma sparse MLA attention kernel (SparseMlaKernel::wgmma_single_pass,
// wgmma_split_topk and wgmma_split_dv, see sparse_mla.hpp): sm_90a only, one CTA per work item on
// a 1-D grid of s_q * (h_q / 64) * num_splits CTAs (twice that for the split-dv pass, two CTAs an
// item); an item is (token, 64 heads, top-k slice), and the single pass has one slice. 384
// threads = 3 warpgroups with specialized roles.
//
//   WG2 (producer, 56 registers): loads the CTA's 64 query rows once, in two halves behind
//       mbarriers of their own (left half, first kv block's left half, right half, ...: the order
//       the consumers' first k-steps need them), and gathers the slice's kv rows 64 at a time
//       with 16-byte cp.async into two swizzled [64 x D] buffers K0 / K1 (masked rows
//       zero-filled and never read; a 0 / -inf bias per row goes to shared memory, and per
//       producer warp a byte saying whether any of its 16 rows of the block is masked). A
//       thread's row sources are formed once a pair, for both halves of each buffer.
//       Each buffer is split into a left half (panels 0-3: value columns 0-255) and a right half
//       (panels 4.., the value columns 256-511 plus, at d_qk 576, the 64 rope columns), each with
//       a full mbarrier and two empty ones, for its kv rows 0-31 and 32-63: the half's last
//       reader releases each part as soon as its P V product's k-steps over those rows complete
//       (two wgmma groups), and the producer refills the half part by part.
//       Q rows (and, in the epilogue, out rows) go through L2 as "evict first": each is used by
//       one CTA, while the kv rows are reread by many. Late in the item it prefetches into L2 the
//       first indices, and while the kv rows fit their share of L2 the Q rows, of the CTA that takes
//       an SM one wave later.
//   WG0, WG1 (consumers, 224 registers): the token's blocks are taken in pairs (2p -> K0,
//       2p+1 -> K1). WG0 computes S0 = Q K0^T in full (64 x 64, no redundant work) and WG1
//       S1 = Q K1^T. WG c owns output columns [256 c, 256 c + 256): a 64 x 256 fp32 accumulator.
//       Softmax statistics are chained rather than exchanged both ways: WG0 publishes its new row
//       max m0; WG1 takes m1 = max(m0, rowmax S1) and publishes it; WG0 then rescales its P0 by
//       exp2(m0 - m1), so after each pair both warpgroups hold the same running max. Each WG runs
//       the P V product for its own block with P from registers (RS) and for the other WG's block
//       with P from a swizzled shared panel (SS) that the other WG wrote. WG0 issues the next
//       pair's Q K0^T while its second P V product runs; WG1 issues its P0 V0 product before it
//       announces P1, so that product runs ahead of WG0's P1 V1 and frees K0's right half sooner.
//   The running max is a lazy reference (kWgmmaRescaleThreshold): it moves only when a block's
//   max passes it by more than 8 log2 units, and a warp none of whose rows moved skips its O
//   rescale; the true max, kept apart, is what max_logits reports.
//   A block with no masked row (and a positive scale) takes the softmax's short form: the scale
//   goes into the exponent's FMA, no bias is read. A P panel whose rows need no factor is stored
//   from the P V product's A fragments, packed once (issue 15 round 14); P panels are written
//   with stmatrix (round 17).
//   Row sums stay per warpgroup (each only sums its own block's P) and are added in the epilogue,
//   which writes bf16 out (single pass) or the slice's unnormalized fp32 O and (m, l) for the
//   merge kernel (split).
// Named barriers (256 threads: both consumer WGs): M0 (m0 published), M1 (m1 published), S0 / S1
// (P panel written), L (row sums); 128-thread barriers EPI0 / EPI1 for the output staging.
//
// What keeps ptxas from serializing the wgmma ops or ignoring setmaxnreg (checked with
// -Xptxas -v): the warpgroup index is broadcast with __shfl_sync so role branches are
// warp-uniform; every batch of wgmma ops is opened with an explicit wgmma fence and the registers
// it reads are pinned before it (reg_fence); the consumer path holds no call and no C++ __trap()
// (see wgmma_sm90.cuh). Formulas: docs/pipeline.md, "Sparse attention semantics"; the shared-memory
// tile layout and descriptors: wgmma_sm90.cuh.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "spgraph/kernels/sparse_mla/sparse_mla_device.cuh"
#include "spgraph/kernels/sparse_mla/wgmma_sm90.cuh"
#include "spgraph/kernels/sparse_mla/wgmma_timeline.hpp"

namespace spg::kernels::detail {

#ifdef SPGRAPH_WGMMA_TIMELINE
// A/B builds only (wgmma_timeline.hpp): the records of the last launch, by blockIdx.x.
static __device__ WgmmaTimelineRecord g_wgmma_timeline[kWgmmaTimelineCtas];
__device__ __forceinline__ unsigned long long wgmma_global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned wgmma_smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
#define SPG_WGMMA_TL(field, value)                                                   \
  do {                                                                               \
    if (blockIdx.x < static_cast<unsigned>(kWgmmaTimelineCtas)) g_wgmma_timeline[blockIdx.x].field = (value); \
  } while (0)
#else
#define SPG_WGMMA_TL(field, value) \
  do {                             \
  } while (0)
#endif

inline constexpr int kWgmmaThreads = 384;
inline constexpr int kWgmmaConsumerRegs = 224;
inline constexpr int kWgmmaProducerRegs = 56;  // 2 * 128 * 224 + 128 * 56 = 64512 = 384 * 168
/// Lazy rescaling (issue 15 round 8, docs/benchmark_history.md): a row's reference max, against
/// which P = exp2(s - ref) and O are kept, moves only when a block's max exceeds it by more than
/// this many log2 units, so P stays <= 2^8 and after a row's first blocks the reference rarely
/// moves; a warp whose rows all keep theirs skips the 128-register rescale of O (on the chain
/// between the two consumer warpgroups). The rows' true max is kept apart for max_logits and the
/// split's partial m. The result is the same softmax: O, l and the sink are all relative to ref.
inline constexpr float kWgmmaRescaleThreshold = 8.0f;
/// Initial running max: finite, so exp2(kWgmmaMInit - kWgmmaMInit) = 1 keeps a start on masked
/// blocks NaN-free.
inline constexpr float kWgmmaMInit = -1e30f;

/// L2 policy of the rows one CTA reads or writes once (its Q rows, its out rows): evict-first, so
/// they do not push out the kv rows many CTAs reread. The A/B switch SPGRAPH_WGMMA_NORMAL_POLICY
/// (issue 15 round 11, measured neutral) gives them the default priority instead.
__device__ __forceinline__ std::uint64_t wgmma_once_row_policy() {
#ifdef SPGRAPH_WGMMA_NORMAL_POLICY
  return l2_evict_normal();
#else
  return l2_evict_first();
#endif
}

enum WgmmaBarrier : int { kWgBarM0 = 1, kWgBarM1 = 2, kWgBarS0 = 3, kWgBarS1 = 4, kWgBarL = 5, kWgBarEpi0 = 6 };

/// Shared-memory plan of one d_qk (offsets from the 1024-byte aligned base).
template <int D>
struct WgmmaSmem {
  static constexpr int kPanels = D / 64;
  static constexpr int kSteps = D / 16;  // k16 steps of Q K^T
  static constexpr int kTile = 64 * D * 2;
  static constexpr int kOffQ = 0;  // with the start of K0, the output staging area in the epilogue
  static constexpr int kOffK0 = kTile;
  static constexpr int kOffK1 = 2 * kTile;
  static constexpr int kOffS1 = 3 * kTile;
  // d_qk 576: P0 reuses K0's rope panel (panel 8), which only WG0's Q K0^T reads and which the
  // producer refills only after WG1's whole P0 V product (both right-half empty barriers of K0).
  // At d_qk 576 the producer's refill of K0's right half must follow both WG1's reads of P0 and
  // WG0's store of it: K0's right-half empty barriers take WG0's arrivals too (kEmptyK0RightCount).
  static constexpr int kOffS0 = D == 576 ? kOffK0 + 8 * 8192 : kOffS1 + 8192;
  static_assert(D != 576 || (kOffS0 >= kOffK0 + 4 * 8192 && kOffS0 + 8192 <= kOffK0 + kTile),
                "at d_qk 576 P0 must lie in K0's right half, the half whose empty barriers WG0 arrives on");
  static constexpr int kOffMisc = kOffS1 + (D == 576 ? 8192 : 16384);
  static constexpr int kOffMask = kOffMisc;        // float [2][64]: 0 or -inf per kv row of K0 / K1
  static constexpr int kOffM0 = kOffMisc + 512;    // float [64]
  static constexpr int kOffM1 = kOffMisc + 768;    // float [64]
  static constexpr int kOffL = kOffMisc + 1024;    // float [2][64]
  // full[2][2], empty[2][2] (rows 0-31 of each half), Q left / right, empty_hi[2][2] (rows
  // 32-63): 14 mbarriers, 112 bytes
  static constexpr int kOffBar = kOffMisc + 1536;
  // u8 [2][4]: per kv buffer, one byte per producer warp (its 16 rows of the block), nonzero when
  // any of those rows is masked; the consumers' softmax takes its short form on a block with none.
  static constexpr int kOffMaskAny = kOffBar + 112;
  static constexpr int kBytes = kOffBar + 128;
  static constexpr int kAlloc = kBytes + 1024;  // slack to align the base to 1024 bytes
  static_assert(kAlloc <= 232448, "shared memory plan exceeds 227 KiB");
};

/// Where work item `item` sits: its token, first of its 64 heads and top-k slice (items run
/// slice-fastest, then head group, then token).
struct WgmmaItemPos {
  int token;
  int head0;
  int split;
};

__device__ __forceinline__ WgmmaItemPos wgmma_item_pos(const SparseMlaParams& p, int item) {
  const int groups = p.h_q >> 6;
  const int th = item / p.num_splits;
  return {th / groups, (th % groups) * 64, item % p.num_splits};
}

/// The first index (of the token's row) that top-k slice `split` covers.
__device__ __forceinline__ int slice_j0(const SparseMlaParams& p, int split) { return split * p.blocks_per_split * 64; }

/// One work item: (token, 64 heads, top-k slice) and the slice's valid index range [j0, j_end).
struct WgmmaItem {
  int token;
  int head0;
  int split;
  int j0;
  int j_end;
  int n_pairs;  ///< pairs of 64-row blocks; an odd block count ends with an all-masked block
};

__device__ __forceinline__ WgmmaItem wgmma_item(const SparseMlaParams& p, int item) {
  WgmmaItem it;
  const WgmmaItemPos at = wgmma_item_pos(p, item);
  it.token = at.token;
  it.head0 = at.head0;
  it.split = at.split;
  // Valid prefix of the token's index row; a token at or past *num_tokens (a padded token of the
  // bucket) has none and comes out as an empty row.
  int len = p.topk;
  if (p.topk_length != nullptr) len = min(max(__ldg(p.topk_length + it.token), 0), p.topk);
  if (p.num_tokens != nullptr && it.token >= __ldg(p.num_tokens)) len = 0;
  it.j0 = slice_j0(p, it.split);
  it.j_end = min(len, it.j0 + p.blocks_per_split * 64);
  const int n_blocks = it.j_end > it.j0 ? (it.j_end - it.j0 + 63) >> 6 : 0;
  it.n_pairs = (n_blocks + 1) >> 1;
  return it;
}

/// kSplitDv (SparseMlaKernel::wgmma_split_dv): two CTAs per item (CTA 2i + half runs item i),
/// each computing the item's S and softmax in full and P V for 256 of the 512 value columns:
/// WG c owns columns [256 c + 128 half, + 128), so each warpgroup's P V still reads only its half
/// of each kv buffer and the buffers' release order is the single pass's. Single pass only (no
/// partials); CTA half 0 writes max_logits and lse.
template <int D, bool kSplitDv>
__global__ void __launch_bounds__(kWgmmaThreads, 1) sparse_mla_wgmma_kernel(const __grid_constant__ SparseMlaParams p,
                                                                              const __grid_constant__ CUtensorMap out_map) {
#ifdef SPGRAPH_WGMMA_TIMELINE
  // Before anything else: the gap to the CTA before it on the SM, split from this CTA's set-up.
  const unsigned long long tl_entry = clock64();
#endif
  using L = WgmmaSmem<D>;
  constexpr int kCols = kSplitDv ? 128 : 256;  // output columns of one consumer warpgroup
  constexpr int kORegs = kCols / 2;            // its fp32 accumulators per thread
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sm = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const std::uint32_t sb = smem_addr(sm);
  const std::uint32_t bar_base = sb + L::kOffBar;
  auto full_bar = [&](int b, int h) { return bar_base + static_cast<std::uint32_t>((2 * b + h) * 8); };
  auto empty_bar = [&](int b, int h) { return bar_base + 32u + static_cast<std::uint32_t>((2 * b + h) * 8); };
  // A half is released in two parts: empty_bar covers its kv rows 0-31, empty_hi_bar rows 32-63.
  auto empty_hi_bar = [&](int b, int h) { return bar_base + 80u + static_cast<std::uint32_t>((2 * b + h) * 8); };
  // Q in two halves like the kv buffers: the left panels (columns 0-255), the right ones (the rest).
  const std::uint32_t q_bar_left = bar_base + 64u;
  const std::uint32_t q_bar_right = bar_base + 72u;

  // Every barrier takes one arrival per thread of one warpgroup (on the full and Q barriers, the
  // producer's fill_arrive), except K0's right-half empty barriers at d_qk 576: P0 lives in that
  // half's rope panel (all 64 rows), so WG0 (which stores P0) arrives on both parts' barriers as
  // well as WG1 (which reads it last), and the refill is ordered after both directly.
  constexpr int kEmptyK0RightCount = D == 576 ? 256 : 128;
  if (threadIdx.x == 0) {
    // index 5 = empty_bar(0, 1), 11 = empty_hi_bar(0, 1) (full[2][2] at 0-3, empty[2][2] at 4-7,
    // Q left / right at 8-9, empty_hi[2][2] at 10-13)
    for (int i = 0; i < 14; ++i) {
#ifdef SPGRAPH_WGMMA_Q_TMA
      // A/B switch (issue 15 round 23): Q's barriers (8, 9) take one arrival, with Q's bytes.
      if (i == 8 || i == 9) {
        mbar_init(bar_base + 8u * i, 1);
        continue;
      }
#endif
      mbar_init(bar_base + 8u * i, i == 5 || i == 11 ? kEmptyK0RightCount : 128);
    }
    mbar_init_fence();
  }
  // Programmatic dependent launch (the launcher allows it): nothing above reads memory an earlier
  // kernel writes; from here on every input is read and out written. No early release of the
  // dependents: released at the start, the merge after the slices ran slower (likely its CTAs
  // all went to the SMs the slices left idle; docs/benchmark_history.md, notes by version).
  wait_for_previous_grid();
  __syncthreads();
#ifdef SPGRAPH_WGMMA_TIMELINE
  if (threadIdx.x == 0) {
    SPG_WGMMA_TL(start, clock64());
    SPG_WGMMA_TL(gt_start, wgmma_global_ns());
    SPG_WGMMA_TL(smid, wgmma_smid());
    SPG_WGMMA_TL(entry, tl_entry);
  }
#endif

  // Broadcast from lane 0 so the compiler sees the warpgroup index as warp-uniform: the role
  // branches then are not divergent paths, which would make ptxas serialize the wgmma ops.
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) >> 7, 0);
  const int x = static_cast<int>(threadIdx.x) & 127;
  const int dv_half = kSplitDv ? static_cast<int>(blockIdx.x & 1u) : 0;
  const WgmmaItem it = wgmma_item(p, static_cast<int>(kSplitDv ? blockIdx.x >> 1 : blockIdx.x));
  // Byte offset of this CTA's value columns within a warpgroup's half of a kv buffer.
  const std::uint32_t vcol = static_cast<std::uint32_t>(dv_half) * 2u * 8192u;
  // A chunk of a step: its rows start at row_base, and a padded token's rows are another chunk's.
  const int row_base = step_row_base(p.token_offset);
  if (p.token_offset != nullptr && it.token >= __ldg(p.num_tokens)) return;
  const int token = it.token;
  const int head0 = it.head0;
  const int n_pairs = it.n_pairs;
  float* mask_s = reinterpret_cast<float*>(sm + L::kOffMask);
  unsigned char* mask_any_s = sm + L::kOffMaskAny;

  if (wg == 2) {
    // ------------------------------------------------------------------ producer
    regs_decrease<kWgmmaProducerRegs>();
#ifdef SPGRAPH_WGMMA_PREFETCH_OUT_MAP
    // A/B switch, off (issue 15 round 3, docs/benchmark_history.md): the out map's descriptor fetched at
    // the start rather than at the epilogue's first store (the split kernels pass no map).
    // Measured within the spread; kept as a switch for a longer A/B.
    if (x == 0 && !p.write_partials) prefetch_tensormap(&out_map);
#endif
    // A fill's arrival on its full (or Q) barrier once this thread's cp.async copies have landed:
    // one .noinc arrival at completion, which counts as one of the barrier's 128 expected
    // arrivals (the form compute-sanitizer's synccheck accepts; docs/testing.md).
    auto fill_arrive = [&](std::uint32_t bar) { mbar_arrive_on_cp_async_noinc(bar); };
    const int c8 = x & 7;     // 16-byte chunk within a 128-byte panel row
    const int rsub = x >> 3;  // rows rsub + 16 i, i < 4
    // Q's panels [pn0, pn1), then an arrival on `bar` once they (and everything this thread
    // issued before) have landed. An item with no block loads no Q (nothing would wait for it).
#ifndef SPGRAPH_WGMMA_Q_TMA
    const __nv_bfloat16* qsrc =
        p.q + (static_cast<std::int64_t>(row_base) + token) * p.q_token_stride + head0 * D + c8 * 8;
#endif
    const std::uint64_t q_policy = wgmma_once_row_policy();  // each Q row is read by one CTA only
    auto load_q = [&](int pn0, int pn1, std::uint32_t bar) {
#ifdef SPGRAPH_WGMMA_Q_TMA
      // A/B switch (issue 15 round 23): one thread, one TMA box a panel (64 columns of 64 heads).
      if (x == 0) {
        mbar_arrive_expect_tx(bar, static_cast<std::uint32_t>(pn1 - pn0) * 8192u);
        for (int pn = pn0; pn < pn1; ++pn)
          tma_load_box(&p.q_map, sb + L::kOffQ + static_cast<std::uint32_t>(pn) * 8192u, bar, pn * 64, head0, row_base + token,
                       q_policy);
      }
#else
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = rsub + 16 * i;
        const std::uint32_t dst = sb + L::kOffQ + static_cast<std::uint32_t>(r * 128 + ((c8 ^ (r & 7)) << 4));
#pragma unroll
        for (int pn = pn0; pn < pn1; ++pn) cp_async_16_l2_hint(dst + pn * 8192, qsrc + r * D + pn * 64, 16, q_policy);
      }
      fill_arrive(bar);
#endif
    };
    const std::int32_t* idx_row = index_row(p, token);
    // The index values of pair `pr` (-1 past the slice's valid part, which is never read, nor
    // past topk). Loaded one pair ahead, so their latency hides behind a pair's waits and fills
    // instead of delaying the next pair's first fill.
    auto load_indices = [&](int pr, int (&raw)[2][4]) {
#pragma unroll
      for (int bb = 0; bb < 2; ++bb)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = it.j0 + (2 * pr + bb) * 64 + rsub + 16 * i;
          raw[bb][i] = j < it.j_end ? __ldg(idx_row + j) : -1;
        }
    };
    int next_raw[2][4];
    // Without topk_length the first pair's indices go out before Q's left half, since the first
    // gather waits for them (a per-CTA timeline of V4-C1/8192: back ~2,150 cycles after the
    // start when issued behind Q). With it, the index loads wait for the length anyway; Q first
    // kept those rows at their time, indices first cost V4-C128A 0.3-0.4% in two runs (issue 15
    // round 18, docs/benchmark_history.md).
    if (n_pairs > 0) {
      if (p.topk_length == nullptr) {
        load_indices(0, next_raw);
        load_q(0, 4, q_bar_left);
      } else {
        load_q(0, 4, q_bar_left);
        load_indices(0, next_raw);
      }
    }
    const __nv_bfloat16* const kv_chunk = p.kv + c8 * 8;  // this thread's chunk of kv's first row
#ifdef SPGRAPH_WGMMA_KV_PERSIST
    const std::uint64_t kv_policy = l2_evict_last_fraction(p.kv_persist_fraction);
#endif
    for (int pair = 0; pair < n_pairs; ++pair) {
      // Per (block of the pair, row slot): the source of this thread's 16-byte chunk of the kv
      // row, formed once for both halves of the buffer (a masked row reads nothing: its chunk is
      // zero-filled from kv's first row), and a bit per masked row, 4 bb + i.
      const __nv_bfloat16* src[2][4];
      unsigned masked_rows = 0u;
#pragma unroll
      for (int bb = 0; bb < 2; ++bb)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // One unsigned compare: a negative index is above every s_kv.
          const bool valid = static_cast<unsigned>(next_raw[bb][i]) < static_cast<unsigned>(p.s_kv);
          const std::uint64_t row = valid ? static_cast<unsigned>(next_raw[bb][i]) : 0u;
          src[bb][i] = kv_chunk + row * static_cast<std::uint64_t>(p.kv_row_stride);
          if (!valid) masked_rows |= 1u << (4 * bb + i);
        }
      if (pair + 1 < n_pairs) load_indices(pair + 1, next_raw);
      const std::uint32_t parity = static_cast<std::uint32_t>(pair & 1) ^ 1u;
      // Fill order = consumer need order: K0 left (WG0's Q K0^T starts there), K1 right (WG1
      // starts with the right half), K0 right, K1 left.
#pragma unroll
      for (int step = 0; step < 4; ++step) {
        const int bb = step & 1;
        const int hh = ((step + 1) >> 1) & 1;
        mbar_wait(empty_bar(bb, hh), parity);
        // (the mask of buffer bb was read by the warpgroup whose release passed the wait)
        if (step < 2) {
          if (c8 == 0) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
              mask_s[bb * 64 + rsub + 16 * i] = (masked_rows >> (4 * bb + i)) & 1u ? -CUDART_INF_F : 0.0f;
          }
          // Lane 0 (a mask writer, so the same ordering before the fill's arrival) writes its
          // warp's byte: whether any of the warp's 16 rows of this block is masked.
          const bool masked = ((masked_rows >> (4 * bb)) & 15u) != 0u;
          const unsigned any = __ballot_sync(0xffffffffu, masked);
          if ((x & 31) == 0) mask_any_s[bb * 4 + (x >> 5)] = any != 0u ? 1u : 0u;
        }
        const std::uint32_t buf = sb + (bb ? L::kOffK1 : L::kOffK0);
        const int pn0 = hh ? 4 : 0;
        const int pn1 = hh ? L::kPanels : 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // Rows 32-63 (i = 2, 3) once their part of the half is released too.
          if (i == 2) mbar_wait(empty_hi_bar(bb, hh), parity);
          const int r = rsub + 16 * i;
          const int bytes = (masked_rows >> (4 * bb + i)) & 1u ? 0 : 16;
          const std::uint32_t dst = buf + static_cast<std::uint32_t>(r * 128 + ((c8 ^ (r & 7)) << 4));
          // With a 256-byte L2 prefetch only while the kv rows fit their share of L2 (p.kv_l2_prefetch).
#ifdef SPGRAPH_WGMMA_KV_PERSIST
          // A/B switch (issue 15 round 23): the kv rows gathered evict-last over the fraction of
          // their addresses that fits the persisting set-aside of L2 (kv_persist_fraction).
          if (p.kv_l2_prefetch) {
#pragma unroll
            for (int pn = pn0; pn < pn1; ++pn) cp_async_16_l2_hint(dst + pn * 8192, src[bb][i] + pn * 64, bytes, kv_policy);
          } else {
#pragma unroll
            for (int pn = pn0; pn < pn1; ++pn)
              cp_async_16_hint_no_l2_prefetch(dst + pn * 8192, src[bb][i] + pn * 64, bytes, kv_policy);
          }
#else
          if (p.kv_l2_prefetch) {
#pragma unroll
            for (int pn = pn0; pn < pn1; ++pn) cp_async_16_l2(dst + pn * 8192, src[bb][i] + pn * 64, bytes);
          } else {
#pragma unroll
            for (int pn = pn0; pn < pn1; ++pn)
              cp_async_16_no_l2_prefetch(dst + pn * 8192, src[bb][i] + pn * 64, bytes);
          }
#endif
        }
        fill_arrive(full_bar(bb, hh));
        if (pair == 0 && step == 0 && x == 0) SPG_WGMMA_TL(first_fill, clock64());
        // Need order at the start: Q left + K0 left (WG0's first k-steps), then Q right + K1 right.
        if (pair == 0 && step == 0) load_q(4, L::kPanels, q_bar_right);
      }
      // Past this CTA's start, and about five pairs before its end: the Q rows of the CTA that
      // takes an SM next go to L2 (64 KB, one bulk prefetch), so the CTAs of a wave, which start
      // together, do not all wait for Q from HBM at once (docs/benchmark_history.md); where the
      // kv rows outgrow their share of L2 (p.prefetch_q_rows off), only its first indices.
      if (x == 0 && p.q_prefetch_ahead > 0 && pair == (n_pairs > 5 ? n_pairs - 5 : n_pairs >> 1)) {
        const std::int64_t next = static_cast<std::int64_t>(blockIdx.x) + p.q_prefetch_ahead;
        const std::int64_t next_item = kSplitDv ? next >> 1 : next;
        const WgmmaItemPos at = wgmma_item_pos(p, static_cast<int>(next < p.num_items ? next_item : 0));
        // A step's chunk: a padded token's q row may lie past the step's rows; it is not read.
        if (next < p.num_items && (p.token_offset == nullptr || at.token < __ldg(p.num_tokens))) {
          // Past that share the wave's 64 KB a CTA displace more kv rows than Q's wait saves
          // (issue 15 round 19).
          if (p.prefetch_q_rows) {
            prefetch_l2_bulk(p.q + (static_cast<std::int64_t>(row_base) + at.token) * p.q_token_stride + at.head0 * D,
                             64u * D * 2u);
          }
          // And its first pair's indices (at most 128, inside its row), whose load from HBM
          // otherwise holds up that CTA's first gather (issue 15 round 18).
          const int j0 = slice_j0(p, at.split);
          const std::int32_t* nrow = index_row(p, at.token) + j0;
          const int lines = (min(128, p.topk - j0) + 31) >> 5;  // 128-byte lines
          for (int l = 0; l < lines; ++l) prefetch_l2(nrow + 32 * l);
          if (p.topk_length != nullptr) prefetch_l2(p.topk_length + at.token);
        }
      }
    }
    if (x == 0) SPG_WGMMA_TL(producer_end, clock64());
    return;
  }

  // -------------------------------------------------------------------- consumers
  regs_increase<kWgmmaConsumerRegs>();
  const int w = x >> 5;
  const int lane = x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int r0 = 16 * w + g;  // accumulator rows r0 (h = 0) and r0 + 8 (h = 1)
  // The rows' sinks, loaded now so the epilogue does not wait for them.
  const float sink_log2[2] = {sink_log2_of(p.attn_sink, head0 + r0), sink_log2_of(p.attn_sink, head0 + r0 + 8)};
  const std::uint32_t qa = sb + L::kOffQ;
  const std::uint32_t k0a = sb + L::kOffK0;
  const std::uint32_t k1a = sb + L::kOffK1;
  const std::uint32_t s0a = sb + L::kOffS0;
  const std::uint32_t s1a = sb + L::kOffS1;
  float* m0_s = reinterpret_cast<float*>(sm + L::kOffM0);
  float* m1_s = reinterpret_cast<float*>(sm + L::kOffM1);
  constexpr std::uint32_t kVLbo = 64 * 128;  // MN-major V: next 64 value columns = next panel
  constexpr std::uint32_t kVSbo = 1024;      // next 8 kv rows

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  float m_run[2] = {kWgmmaMInit, kWgmmaMInit};
  float l_run[2] = {0.0f, 0.0f};
  float m_true[2] = {-CUDART_INF_F, -CUDART_INF_F};  // the rows' true max (m_run: the lazy reference)
  // The reference max after a block of row max `block_max`: max(ref, block_max), unless that
  // exceeds `ref` by no more than the lazy threshold.
  auto next_ref = [](float ref, float block_max) {
    const float cand = fmaxf(ref, block_max);
    return cand - ref <= kWgmmaRescaleThreshold ? ref : cand;
  };
  // O *= the rows' factors; a warp whose factors are all exactly 1 skips it.
  auto rescale_o_by = [&](const float (&f)[2]) {
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] *= f[(i >> 1) & 1];
  };
  auto rescale_o = [&](const float (&f)[2]) {
    if (__all_sync(0xffffffffu, f[0] == 1.0f && f[1] == 1.0f)) return;
    rescale_o_by(f);
  };

  // S (+)= Q K^T over k16 steps [ks0, ks1) of buffer `ka`
  auto qk_steps = [&](std::uint32_t ka, int ks0, int ks1, bool clear) {
    // Explicit fence at every batch (cheap: it orders register accesses, it does not wait for
    // wgmma completion); without it ptxas injects its own after each mbarrier wait.
    wgmma_fence();
#pragma unroll
    for (int ks = ks0; ks < ks1; ++ks)
      wgmma_m64n64k16_ss(s, desc_kmajor(qa, ks, 64), desc_kmajor(ka, ks, 64), (clear && ks == ks0) ? 0 : 1);
  };
  // s = s * scale_log2 + mask bias (per kv column); returns the quad-reduced row maxima (of the
  // scaled s). On a block with no masked row and a positive scale, the short form: s stays as
  // the product, the maxima are the product's times the scale (equal, as rounding is monotonic),
  // and the exponent takes the scale in its one FMA (softmax_update's `folded`); returns whether
  // it took that form.
  auto scale_mask_max = [&](int buf, float (&mx)[2]) -> bool {
    mx[0] = -CUDART_INF_F;
    mx[1] = -CUDART_INF_F;
    if (p.scale_log2 > 0.0f && *reinterpret_cast<const std::uint32_t*>(mask_any_s + buf * 4) == 0u) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        mx[h] *= p.scale_log2;
      }
      return true;
    }
    const float* mk = mask_s + buf * 64 + 2 * t;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float2 b = *reinterpret_cast<const float2*>(mk + 8 * n);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s[4 * n + 2 * h] = fmaf(s[4 * n + 2 * h], p.scale_log2, b.x);
        s[4 * n + 2 * h + 1] = fmaf(s[4 * n + 2 * h + 1], p.scale_log2, b.y);
        mx[h] = fmaxf(mx[h], fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    return false;
  };
  // P = exp2(s - m_new) in place (exp2(s * scale_log2 - m_new) where `folded`); O and l rescaled
  // by exp2(m_run - m_new); m_run = m_new.
  auto softmax_update = [&](const float (&m_new)[2], bool folded) {
    float alpha[2];
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) alpha[h] = fast_exp2(m_run[h] - m_new[h]);
    if (folded) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int h = (i >> 1) & 1;
        s[i] = fast_exp2(fmaf(s[i], p.scale_log2, -m_new[h]));
        sum[h] += s[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int h = (i >> 1) & 1;
        s[i] = fast_exp2(s[i] - m_new[h]);
        sum[h] += s[i];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] = fmaf(l_run[h], alpha[h], sum[h]);
      m_run[h] = m_new[h];
    }
    rescale_o(alpha);
  };
  // A P V product over kv rows 0-63 (k-steps kk = 0..3, rows 16 kk ..) as two wgmma groups, rows
  // 0-31 then 32-63, so that the first part of the half can be released before the second.
  // `a` receives P as the A fragments (what the P panel stores too: store_a_frags_panel).
  auto pv_rs = [&](std::uint32_t va, std::uint32_t (&a)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) acc_to_a_frag(s, kk, a[kk]);
    // Pin every register write (A fragments, rescaled O) before the fence, so none is scheduled
    // past it (ptxas would then inject a warpgroup.arrive of its own).
    reg_fence(a);
    reg_fence(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (kSplitDv) {
        wgmma_m64n128k16_rs_tb(o, a[kk], desc_mnmajor(va, kk, kVLbo, kVSbo), 1);
      } else {
        wgmma_m64n256k16_rs_tb(o, a[kk], desc_mnmajor(va, kk, kVLbo, kVSbo), 1);
      }
      if (kk == 1) wgmma_commit();
    }
    wgmma_commit();
  };
  auto pv_ss = [&](std::uint32_t pa, std::uint32_t va) {
    reg_fence(o);
    reg_fence(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (kSplitDv) {
        wgmma_m64n128k16_ss_tb(o, desc_kmajor(pa, kk, 64), desc_mnmajor(va, kk, kVLbo, kVSbo), 1);
      } else {
        wgmma_m64n256k16_ss_tb(o, desc_kmajor(pa, kk, 64), desc_mnmajor(va, kk, kVLbo, kVSbo), 1);
      }
      if (kk == 1) wgmma_commit();
    }
    wgmma_commit();
  };

  // Each consumer waits for the Q half its first k-steps read; both halves have landed before
  // its first Q K^T completes, so before the epilogue stages out over the Q region.
  if (wg == 0) {
    // ---------------------------------------------------------------- WG0: blocks 2p (K0), cols 0..255
    if (n_pairs > 0) {
      mbar_wait(q_bar_left, 0);
      if (x == 0) SPG_WGMMA_TL(q_left, clock64());
      mbar_wait(full_bar(0, 0), 0);
      if (x == 0) SPG_WGMMA_TL(first_qk, clock64());
      fence_proxy_async();
      wgmma_fence();
      qk_steps(k0a, 0, 16, true);
      wgmma_commit();
      mbar_wait(q_bar_right, 0);
      mbar_wait(full_bar(0, 1), 0);
      fence_proxy_async();
      qk_steps(k0a, 16, L::kSteps, false);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(s);
    }
    for (int pair = 0; pair < n_pairs; ++pair) {
      const std::uint32_t ph = static_cast<std::uint32_t>(pair & 1);
      float mx[2];
      const bool folded = scale_mask_max(0, mx);
      float m_new[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_new[h] = next_ref(m_run[h], mx[h]);
        m_true[h] = fmaxf(m_true[h], mx[h]);
      }
      softmax_update(m_new, folded);
      if (t == 0) {
        m0_s[r0] = m_new[0];
        m0_s[r0 + 8] = m_new[1];
      }
      named_barrier_arrive(kWgBarM0, 256);
      std::uint32_t pa[4][4];
      pv_rs(k0a + vcol, pa);  // O += P0 V0[:, 0:256] (split dv: this CTA's 128 of them)
      wgmma_wait<1>();
      mbar_arrive(empty_bar(0, 0));  // rows 0-31 of K0's left half
      wgmma_wait<0>();
      reg_fence(o);
      mbar_arrive(empty_hi_bar(0, 0));
      named_barrier(kWgBarM1, 256);
      float f[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m1 = m1_s[r0 + 8 * h];
        f[h] = fast_exp2(m_run[h] - m1);
        m_run[h] = m1;
        l_run[h] *= f[h];
      }
      // P0 relative to m1, for WG1. With the lazy reference m1 is nearly always m0, so a warp
      // whose factors are all exactly 1 stores P0 as it is (the same bits) and skips O's rescale.
      const bool f_ones = __all_sync(0xffffffffu, f[0] == 1.0f && f[1] == 1.0f);
      if (f_ones) {
        store_a_frags_panel(s0a, pa, x);
      } else {
        store_acc_panel(s0a, s, x, f[0], f[1]);
      }
      fence_proxy_async();
      // d_qk 576: P0 sits in K0's rope panel; this thread's store (and its Q K0^T reads of the
      // half, complete at the wait above) come before the producer's next fill of the half.
      if constexpr (D == 576) {
        mbar_arrive(empty_bar(0, 1));
        mbar_arrive(empty_hi_bar(0, 1));  // P0 spans all 64 rows of the rope panel
      }
      named_barrier_arrive(kWgBarS0, 256);
      if (!f_ones) rescale_o_by(f);
      named_barrier(kWgBarS1, 256);
      mbar_wait(full_bar(1, 0), ph);
      fence_proxy_async();
      pv_ss(s1a, k1a + vcol);  // O += P1 V1[:, 0:256]
      if (pair + 1 < n_pairs) {
        // The next pair's S0 = Q K0^T overlaps the P1 V1 product.
        mbar_wait(full_bar(0, 0), ph ^ 1u);
        fence_proxy_async();
        qk_steps(k0a, 0, 16, true);
        wgmma_commit();
        wgmma_wait<2>();
        mbar_arrive(empty_bar(1, 0));  // rows 0-31 of K1's left half
        wgmma_wait<1>();
        reg_fence(o);
        mbar_arrive(empty_hi_bar(1, 0));
        mbar_wait(full_bar(0, 1), ph ^ 1u);
        fence_proxy_async();
        qk_steps(k0a, 16, L::kSteps, false);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
      } else {
        wgmma_wait<1>();
        mbar_arrive(empty_bar(1, 0));
        wgmma_wait<0>();
        reg_fence(o);
        mbar_arrive(empty_hi_bar(1, 0));
      }
    }
  } else {
    // ---------------------------------------------------------------- WG1: blocks 2p+1 (K1), cols 256..511
    for (int pair = 0; pair < n_pairs; ++pair) {
      const std::uint32_t ph = static_cast<std::uint32_t>(pair & 1);
      if (pair == 0) mbar_wait(q_bar_right, 0);
      mbar_wait(full_bar(1, 1), ph);
      fence_proxy_async();
      wgmma_fence();
      qk_steps(k1a, 16, L::kSteps, true);
      wgmma_commit();
      if (pair == 0) mbar_wait(q_bar_left, 0);
      mbar_wait(full_bar(1, 0), ph);
      fence_proxy_async();
      qk_steps(k1a, 0, 16, false);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(s);
      float mx[2];
      const bool folded = scale_mask_max(1, mx);
      named_barrier(kWgBarM0, 256);
      float m_new[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m0 = m0_s[r0 + 8 * h];  // m0 >= m_run
        m_new[h] = next_ref(m0, mx[h]);
        m_true[h] = fmaxf(m_true[h], mx[h]);
      }
      softmax_update(m_new, folded);
      if (t == 0) {
        m1_s[r0] = m_new[0];
        m1_s[r0 + 8] = m_new[1];
      }
      named_barrier_arrive(kWgBarM1, 256);
      std::uint32_t pa[4][4];
      pv_rs(k1a + 4 * 8192 + vcol, pa);  // O += P1 V1[:, 256:512]
      store_a_frags_panel(s1a, pa, x);  // P1 as packed for the product (the same bits)
      // P0 V0 is issued before P1 is announced, so it queues on the tensor cores ahead of WG0's
      // P1 V1 and K0's right half (the next Q K0^T's) is released sooner. The fence covers both
      // the P1 panel (for WG0's product) and K0's right half (for this one).
      named_barrier(kWgBarS0, 256);
      mbar_wait(full_bar(0, 1), ph);
      fence_proxy_async();
      pv_ss(s0a, k0a + 4 * 8192 + vcol);  // O += P0 V0[:, 256:512]
      named_barrier_arrive(kWgBarS1, 256);
      // Groups: P1 V1 rows 0-31, 32-63, then P0 V0 rows 0-31, 32-63. At d_qk 576 K0's right
      // half holds P0 in all its rows, so both its parts wait for the whole P0 V0 product (and
      // take WG0's arrivals after its P0 store).
      wgmma_wait<3>();
      mbar_arrive(empty_bar(1, 1));
      wgmma_wait<2>();
      mbar_arrive(empty_hi_bar(1, 1));
      if constexpr (D != 576) {
        wgmma_wait<1>();
        mbar_arrive(empty_bar(0, 1));
      }
      wgmma_wait<0>();
      reg_fence(o);
      if constexpr (D == 576) mbar_arrive(empty_bar(0, 1));
      mbar_arrive(empty_hi_bar(0, 1));
    }
  }

  if (x == 0) SPG_WGMMA_TL(last_pv[wg], clock64());
  // ------------------------------------------------------------------ epilogue (both consumer WGs)
  float* l_s = reinterpret_cast<float*>(sm + L::kOffL);
  float lq[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lq[h] = l_run[h];
    lq[h] += __shfl_xor_sync(0xffffffffu, lq[h], 1);
    lq[h] += __shfl_xor_sync(0xffffffffu, lq[h], 2);
  }
  // Each warpgroup's true row max goes to its own m panel: the other warpgroup read the panel's
  // last value before it arrived at a barrier this one waited at in its last pair (M1 for m0,
  // S0 for m1), so nothing still reads it.
  float* const mt_own = wg == 0 ? m0_s : m1_s;
  float* const mt_other = wg == 0 ? m1_s : m0_s;
  if (t == 0) {
    l_s[wg * 64 + r0] = lq[0];
    l_s[wg * 64 + r0 + 8] = lq[1];
    mt_own[r0] = m_true[0];
    mt_own[r0 + 8] = m_true[1];
  }
  named_barrier(kWgBarL, 256);
  if (x == 0 && wg == 0) SPG_WGMMA_TL(epi_sync, clock64());
  const std::int64_t row0 = static_cast<std::int64_t>(token) * p.h_q + head0;
  float l_row[2];  // the row sums of both warpgroups' blocks
#pragma unroll
  for (int h = 0; h < 2; ++h) l_row[h] = lq[h] + l_s[(wg ^ 1) * 64 + r0 + 8 * h];
  float m_max[2];  // the rows' true max over both warpgroups' blocks (m_run is the reference)
#pragma unroll
  for (int h = 0; h < 2; ++h) m_max[h] = fmaxf(m_true[h], mt_other[r0 + 8 * h]);
  if (!kSplitDv && p.write_partials) {
    // The slice's unnormalized fp32 O and (m, l); the merge kernel weighs the slices. A quad
    // stores 32 contiguous bytes of a row.
    const std::int64_t prow0 = it.split * static_cast<std::int64_t>(p.s_q) * p.h_q + row0;
    // The partials relative to the true max, which the merge takes for max_logits (a row with
    // no valid entry keeps its reference: the merge skips it).
    float c[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      c[h] = l_row[h] > 0.0f ? fast_exp2(m_run[h] - m_max[h]) : 1.0f;
      if (!(l_row[h] > 0.0f)) m_max[h] = m_run[h];
      l_row[h] *= c[h];
    }
    rescale_o(c);
    if (wg == 0 && t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) p.part_ml[prow0 + r0 + 8 * h] = make_float2(m_max[h], l_row[h]);
    }
    float* po = p.part_o + prow0 * 512 + wg * 256 + 2 * t;
#pragma unroll
    for (int n = 0; n < kORegs / 4; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(po + (r0 + 8 * h) * 512 + 8 * n) = make_float2(o[4 * n + 2 * h], o[4 * n + 2 * h + 1]);
    return;
  }
  float inv[2];
#ifdef SPGRAPH_WGMMA_LATE_STATS
  RowFinal late[2];  // stored after the output panels (the switch below)
#endif
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    RowFinal fin = finalize_row_log2_sink(m_run[h], l_row[h], sink_log2[h]);
    if (l_row[h] > 0.0f) fin.max_logit = m_max[h] * kLn2;  // the true max (lse, inv: the reference)
    inv[h] = fin.inv;
#ifdef SPGRAPH_WGMMA_LATE_STATS
    late[h] = fin;
    (void)r;
#else
    if (wg == 0 && t == 0 && dv_half == 0) {
      p.max_logits[row0 + static_cast<std::int64_t>(row_base) * p.h_q + r] = fin.max_logit;
      p.lse[row0 + static_cast<std::int64_t>(row_base) * p.h_q + r] = fin.lse;
    }
#endif
  }
  // bf16 out: stmatrix into the Q region, free now (each WG passed a barrier the other arrives
  // at after its last wgmma), as four 128B-swizzled [64 rows x 64 columns] panels per warpgroup
  // (the eight rows of a stmatrix tile land in distinct banks), then one TMA store per panel.
  static_assert(2 * 4 * 8192 <= L::kOffK0, "output staging must fit in the Q region");
  const std::uint32_t stg = sb + L::kOffQ + static_cast<std::uint32_t>(wg) * 4 * 8192;
  // This lane addresses row lane % 8 of stmatrix tile lane / 8; tiles (8-column group, row half)
  // of step j: (2j, 0), (2j, 1), (2j + 1, 0), (2j + 1, 1). Group 2j + half sits in panel j / 4 as
  // chunk (2 (j % 4) + half) ^ (row % 8) = ((half ^ lane % 8) ^ 2 (j % 4)): the lane's chunk of
  // step 0, with j % 4 XORed into bits 5-6 of the (128-byte aligned) row address.
  const int tile = lane >> 3;
  const std::uint32_t lane_base = stg + static_cast<std::uint32_t>(16 * w + (lane & 7) + 8 * (tile & 1)) * 128 +
                                  static_cast<std::uint32_t>(((tile >> 1) ^ (lane & 7)) << 4);
  // Each panel's TMA store is issued as soon as its four stmatrix steps are written, so the stores
  // of the first panels overlap the staging of the next (issue 15 round 12: 0.5-2% on every row
  // but V32, where the CTA's end is the smallest share; docs/benchmark_history.md).
  const std::uint64_t policy = wgmma_once_row_policy();  // out rows are not read again here
#pragma unroll
  for (int pn = 0; pn < kCols / 64; ++pn) {
#pragma unroll
    for (int j = 4 * pn; j < 4 * pn + 4; ++j) {
      stmatrix_x4((lane_base ^ static_cast<std::uint32_t>((j & 3) << 5)) + (j >> 2) * 8192,
                  pack_bf16(o[8 * j] * inv[0], o[8 * j + 1] * inv[0]),
                  pack_bf16(o[8 * j + 2] * inv[1], o[8 * j + 3] * inv[1]),
                  pack_bf16(o[8 * j + 4] * inv[0], o[8 * j + 5] * inv[0]),
                  pack_bf16(o[8 * j + 6] * inv[1], o[8 * j + 7] * inv[1]));
    }
    fence_proxy_async();  // this panel's stmatrix writes, visible to the TMA engine
    named_barrier(kWgBarEpi0 + wg, 128);
    if (x == 0 && wg == 0) SPG_WGMMA_TL(epi_panel[pn], clock64());
    if (x == 0) {
      tma_store_box(&out_map, stg + pn * 8192, wg * 256 + dv_half * 128 + pn * 64, head0, row_base + token, policy);
    }
  }
#ifdef SPGRAPH_WGMMA_LATE_STATS
  // A/B switch (issue 15 round 25): the rows' max_logits and lse stored after the last panel's
  // barrier. Each panel's proxy fence compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S (sm_90a
  // SASS), so global stores issued before the first panel may be waited for there, on the tail.
  if (wg == 0 && t == 0 && dv_half == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::int64_t row = row0 + static_cast<std::int64_t>(row_base) * p.h_q + r0 + 8 * h;
      p.max_logits[row] = late[h].max_logit;
      p.lse[row] = late[h].lse;
    }
  }
#endif
  if (x == 0) {
    bulk_commit();
    if (wg == 0) SPG_WGMMA_TL(epi_issued, clock64());
#ifdef SPGRAPH_WGMMA_NO_STORE_WAIT
    // A/B switch (issue 15 round 23), a diagnostic: the CTA ends without waiting for its stores to
    // read the staging (FlashMLA's kernel does not wait); not a shipping form.
#else
    bulk_wait_read();  // the staging must outlive the copies' reads
#endif
  }
#ifdef SPGRAPH_WGMMA_TIMELINE
  if (x == 0) {
    SPG_WGMMA_TL(end[wg], clock64());
    if (wg == 0) SPG_WGMMA_TL(gt_end, wgmma_global_ns());
  }
#endif
}


}  // namespace spg::kernels::detail
