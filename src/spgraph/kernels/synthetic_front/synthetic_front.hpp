// A synthetic "model front" for drivers and tests: fills the per-step inputs a real model's
// earlier layers would produce (new K rows, compressed K rows, top-k indices) from a
// counter-based hash, so a CPU can regenerate any value exactly for verification.
//
// It is not part of the captured pipeline: drivers launch it eagerly before each step, so its
// per-step values are ordinary kernel arguments.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "spgraph/core/host_device.hpp"

namespace spg::kernels {

inline constexpr int kFrontMaxLayers = 16;
inline constexpr int kFrontMaxRequests = 64;

/// @brief One layer's outputs of the front (device pointers into the pool).
struct FrontLayer {
  __nv_bfloat16* k_rows{nullptr};             ///< [tokens, 512]: one new K row per token
  __nv_bfloat16* compressed_k_rows{nullptr};  ///< [new compressed rows, 512] (r > 1)
  std::int32_t* topk_indices{nullptr};        ///< [tokens, top_k] (r > 1)
  int top_k{0};
  int compress_ratio{1};
};

/// @brief One step's inputs, by value (the front runs eagerly, never under capture).
struct SyntheticFrontArgs {
  std::uint64_t seed{0};
  std::uint64_t step{0};
  int num_requests{0};
  int num_tokens{0};
  int query_start_loc[kFrontMaxRequests + 1]{};
  int seq_lens[kFrontMaxRequests]{};
  int new_compressed_rows[3]{};  ///< per ratio index (1 -> r = 4, 2 -> r = 128)
  int num_layers{0};
  FrontLayer layers[kFrontMaxLayers]{};
};

struct SyntheticFront {
  /// @throws InvalidArgument for counts past the bounds above or null pointers a layer needs.
  static void can_implement(const SyntheticFrontArgs& args);
  static cudaError_t run(const SyntheticFrontArgs& args, cudaStream_t stream) noexcept;
  /// Fills every row of a paged cache with random, finite FP8 data, bf16 RoPE values and scale
  /// bytes giving values of magnitude up to ~0.1 (for benchmarks that need a full cache without
  /// inserting it token by token).
  static cudaError_t fill_cache(std::uint8_t* cache, std::int64_t blocks, int block_size, std::int64_t block_stride,
                                std::uint64_t seed, cudaStream_t stream) noexcept;
  /// Fills `elems` query values of layer `layer` (front_q_value), once at start-up.
  static cudaError_t fill_query(__nv_bfloat16* q, std::size_t elems, std::uint64_t seed, int layer,
                                cudaStream_t stream) noexcept;
};

// ---- the hash, shared by the kernel and the CPU mirror ----

/// splitmix64 finalizer over a combination of the inputs.
SPG_HOST_DEVICE inline std::uint64_t front_hash(std::uint64_t seed, std::uint64_t step, std::uint64_t stream,
                                                std::uint64_t index) {
  std::uint64_t z = seed ^ (step * 0x9E3779B97F4A7C15ULL) ^ (stream * 0xC2B2AE3D27D4EB4FULL) ^
                    (index * 0x165667B19E3779F9ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// Value `d` of K row `row` (stream 2*layer: SWA rows, 2*layer+1: compressed rows): a uniform
/// value in [-1, 1) times 0.125 times a per-row power of two in [2^-4, 2^0], so tiles see varied
/// scales at the magnitude the accuracy bars are calibrated for (docs/testing.md).
SPG_HOST_DEVICE inline float front_k_value(std::uint64_t seed, std::uint64_t step, int stream, int row, int d) {
  const std::uint64_t row_hash = front_hash(seed, step, static_cast<std::uint64_t>(stream) * 2 + 1,
                                            static_cast<std::uint64_t>(row));
  const int exponent = -static_cast<int>(row_hash % 5) - 3;
  const std::uint64_t h = front_hash(seed, step, static_cast<std::uint64_t>(stream) * 2,
                                     static_cast<std::uint64_t>(row) * 512 + static_cast<std::uint64_t>(d));
  const float u = static_cast<float>(h >> 40) * (1.0F / 8388608.0F) - 1.0F;  // 24 bits -> [-1, 1)
  float scale = 1.0F;
  for (int i = 0; i < exponent; ++i) scale *= 2.0F;
  for (int i = 0; i < -exponent; ++i) scale *= 0.5F;
  return u * scale;
}

/// Query value `i` of layer `layer`: uniform in [-1, 1).
SPG_HOST_DEVICE inline float front_q_value(std::uint64_t seed, int layer, std::uint64_t i) {
  const std::uint64_t h = front_hash(seed, ~0ULL, 500 + static_cast<std::uint64_t>(layer), i);
  return static_cast<float>(h >> 40) * (1.0F / 8388608.0F) - 1.0F;
}

/// Top-k entry j of token `token` whose request has `rows` compressed rows: -1 one time in 16,
/// else a row in [0, rows).
SPG_HOST_DEVICE inline std::int32_t front_topk(std::uint64_t seed, std::uint64_t step, int layer, int token, int j,
                                               int top_k, int rows) {
  if (rows <= 0) return -1;
  const std::uint64_t h = front_hash(seed, step, 1000 + static_cast<std::uint64_t>(layer),
                                     static_cast<std::uint64_t>(token) * static_cast<std::uint64_t>(top_k) +
                                         static_cast<std::uint64_t>(j));
  return (h & 15) == 0 ? -1 : static_cast<std::int32_t>((h >> 8) % static_cast<std::uint64_t>(rows));
}

}  // namespace spg::kernels
