// Chunk metadata helpers and bucket choice: see chunk_plan.hpp.
#include "scheduler/chunk_plan.hpp"

#include <algorithm>

#include "memory/error.hpp"

namespace spg::scheduler {

int ChunkPlan::n_rows(int ratio) const noexcept {
  if (ratio <= 1) {
    return 0;
  }
  int n = 0;
  for (const std::int32_t s : seq_lens) {
    n = std::max(n, static_cast<int>(s) / ratio);
  }
  return n;
}

int ChunkPlan::m_rows(int ratio) const noexcept {
  int g = 0;
  for (const std::int32_t s : gather_lens) {
    g = std::max(g, static_cast<int>(s));
  }
  return n_rows(ratio) + g;
}

const ChunkCachePlan& ChunkPlan::cache(int ratio) const {
  const auto it =
      std::find_if(caches.begin(), caches.end(), [ratio](const ChunkCachePlan& c) { return c.ratio == ratio; });
  SPG_EXPECTS(it != caches.end(), "ratio = " << ratio << " has no cache in this layer program");
  return *it;
}

namespace {

void validate_list(std::span<const int> list, const char* name) {
  SPG_EXPECTS(!list.empty(), name << " is empty: at least one bucket is needed");
  for (std::size_t i = 0; i < list.size(); ++i) {
    SPG_EXPECTS(list[i] >= 1, name << "[" << i << "] = " << list[i] << " must be at least 1");
    SPG_EXPECTS(i == 0 || list[i] > list[i - 1], name << "[" << i << "] = " << list[i] << " must be greater than "
                                                      << name << "[" << i - 1 << "] = " << list[i - 1]
                                                      << " (the list must be strictly ascending)");
  }
}

// The least entry >= need, or -1.
int smallest_holding(std::span<const int> list, int need) noexcept {
  const auto it = std::lower_bound(list.begin(), list.end(), need);
  return it == list.end() ? -1 : *it;
}

}  // namespace

void validate_buckets(std::span<const int> request_buckets, std::span<const int> token_buckets) {
  validate_list(request_buckets, "request buckets");
  validate_list(token_buckets, "token buckets");
}

std::optional<Bucket> find_bucket(std::span<const int> request_buckets, std::span<const int> token_buckets,
                                  int num_requests, int num_tokens) noexcept {
  const int r = smallest_holding(request_buckets, num_requests);
  const int t = smallest_holding(token_buckets, num_tokens);
  if (r < 0 || t < 0) {
    return std::nullopt;
  }
  return Bucket{r, t};
}

Bucket choose_bucket(std::span<const int> request_buckets, std::span<const int> token_buckets,
                     const ChunkPlan& chunk) {
  const std::optional<Bucket> b = find_bucket(request_buckets, token_buckets, chunk.num_requests, chunk.num_tokens);
  SPG_EXPECTS_AS(CapacityError, b.has_value(),
                 "no bucket holds a chunk of " << chunk.num_requests << " requests and " << chunk.num_tokens
                                               << " tokens: the largest buckets are R = "
                                               << (request_buckets.empty() ? 0 : request_buckets.back())
                                               << " and T = " << (token_buckets.empty() ? 0 : token_buckets.back()));
  return *b;
}

}  // namespace spg::scheduler
