// CPU references of stages 0-2 (insert, gather) and the number formats they use, written from
// docs/pipeline.md ("FP8 paged KV cache", "Stages of one chunk") in plain C++ with no CUDA
// conversion intrinsics. The GPU kernels must match them bit for bit. Also the host-side chunk
// metadata and fault log that the stage references share.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "spgraph/kernels/chunk.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::kernels::reference {

// ---- number formats ----

/// @brief Value of an OCP e4m3 byte (bias 7, no infinities; 0x7F and 0xFF are NaN).
[[nodiscard]] double e4m3_value(std::uint8_t bits) noexcept;
/// @brief `v` clamped to [-448, 448] and rounded to the nearest e4m3 value, ties to even (the sign
///        of zero is kept); NaN gives 0x7F.
[[nodiscard]] std::uint8_t e4m3_round(double v) noexcept;
/// @brief Value of a bf16 bit pattern.
[[nodiscard]] float bf16_value(std::uint16_t bits) noexcept;
/// @brief `v` rounded to bf16, ties to even; NaN gives 0x7FFF.
[[nodiscard]] std::uint16_t bf16_round(float v) noexcept;
/// @brief A tile's UE8M0 exponent: ceil(log2(max(amax, 1e-4) / 448)).
[[nodiscard]] int tile_exponent(float amax) noexcept;

/// @brief Quantizes one 512-value bf16 row into its 576-byte data row and 8-byte scale row
///        (7 exponent bytes, then a zero pad byte).
void quantize_row(const std::uint16_t* row, std::uint8_t* data, std::uint8_t* scales) noexcept;
/// @brief Dequantizes a data row and its scale row into 512 bf16 values:
///        bf16(e4m3 * 2^(byte - 127)) for the NoPE part, the stored bf16 for the RoPE part.
void dequantize_row(const std::uint8_t* data, const std::uint8_t* scales, std::uint16_t* out) noexcept;

// ---- shared by the stage references ----

/// @brief A chunk's per-step metadata on the host: the values a ChunkArrays points to.
struct HostChunk {
  ChunkScalars scalars{};
  std::vector<std::int32_t> query_start_loc;  ///< [requests_bucket + 1]
  std::vector<std::int32_t> seq_lens;         ///< [requests_bucket]
  std::vector<std::int32_t> gather_lens;      ///< [requests_bucket]
};

/// @brief What a reference skipped: counts by kind (as StepStatus counts them) and every fault's
///        record, so a test can check that the device's first record is one of them.
struct FaultLog {
  std::array<std::uint32_t, kFaultKinds> counts{};
  std::vector<FaultRecord> records;

  void add(Fault kind, int request, int position, int value, std::uint32_t n = 1);
  [[nodiscard]] std::uint32_t count(Fault kind) const noexcept { return counts[static_cast<int>(kind)]; }
  [[nodiscard]] bool contains(const FaultRecord& r) const noexcept;
};

/// @brief One paged cache on the host, with the block table the gather reads it through.
struct CacheView {
  const std::uint8_t* cache{nullptr};
  CacheLayout layout{};
  const std::int32_t* block_table{nullptr};
  int block_table_stride{0};
};

// ---- stages ----

/// @brief Stage 0 (KvInsert): quantizes rows i < num_rows of `rows` [rows_bucket, 512] into `cache`
///        at slot_mapping[i]; -1 is skipped, any other slot outside the cache counted and skipped.
void kv_insert(const std::uint16_t* rows, const std::int32_t* slot_mapping, int num_rows, int rows_bucket,
               std::uint8_t* cache, const CacheLayout& layout, FaultLog& log);

/// @brief Stages 1 and 2 (KvGather): writes kv rows [requests_bucket * M, 512] exactly as the
///        device does; rows it does not own are left as they are. For GatherPart::both, `cache` is
///        the compressed cache and `window_cache` the SWA cache; otherwise `cache` is the part's.
void kv_gather(const CacheView& cache, const CacheView& window_cache, const HostChunk& chunk, GatherPart part,
               int compress_ratio, int requests_bucket, std::int64_t max_rows_per_request, std::uint16_t* kv,
               FaultLog& log);

}  // namespace spg::kernels::reference
