// The cost model SparseMlaPath::automatic picks the wgmma kernel's top-k split with: host-only
// arithmetic on the static shape and the SM count (no device call), so the CPU tests check its
// choices. The model, its constants and the rows they were fitted on: docs/benchmark_history.md,
// "Split top-k".
#pragma once

#include <algorithm>
#include <cstdint>

namespace spg::kernels::detail {

/// Time of one wgmma attention call, in µs on the H200 (fitted to table A's small rows,
/// sustained, one-shot `SparseMla::run`; docs/benchmark_history.md, "Split top-k"):
///
///   T(slices of k blocks, C CTAs) = call + b k + (ceil(C / SMs) - 1) (cta + b k)
///                                   [+ merge + merge_per_mb * partial MB, when split]
///
/// k counts the blocks a slice runs (a slice holds whole pairs: an odd tail costs a block too),
/// b scales with (d_qk + 512) / 1024 (Q K^T reads d_qk columns, P V 512). A CTA of a later wave
/// pays `cta` again (its start and end); the first wave's is inside `call`, with the launch.
/// The value columns split over two CTAs per item (SparseMlaPath::split_dv) are twice the CTAs,
/// each block at `split_dv_block` times b (Q K^T in full, half of P V: 3/4 of the tensor work,
/// the gather whole), with no merge.
struct SplitCostModel {
  double call_us = 9.4;          ///< a call's fixed time: launch, first wave's CTA start and end
  double block_us = 1.71;        ///< one 64-row block of one CTA, d_qk 512
  double cta_us = 8.0;           ///< a CTA's start and end in a later wave
  double merge_us = 3.9;         ///< the merge kernel's fixed cost (its launch, the partials' latency)
  double merge_us_per_mb = 0.41; ///< per MB of fp32 partials (written by the slices, read by the merge)
  /// A split-dv CTA's block against the single pass's: predicted 0.8 before it ran; measured
  /// 0.86-0.92 against the single pass in the same runs on five one-wave small rows (their
  /// median 0.90; docs/benchmark_history.md, "Issue 15 round 15").
  double split_dv_block = 0.9;
  /// A split must save more than this over the single pass: the fit's error on the rows it was
  /// fitted on is under 1 µs.
  double min_saving_us = 1.0;
};

/// The predicted time of `items` (token, 64 heads) items of `pairs` block pairs each, run in
/// slices of `pairs_per_slice` pairs (pairs_per_slice >= pairs: the single pass, no merge).
constexpr double split_time_us(std::int64_t items, int pairs, int pairs_per_slice, int sms, int d_qk,
                               const SplitCostModel& m = {}) noexcept {
  const int pps = std::max(1, std::min(pairs_per_slice, pairs));
  const std::int64_t slices = (pairs + pps - 1) / pps;
  const std::int64_t ctas = items * slices;
  const std::int64_t waves = sms > 0 ? (ctas + sms - 1) / sms : ctas;
  const double b = m.block_us * (d_qk + 512) / 1024.0;
  const double cta_time = b * 2.0 * pps;
  double t = m.call_us + cta_time + static_cast<double>(std::max<std::int64_t>(waves - 1, 0)) * (m.cta_us + cta_time);
  if (slices > 1) {
    // fp32 O (512 columns) and (m, l) per row (64 per item) and slice
    const double mb = static_cast<double>(items) * 64.0 * static_cast<double>(slices) * (512.0 * 4.0 + 8.0) / 1e6;
    t += m.merge_us + m.merge_us_per_mb * mb;
  }
  return t;
}

/// Pairs per slice that `automatic` runs: the model's fastest slicing, if it beats the single
/// pass by more than `min_saving_us`; otherwise `pairs` (the single pass). Slicings considered:
/// every distinct ceil(pairs / n) for n slices while items * n stays within four waves (more
/// slices only add waves).
constexpr int automatic_pairs_per_slice(std::int64_t items, int pairs, int sms, int d_qk, const SplitCostModel& m = {}) noexcept {
  if (items <= 0 || pairs <= 1 || sms <= 0) return std::max(pairs, 1);
  const double single = split_time_us(items, pairs, pairs, sms, d_qk, m);
  double best = single - m.min_saving_us;
  int best_pps = pairs;
  const std::int64_t max_slices = std::min<std::int64_t>(pairs, std::max<std::int64_t>(1, 4 * std::int64_t{sms} / items));
  int last_pps = pairs;
  for (std::int64_t n = 2; n <= max_slices; ++n) {
    const int pps = static_cast<int>((pairs + n - 1) / n);
    if (pps == last_pps) continue;
    last_pps = pps;
    const double t = split_time_us(items, pairs, pps, sms, d_qk, m);
    if (t < best) {
      best = t;
      best_pps = pps;
    }
  }
  return best_pps;
}

/// The predicted time of `items` items of `pairs` block pairs each as a single pass with the
/// value columns split over two CTAs per item: a single pass of twice the items, each block at
/// `split_dv_block` of the single pass's.
constexpr double split_dv_time_us(std::int64_t items, int pairs, int sms, int d_qk, const SplitCostModel& m = {}) noexcept {
  SplitCostModel halves = m;
  halves.block_us = m.block_us * m.split_dv_block;
  return split_time_us(2 * items, pairs, pairs, sms, d_qk, halves);
}

/// Whether `automatic` splits the value columns instead of running `pairs_per_slice` pairs a slice
/// (automatic_pairs_per_slice's choice; `pairs` for the single pass): the split-dv pass must beat
/// both the single pass and that slicing by more than `min_saving_us` (h_q 128 s_q 32, priced
/// 3 µs under the slices with the predicted 0.8, measured 0.5 µs over them).
constexpr bool automatic_split_dv(std::int64_t items, int pairs, int pairs_per_slice, int sms, int d_qk,
                                  const SplitCostModel& m = {}) noexcept {
  if (items <= 0 || sms <= 0) return false;
  const double other = std::min(split_time_us(items, pairs, pairs, sms, d_qk, m),
                                split_time_us(items, pairs, pairs_per_slice, sms, d_qk, m));
  return split_dv_time_us(items, pairs, sms, d_qk, m) < other - m.min_saving_us;
}

/// Whether the kv rows a call may gather, s_kv rows of kv_row_stride bf16 elements, fit in
/// 1 / `share` of the L2 (l2_bytes 0, not known: yes). Only while they do does the wgmma kernel
/// bring rows into L2 ahead of their use (issue 15 rounds 19 and 20): past it, what they bring
/// in displaces kv rows that later gathers miss on.
constexpr bool kv_rows_fit_l2(std::int64_t s_kv, std::int64_t kv_row_stride, std::int64_t l2_bytes, int share) noexcept {
  return l2_bytes <= 0 || share * s_kv * kv_row_stride * 2 <= l2_bytes;
}

/// The share of L2 the kv rows may fill while each CTA prefetches the Q rows of the CTA one wave
/// later (64 KB each, a wave's 8.4 MB on 132 SMs). On the H200 (50 MiB; docs/benchmark_history.md)
/// the prefetch against none on the same rows: 0.3-1.6% faster with 8 and 12 MiB of kv rows, a
/// tie at 16 MiB, 0.2-1.2% slower at 20-28 MiB and 0.3-1.6% slower on table A's rows of 32 MiB
/// and more.
inline constexpr int kQRowsPrefetchL2Share = 3;
/// The share of L2 the kv rows may fill while the kv gathers' copies prefetch 256 bytes into L2
/// on a miss (else only the sectors they read). On the H200, without the prefetch against with
/// it: 0.2-0.9% slower on most rows of 8-9 MiB of kv rows, 0-0.7% faster at 12 and 16 MiB,
/// 0.4-1.6% at 24 MiB, and -0.6 to +1.5% (about +0.5% typical) on table A's rows of 32 MiB and
/// more.
inline constexpr int kKvL2PrefetchL2Share = 5;

}  // namespace spg::kernels::detail
