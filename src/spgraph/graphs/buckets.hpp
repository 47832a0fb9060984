// Chunk-shape buckets: the (R_bucket, T_bucket) pairs a graph is captured for, and the O(1)
// lookup of the smallest bucket that holds a chunk (docs/graphs.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spg::graphs {

/// @brief The bucket sets of one executor and a precomputed lookup.
class BucketSet {
 public:
  /// Default sets: R in {1, 2, 4} up to max_requests (max_requests always included); T in powers
  /// of two and 1.5x steps from 16 up to max_tokens (max_tokens always included).
  static BucketSet make_default(int max_requests, int max_tokens);
  /// Explicit sets; each must be strictly increasing, positive, and end at the maximum.
  /// @throws InvalidArgument naming the offending list and value.
  BucketSet(std::vector<int> r_buckets, std::vector<int> t_buckets, int max_requests, int max_tokens);

  [[nodiscard]] const std::vector<int>& r_buckets() const noexcept { return r_; }
  [[nodiscard]] const std::vector<int>& t_buckets() const noexcept { return t_; }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(r_.size() * t_.size()); }
  /// Index of bucket (r index, t index) in [0, size()).
  [[nodiscard]] int index(int ri, int ti) const noexcept { return ri * static_cast<int>(t_.size()) + ti; }
  [[nodiscard]] int r_of(int bucket) const noexcept { return r_[static_cast<std::size_t>(bucket) / t_.size()]; }
  [[nodiscard]] int t_of(int bucket) const noexcept { return t_[static_cast<std::size_t>(bucket) % t_.size()]; }

  /// The smallest bucket holding `requests` and `tokens`, or -1 when none does. noexcept, O(1).
  [[nodiscard]] int lookup(int requests, int tokens) const noexcept {
    if (requests < 0 || tokens < 0 || requests >= static_cast<int>(r_index_.size()) ||
        tokens >= static_cast<int>(t_index_.size())) {
      return -1;
    }
    return index(r_index_[static_cast<std::size_t>(requests)], t_index_[static_cast<std::size_t>(tokens)]);
  }

  [[nodiscard]] std::string describe() const;

 private:
  std::vector<int> r_;
  std::vector<int> t_;
  std::vector<std::int16_t> r_index_;  // requests -> index of smallest R bucket >= requests
  std::vector<std::int16_t> t_index_;  // tokens -> index of smallest T bucket >= tokens
};

}  // namespace spg::graphs
