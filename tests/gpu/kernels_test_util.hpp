// Host helpers for the kernel tests: guarded device arrays, chunk metadata on the device, graph
// capture of a launch (captured_launch.hpp), seeded random inputs, and bit-exact comparisons that name the worst element.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "gpu/captured_launch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/chunk.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::test {

/// Bytes of poison on each side of a guarded array; enough to catch a row or vector overrun.
inline constexpr std::size_t kGuardBytes = 4096;
inline constexpr std::uint8_t kGuardByte = 0xA5;

/// @brief `n` elements of T in device memory between two guard regions that must stay untouched.
template <class T>
class GuardedArray {
 public:
  explicit GuardedArray(std::size_t n) : n_(n), buffer_(n * sizeof(T) + 2 * kGuardBytes) {
    SPG_CUDA_TRY(cudaMemset(buffer_.data(), kGuardByte, buffer_.size()));
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }
  [[nodiscard]] T* get() const noexcept {
    return reinterpret_cast<T*>(static_cast<std::uint8_t*>(buffer_.data()) + kGuardBytes);
  }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return n_ * sizeof(T); }

  // The tests' streams are non-blocking: they do not wait for the legacy stream that cudaMemset
  // and pageable cudaMemcpy use, so each of these waits for its copy to land.
  void fill_bytes(std::uint8_t byte) const {
    SPG_CUDA_TRY(cudaMemset(get(), byte, bytes()));
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }
  void upload(const std::vector<T>& host) const {
    REQUIRE(host.size() == n_);
    SPG_CUDA_TRY(cudaMemcpy(get(), host.data(), bytes(), cudaMemcpyHostToDevice));
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> host(n_);
    SPG_CUDA_TRY(cudaMemcpy(host.data(), get(), bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Number of guard bytes that no longer hold the guard pattern.
  [[nodiscard]] std::size_t damaged_guard_bytes() const {
    std::vector<std::uint8_t> host(buffer_.size());
    SPG_CUDA_TRY(cudaMemcpy(host.data(), buffer_.data(), host.size(), cudaMemcpyDeviceToHost));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < kGuardBytes; ++i) bad += host[i] != kGuardByte;
    for (std::size_t i = host.size() - kGuardBytes; i < host.size(); ++i) bad += host[i] != kGuardByte;
    return bad;
  }

 private:
  std::size_t n_;
  core::DeviceBuffer buffer_;
};

/// @brief A chunk's metadata in one device block, rewritable between graph replays.
class DeviceChunk {
 public:
  explicit DeviceChunk(int requests_bucket)
      : requests_bucket_(requests_bucket),
        buffer_(sizeof(kernels::ChunkScalars) + sizeof(std::int32_t) * (3 * std::size_t(requests_bucket) + 1)) {}

  [[nodiscard]] kernels::ChunkArrays arrays() const noexcept {
    auto* base = static_cast<std::uint8_t*>(buffer_.data());
    auto* words = reinterpret_cast<std::int32_t*>(base + sizeof(kernels::ChunkScalars));
    return kernels::ChunkArrays{reinterpret_cast<const kernels::ChunkScalars*>(base), words,
                                words + requests_bucket_ + 1, words + 2 * requests_bucket_ + 1};
  }
  void write(const kernels::reference::HostChunk& c) const {
    REQUIRE(c.query_start_loc.size() == std::size_t(requests_bucket_) + 1);
    REQUIRE(c.seq_lens.size() == std::size_t(requests_bucket_));
    REQUIRE(c.gather_lens.size() == std::size_t(requests_bucket_));
    std::vector<std::uint8_t> host(buffer_.size());
    std::memcpy(host.data(), &c.scalars, sizeof c.scalars);
    auto* words = host.data() + sizeof c.scalars;
    std::memcpy(words, c.query_start_loc.data(), c.query_start_loc.size() * 4);
    std::memcpy(words + 4 * (requests_bucket_ + 1), c.seq_lens.data(), c.seq_lens.size() * 4);
    std::memcpy(words + 4 * (2 * requests_bucket_ + 1), c.gather_lens.data(), c.gather_lens.size() * 4);
    SPG_CUDA_TRY(cudaMemcpy(buffer_.data(), host.data(), host.size(), cudaMemcpyHostToDevice));
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }

 private:
  int requests_bucket_;
  core::DeviceBuffer buffer_;
};

/// @brief Metadata of a chunk as the scheduler would write it: query_start_loc from the query
///        lengths, gather_len = min(seq_len, query_len + W - 1), N = max(seq_len / r) (0 for
///        r = 1), M = N + max(gather_len) + m_slack; padded entries past the real requests.
inline kernels::reference::HostChunk make_chunk(const std::vector<int>& seq_lens, const std::vector<int>& query_lens,
                                                int requests_bucket, int r, int window, int m_slack = 0) {
  REQUIRE(seq_lens.size() == query_lens.size());
  REQUIRE(int(seq_lens.size()) <= requests_bucket);
  kernels::reference::HostChunk c;
  const int n = static_cast<int>(seq_lens.size());
  c.query_start_loc.assign(std::size_t(requests_bucket) + 1, 0);
  c.seq_lens.assign(std::size_t(requests_bucket), 0);
  c.gather_lens.assign(std::size_t(requests_bucket), 0);
  int tokens = 0;
  int max_rows = 0;
  int max_gather = 0;
  for (int b = 0; b < n; ++b) {
    c.query_start_loc[std::size_t(b)] = tokens;
    tokens += query_lens[std::size_t(b)];
    c.seq_lens[std::size_t(b)] = seq_lens[std::size_t(b)];
    c.gather_lens[std::size_t(b)] = std::min(seq_lens[std::size_t(b)], query_lens[std::size_t(b)] + window - 1);
    if (r > 1) max_rows = std::max(max_rows, seq_lens[std::size_t(b)] / r);
    max_gather = std::max(max_gather, c.gather_lens[std::size_t(b)]);
  }
  for (int b = n; b <= requests_bucket; ++b) c.query_start_loc[std::size_t(b)] = tokens;
  c.scalars = kernels::ChunkScalars{};
  c.scalars.num_requests = n;
  c.scalars.num_tokens = tokens;
  c.scalars.n_rows = max_rows;
  c.scalars.m_rows = max_rows + max_gather + m_slack;
  return c;
}

/// How a case launches its op: eagerly, or captured once and replayed on two metadata sets.
enum class LaunchMode { eager, graph };
inline const char* mode_name(LaunchMode m) { return m == LaunchMode::eager ? "eager" : "graph replay"; }

/// @brief First element where `got` differs from `want`, as a message; empty when all match.
template <class T>
std::string first_mismatch(const std::vector<T>& got, const std::vector<T>& want, std::size_t row_width,
                           const char* what) {
  if (got.size() != want.size()) return std::string(what) + ": sizes differ";
  std::size_t count = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      if (count == 0) first = i;
      ++count;
    }
  }
  if (count == 0) return {};
  std::ostringstream os;
  os << what << ": " << count << " elements differ; first at row " << first / row_width << ", column "
     << first % row_width << ": got 0x" << std::hex << +got[first] << ", want 0x" << +want[first];
  return os.str();
}

