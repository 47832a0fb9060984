// Table A's CTA timelines (A/B builds with SPGRAPH_WGMMA_TIMELINE; wgmma_timeline.hpp): the
// records of one launch summed up as the medians of each CTA's phases and of the gap between a
// CTA's end and the next CTA's start on the same SM. Host-only arithmetic, tested on the CPU.
#pragma once

#include <cstddef>
#include <span>

#include "spgraph/kernels/sparse_mla/wgmma_timeline.hpp"

namespace spg::bench {

/// Medians over the CTAs (SM clock cycles, but sm_mhz); NaN where nothing was counted.
struct TimelineSummary {
  std::size_t ctas{0};      ///< records with every point set (the others are skipped)
  std::size_t gaps{0};      ///< pairs of CTAs that ran one after the other on an SM
  std::size_t overlaps{0};  ///< pairs whose second CTA started before the first ended (a bad record)
  double start{0};          ///< CTA start to WG0's first Q K^T (Q's left half and the first blocks)
  double loop{0};           ///< first Q K^T to the later warpgroup's last P V
  double tail{0};           ///< last P V to the later warpgroup's end (the epilogue and its stores)
  double cta{0};            ///< start to end
  double gap{0};            ///< an SM's CTA end to its next CTA's start
  double producer_slack{0}; ///< the producer's last fill issued to the last P V
  double sm_mhz{0};         ///< clock64 cycles over global-timer time, start to WG0's end
  // The start and the tail in parts (NaN where a record lacks them: builds before round 24)
  double first_fill{0};     ///< CTA start to the producer's first gathers issued (the first indices back)
  double q_left{0};         ///< CTA start to WG0 holding Q's left half
  double epi_sync{0};       ///< last P V to WG0 past the row-sum barrier
  double epi_stage{0};      ///< that barrier to WG0's last out store issued (finalize, staging, issue)
  double epi_drain{0};      ///< WG0's last store issued to its end (the stores' reads of the staging)
  // A CTA's gap in parts (NaN where a record lacks its entry: builds before 2026-12-08's)
  double setup{0};          ///< kernel entry to the CTA start (barrier set-up, griddepcontrol.wait, __syncthreads)
  double launch_gap{0};     ///< an SM's CTA end to its next CTA's entry (the hardware's part of the gap)
  // The epilogue's panels (NaN where a record lacks them: builds before 2026-12-08's)
  double epi_first_panel{0};  ///< the row-sum barrier to WG0's first panel staged (finalize, first staging)
  double epi_per_panel{0};    ///< WG0's first panel staged to its last, over the panels between (a panel's staging)
  // Which warpgroup ends the CTA (the tail's parts are WG0's)
  double end_skew{0};         ///< WG1's end minus WG0's (negative: WG0 ends last)
  double wg1_ends_last{0};    ///< the share of CTAs whose WG1 ends after WG0
};

/// Sums up one launch's records (any order; the SM of each record is its smid).
[[nodiscard]] TimelineSummary summarize_timeline(std::span<const kernels::WgmmaTimelineRecord> records);

}  // namespace spg::bench
