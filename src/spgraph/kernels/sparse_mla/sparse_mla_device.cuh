// Device pieces both sparse MLA attention kernels share: the launch parameters, the log2-domain
// constants, small shared-memory and numeric helpers, and the per-row finalization of the softmax
// statistics (max_logits, lse, and the factor that turns the unnormalized accumulator into out).
// Formulas: docs/pipeline.md, "Sparse attention semantics".
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

namespace spg::kernels::detail {

/// Parameters of both attention kernels (the wgmma single pass reads the fields up to `lse`).
struct SparseMlaParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* kv;
  std::int64_t kv_row_stride;
  int s_kv;
  const std::int32_t* indices;
  int topk;
  const std::int32_t* topk_length;
  const float* attn_sink;
  const std::int32_t* num_tokens;
  int s_q;
  int h_q;
  float scale_log2;  ///< sm_scale * log2(e)
  __nv_bfloat16* out;
  float* max_logits;
  float* lse;
  int num_splits;        ///< top-k slices per (token, 64 heads)
  int blocks_per_split;  ///< 64-row blocks per slice
  int num_items;         ///< s_q * (h_q / 64) * num_splits * dv_parts
  bool write_partials;   ///< split path: write unnormalized O, m and l to the workspace
  float* part_o;         ///< [num_splits, s_q * h_q, 512]
  float2* part_ml;       ///< [num_splits, s_q * h_q]: (running max in log2 units, sum of exp2)
  /// wgmma: a CTA prefetches into L2 the first indices, and with prefetch_q_rows the Q rows, of
  /// the item this many on (0: none); prefetch_q_rows from kv_rows_fit_l2 and kQRowsPrefetchL2Share.
  int q_prefetch_ahead;
  bool prefetch_q_rows;
  /// wgmma: the kv gathers' copies prefetch 256 bytes into L2 on a miss (else only the sectors
  /// they read); from kv_rows_fit_l2 and kKvL2PrefetchL2Share (split_cost.hpp).
  bool kv_l2_prefetch;
  /// CTAs per item: 2 for the wgmma kernel with the value columns split (SparseMlaKernel::
  /// wgmma_split_dv: its template argument; each CTA writes 256 of the 512), else 1. num_items
  /// counts CTAs: s_q * (h_q / 64) * num_splits * dv_parts.
  int dv_parts;
  std::int64_t q_token_stride;    ///< elements between tokens of q (resolved: never 0)
  std::int64_t out_token_stride;  ///< elements between tokens of out (resolved: never 0)
  const std::int32_t* token_offset;  ///< a chunk of a step: its first row of q and the outputs (null: 0)
#ifdef SPGRAPH_WGMMA_Q_TMA
  /// A/B switch (issue 15 round 23): q as a 3-D tensor {d_qk columns, h_q heads, tokens} for the
  /// wgmma kernel's Q loads, one TMA box of 64 columns of 64 heads per panel.
  CUtensorMap q_map;
#endif
#ifdef SPGRAPH_WGMMA_KV_PERSIST
  /// A/B switch (issue 15 round 23): the fraction of the kv rows' addresses gathered evict-last,
  /// the persisting set-aside of L2 over the kv rows' bytes, in (0, 1] (1 with none set aside).
  float kv_persist_fraction;
#endif
};

/// A chunk of a step (token_offset set): the first row of its tokens in q and the outputs; else 0.
__device__ __forceinline__ int step_row_base(const std::int32_t* token_offset) {
  return token_offset != nullptr ? __ldg(token_offset) : 0;
}

/// Token `token`'s row of the index matrix (topk entries).
__device__ __forceinline__ const std::int32_t* index_row(const SparseMlaParams& p, int token) {
  return p.indices + static_cast<std::int64_t>(token) * p.topk;
}

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// Programmatic dependent launch: waits until the grids this one depends on have completed and
/// their memory is visible (returns at once when the launch did not allow an early start).
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/// bar.sync on named barrier `id` (1..15; 0 is __syncthreads) for `count` threads.
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

/// Final statistics of one (token, head) from its running max m (log2 units) and sum l:
/// max_logits, lse (natural log, sink excluded) and the factor that turns the unnormalized
/// accumulator into out (0 for an empty row or a +inf sink).
struct RowFinal {
  float max_logit;
  float lse;
  float inv;
};
/// `sink_log2` is the head's attn_sink times log2(e), or -inf without a sink (exp2 of it adds an
/// exact 0 to the sum), so a kernel can load it long before its epilogue.
__device__ __forceinline__ RowFinal finalize_row_log2_sink(float m, float l, float sink_log2) {
  RowFinal r;
  if (l > 0.0f) {
    r.max_logit = m * kLn2;
    r.lse = (m + log2f(l)) * kLn2;
    r.inv = 1.0f / (l + exp2f(sink_log2 - m));
  } else {
    r.max_logit = -CUDART_INF_F;
    r.lse = CUDART_INF_F;
    r.inv = 0.0f;
  }
  return r;
}
__device__ __forceinline__ float sink_log2_of(const float* attn_sink, int head) {
  return attn_sink != nullptr ? attn_sink[head] * kLog2e : -CUDART_INF_F;
}
__device__ __forceinline__ RowFinal finalize_row(float m, float l, const float* attn_sink, int head) {
  return finalize_row_log2_sink(m, l, sink_log2_of(attn_sink, head));
}

}  // namespace spg::kernels::detail
