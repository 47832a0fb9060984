// Chunk metadata helpers and bucket choice: see chunk_plan.hpp.
#include "spgraph/scheduler/chunk_plan.hpp"

#include <algorithm>

#include "spgraph/core/error.hpp"

namespace spg::scheduler {

int ChunkPlan::n_rows(int ratio) const noexcept {
  int n = 0;
  for (const std::int32_t s : seq_lens) n = std::max(n, graphs::compressed_rows(s, ratio));
  return n;
}

int ChunkPlan::m_rows(int ratio) const noexcept {
  int g = 0;
  for (const std::int32_t s : gather_lens) g = std::max(g, static_cast<int>(s));
  return n_rows(ratio) + g;
}

const ChunkCachePlan& ChunkPlan::cache(int ratio) const {
  const auto it =
      std::find_if(caches.begin(), caches.end(), [ratio](const ChunkCachePlan& c) { return c.ratio == ratio; });
  SPG_EXPECTS(it != caches.end(), "ratio = " << ratio << " has no cache in this layer program");
  return *it;
}

const graphs::ChunkInput& ChunkPlan::input(bool slot_lists) const {
  request_inputs_.resize(static_cast<std::size_t>(num_requests));
  input_ = graphs::ChunkInput{};
  for (std::size_t b = 0; b < request_inputs_.size(); ++b) {
    graphs::RequestInput& r = request_inputs_[b];
    r = graphs::RequestInput{};
    r.query_len = query_lens[b];
    r.seq_len = seq_lens[b];
  }
  for (const ChunkCachePlan& c : caches) {
    const int i = graphs::ratio_index(c.ratio);
    for (std::size_t b = 0; b < request_inputs_.size(); ++b) {
      if (c.ratio == 1) {
        request_inputs_[b].swa_blocks = c.block_tables[b];
      } else {
        request_inputs_[b].compressed_blocks[i] = c.block_tables[b];
      }
    }
    if (!slot_lists) continue;
    if (c.ratio == 1) {
      input_.swa_slots = c.slot_mapping;
    } else {
      input_.compressed_slots[i] = c.slot_mapping;
    }
  }
  input_.requests = request_inputs_;
  return input_;
}

}  // namespace spg::scheduler
