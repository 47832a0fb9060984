// Table A of docs/benchmarks.md: the sparse MLA attention kernel alone, on the shapes of the
// public sparse prefill benchmark (s_q 4096, attn_sink on) and on small chunks.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "samples/bench/report.hpp"

namespace spg::bench {

/// @brief What run_attention_benchmarks times.
struct AttentionOptions {
  bool quick{false};  ///< a subset of the rows, fewer repetitions
  /// Comma-separated parts of row names (e.g. "V4-C2/32768,sq256"): a row runs when its record
  /// name contains one of them; empty: every row.
  std::string rows;
  /// Time each kernel after 10 (small rows) or 3 warm-up calls and over 50 (20) calls, instead of
  /// after 25 ms of warm-up and over at least 100 ms.
  bool burst{false};
  /// Comma-separated SparseMlaPath names (automatic, single_pass, split_topk, single_pass_mma,
  /// split_topk_mma, split_dv) to time on every row, split and split-dv paths on the small chunks
  /// only, each kernel once per row; empty: the default set (automatic and the mma.sync single
  /// pass, and on small chunks also single_pass, split_topk, split_topk_mma and split_dv).
  std::string paths;
  /// Timing rounds per row; round r times the row's variants in turn starting from the r-th, and
  /// each variant's figure is the median of its rounds' medians.
  int rounds{1};
  /// How each timed call launches (between the two events of a sample): `oneshot`
  /// (SparseMla::run: plan, out's descriptor and launch on every call; the table of record),
  /// `prepared` (SparseMla::initialize once, then SparseMlaLaunch::run, as the pipeline's graphs
  /// and eager steps launch), `chain` (prepared, kChainLaunches launches back to back per sample,
  /// the sample divided by their count: the kernel's time without the idle GPU's launch latency),
  /// `gated` (prepared, one launch per sample, enqueued with the sample's events behind a gate
  /// kernel that the host opens once all three are enqueued: the sample holds the kernel's device
  /// time from an idle start and none of the host's launch, and the device idles between samples
  /// as long as one-shot lets it, not longer).
  /// Figures of the last three carry the variant suffix "+prepared" / "+chain" / "+gated".
  std::string launch{"oneshot"};
  /// Tokens of every row (s_q) instead of the row's own, 0 = the row's: the row is then named
  /// with its s_q ("V4-C1/8192/sq4092") and has no FlashMLA figure. For the wave probe: a
  /// single-pass grid of s_q * h_q / 64 CTAs that is a whole number of waves, or one more.
  int s_q{0};
  /// Rows of the kv cache (s_kv) of every row instead of the row's own, 0 = the row's: the row is
  /// then named with both ("V4-C1/8192/kv24576") and has no FlashMLA figure. For the L2 probe:
  /// where a call's kv rows stop fitting in L2 (sparse_mla's kv_rows_fit_l2).
  int s_kv{0};
  /// Top-k slices of the split paths (SparseMlaArgs::num_splits), 0 = the shape's choice.
  int num_splits{0};
  /// After timing each (row, variant): one more launch and an order-sensitive checksum of its
  /// out, max_logits and lse (kernels::Checksum), printed as "checksum ROW VARIANT 0x<16 hex>"
  /// and recorded as metrics "checksum_hi" / "checksum_lo" (its two 32-bit halves). The inputs
  /// are seeded, so a build that computes the same bits gives the same value in every run.
  bool checksum{false};
};

/// Launches per sample of AttentionOptions::launch "chain".
inline constexpr int kChainLaunches = 8;

/// @brief Times the rows of table A and records, per row, suite "attention", name
///        "<label>/<s_kv>" (e.g. "V4-C2/32768"; small chunks "<label>/<s_kv>/sq<s_q>"; "/kv<N>" appended
///        with AttentionOptions::s_kv), variant
///        "spgraph" (the automatic path) or "spgraph-<path>" (e.g. "spgraph-split-topk"),
///        metrics "gpu_us" and "tflops" (medians), "gpu_us_round<r>" (each round's median, with
///        several rounds), "kernel" (the kernels::SparseMlaKernel value of the plan that ran; the
///        table prints its name) and "num_splits" (FlashMLA's figures are constants, printed beside
///        each row and in the summary, never recorded as this run's measurements). Prints a line per
///        (row, variant) as it goes and a summary table last, between "== attention summary" and
///        "== end of attention summary", whose vs_auto column is the row's automatic time / the
///        variant's (the A/B ratio; above 1: faster than automatic). FLOPs = 2 * (valid indices)
///        * h_q * (d_qk + 512); inputs are seeded random values, indices random valid rows.
/// @throws CudaError / InvalidArgument from the device or the op; Error for an unknown path name.
void run_attention_benchmarks(Reporter& reporter, cudaStream_t stream, const AttentionOptions& options);

}  // namespace spg::bench
