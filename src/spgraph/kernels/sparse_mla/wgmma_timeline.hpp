// Diagnostics of the wgmma attention kernel for A/B builds (issue 15 round 23): with
// SPGRAPH_WGMMA_TIMELINE defined for the library and for `bench`, every CTA of a launch records
// when its phases begin and end (its SM's clock64 and the global timer), and `bench` splits a
// CTA's time into its start, its block loop, its end and the gap to the next CTA on the same SM
// (samples/bench/timeline.hpp; docs/benchmark_history.md, "Issue 15 round 23"). No preset defines
// it: the shipped kernel records nothing. The record's layout is defined in every build, so the
// host-side summary is tested without it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace spg::kernels {

/// One CTA's timeline: its SM's clock64 at each point, except gt_* (%globaltimer, ns). A point the
/// CTA did not reach (an item without blocks, the split path's partials) stays 0.
struct WgmmaTimelineRecord {
  unsigned long long start;         ///< thread 0, past the barrier set-up and griddepcontrol.wait
  unsigned long long first_qk;      ///< WG0 holds Q's left half and K0's: its first Q K^T issues
  unsigned long long last_pv[2];    ///< each consumer warpgroup past its last P V product
  unsigned long long end[2];        ///< each consumer warpgroup's thread 0 done (its stores read)
  unsigned long long producer_end;  ///< the producer's last fill issued
  // The start and the tail in parts (round 24): where the first Q K^T waits, where the end goes.
  unsigned long long first_fill;    ///< producer thread 0: the first block's left-half gathers issued (its indices back)
  unsigned long long q_left;        ///< WG0's thread 0 past its wait for Q's left half
  unsigned long long epi_sync;      ///< WG0's thread 0 past the row-sum barrier (both warpgroups in the epilogue)
  unsigned long long epi_issued;    ///< WG0's thread 0: its last out store issued and committed
  unsigned long long gt_start;      ///< with start
  unsigned long long gt_end;        ///< with end[0]
  unsigned long long smid;
  // The gap to the CTA before it on its SM in parts, and the tail's staging by panel (round 24).
  unsigned long long entry;         ///< thread 0 at the kernel's entry, before the barrier set-up
  unsigned long long epi_panel[4];  ///< WG0's thread 0 past each output panel's staging barrier (its store issues next)
};

/// CTAs of a launch that record (the first ones by blockIdx.x).
inline constexpr int kWgmmaTimelineCtas = 1 << 17;

#ifdef SPGRAPH_WGMMA_TIMELINE
/// Copies the records of the last wgmma launch's first `count` CTAs (at most kWgmmaTimelineCtas)
/// to `dst` (host memory), synchronously.
cudaError_t read_wgmma_timeline(WgmmaTimelineRecord* dst, std::size_t count) noexcept;
/// Zeroes every record (stream-ordered), so a CTA of the next launch that skips a point (an item
/// without blocks) leaves it 0 instead of an earlier launch's value.
cudaError_t clear_wgmma_timeline(cudaStream_t stream) noexcept;
#endif

}  // namespace spg::kernels