/// @brief Checks a device StepStatus against a reference FaultLog: equal counts per kind, and the
///        device's first record is one of the reference's faults (or none when there are none).
inline void check_status(const kernels::StepStatus* device_status, const kernels::reference::FaultLog& log) {
  kernels::StepStatus s{};
  SPG_CUDA_TRY(cudaMemcpy(&s, device_status, sizeof s, cudaMemcpyDeviceToHost));
  for (int k = 0; k < kernels::kFaultKinds; ++k) {
    INFO("fault kind " << kernels::fault_name(static_cast<kernels::Fault>(k)));
    CHECK(s.counts[k] == log.counts[std::size_t(k)]);
  }
  if (log.records.empty()) {
    CHECK(s.recorded == 0U);
  } else {
    CHECK(s.recorded == 1U);
    INFO("first record: kind " << s.first.kind << ", request " << s.first.request << ", position " << s.first.position
                               << ", value " << s.first.value);
    CHECK(log.contains(s.first));
  }
}

/// @brief Random bf16 bits of a K row: normal values scaled per 64-value tile by 2^k, k in
///        [-20, 20], with some tiles below the 1e-4 amax floor; never zero rows.
inline std::vector<std::uint16_t> random_k_rows(std::mt19937& rng, std::size_t rows) {
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::uniform_int_distribution<int> tiny(0, 15);
  std::vector<std::uint16_t> out(rows * kernels::kKvDim);
  for (std::size_t r = 0; r < rows; ++r) {
    for (int t = 0; t < kernels::kKvDim / kernels::kKvTile; ++t) {
      const float scale = tiny(rng) == 0 ? 1e-6F : std::ldexp(1.0F, exponent(rng));
      for (int j = 0; j < kernels::kKvTile; ++j) {
        out[r * kernels::kKvDim + std::size_t(t * kernels::kKvTile + j)] =
            kernels::reference::bf16_round(normal(rng) * scale);
      }
    }
  }
  return out;
}

/// @brief Random cache bytes: data rows with no e4m3 NaN and finite RoPE values; scale bytes mostly
///        in the range real tiles produce, some at the extremes (0, 255); padding random.
inline std::vector<std::uint8_t> random_cache(std::mt19937& rng, const kernels::CacheLayout& layout) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> realistic(100, 150);
  std::normal_distribution<float> normal(0.0F, 2.0F);
  std::vector<std::uint8_t> out(layout.bytes());
  for (auto& b : out) b = static_cast<std::uint8_t>(byte(rng));
  for (std::int64_t s = 0; s < layout.capacity(); ++s) {
    std::uint8_t* data = out.data() + layout.row_offset(s);
    for (int j = 0; j < kernels::kKvNopeDim; ++j) {
      if ((data[j] & 0x7F) == 0x7F) data[j] = static_cast<std::uint8_t>(data[j] & 0xF0);
    }
    for (int j = 0; j < kernels::kKvRopeDim; ++j) {
      const std::uint16_t v = kernels::reference::bf16_round(normal(rng));
      data[kernels::kKvNopeDim + 2 * j] = static_cast<std::uint8_t>(v & 0xFF);
      data[kernels::kKvNopeDim + 2 * j + 1] = static_cast<std::uint8_t>(v >> 8);
    }
    std::uint8_t* scales = out.data() + layout.scale_offset(s);
    for (int t = 0; t < kernels::kKvTiles; ++t) {
      scales[t] = static_cast<std::uint8_t>(byte(rng) < 16 ? byte(rng) : realistic(rng));
    }
  }
  return out;
}

/// @brief A block table [requests, stride] of distinct random physical blocks of a cache.
inline std::vector<std::int32_t> random_block_table(std::mt19937& rng, int requests, int stride, int num_blocks) {
  REQUIRE(requests * stride <= num_blocks);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks));
  for (int i = 0; i < num_blocks; ++i) ids[std::size_t(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(std::size_t(requests) * std::size_t(stride));
  return ids;
}

}  // namespace spg::test
