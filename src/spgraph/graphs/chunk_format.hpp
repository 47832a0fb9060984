// The chunk's wire format, in one place: what the host hands the executor for one chunk
// (ChunkInput), the per-step values derived from it (gather_len, N, M, new compressed rows), the
// metadata block it becomes (ChunkMetaLayout), the encoder that checks a chunk and writes that
// block into pinned staging (ChunkEncoder), and the device view the kernels read
// (kernels::ChunkArrays over the block). Formulas: docs/pipeline.md, "Per-chunk inputs"; the
// block's layout: docs/memory.md, "chunk_meta".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "spgraph/core/divisor.hpp"
#include "spgraph/graphs/run_status.hpp"
#include "spgraph/kernels/chunk.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::graphs {

// ---- compression ratios: the metadata keeps one set of per-step scalars per ratio ----

inline constexpr int kNumRatios = 3;
inline constexpr int kRatios[kNumRatios] = {1, 4, 128};
/// Index of a compression ratio among the per-ratio metadata: r = 1 -> 0, 4 -> 1, 128 -> 2.
[[nodiscard]] constexpr int ratio_index(int r) noexcept { return r == 1 ? 0 : (r == 4 ? 1 : 2); }

// ---- the derived per-step values: computed here and nowhere else ----

/// SWA rows a chunk can need of a request: min(seq_len, query_len + W - 1).
[[nodiscard]] constexpr int gather_len(int seq_len, int query_len, int window) noexcept {
  return std::min(seq_len, query_len + window - 1);
}
/// Compressed rows a request of `seq_len` tokens has at ratio r: seq_len / r (none for r = 1).
[[nodiscard]] constexpr int compressed_rows(int seq_len, int r) noexcept { return r > 1 ? seq_len / r : 0; }
/// Compressed rows a chunk completes for a request: seq_len / r - (seq_len - query_len) / r.
[[nodiscard]] constexpr int new_compressed_rows(int seq_len, int query_len, int r) noexcept {
  return r > 1 ? seq_len / r - (seq_len - query_len) / r : 0;
}
/// Blocks that hold `rows` rows of `rows_per_block` each.
[[nodiscard]] constexpr int blocks_for_rows(int rows, int rows_per_block) noexcept {
  return (rows + rows_per_block - 1) / rows_per_block;
}
/// Most compressed rows a chunk of `tokens` tokens over `requests` requests completes for ratio r:
/// tokens / r + requests (each request may complete one row more than its share of tokens). The
/// bound of the compressed insert's rows, per bucket and for the whole config.
[[nodiscard]] constexpr int max_new_compressed_rows(int tokens, int requests, int r) noexcept {
  return tokens / r + requests;
}
/// Slot of a request's row `row` through its block table row: table[row / bs] * bs + row % bs.
[[nodiscard]] constexpr std::int64_t slot_of(std::span<const std::int32_t> table, int rows_per_block, int row) noexcept {
  return kernels::block_slot(table[static_cast<std::size_t>(row / rows_per_block)], rows_per_block, row);
}

// ---- what the host hands the executor ----

/// @brief One request of a chunk. Plain spans over the caller's memory; the executor copies what
///        the step needs into its staging block and keeps no reference.
struct RequestInput {
  int query_len{0};  ///< tokens this chunk prefills for the request
  int seq_len{0};    ///< tokens so far, this chunk's included
  /// Physical SWA cache blocks of the request, in logical order: at least ceil(seq_len / swa_block_size).
  std::span<const std::int32_t> swa_blocks;
  /// Per compression ratio (index ratio_index(r); index 0 unused): compressed cache blocks, at
  /// least ceil((seq_len / r) / (block_tokens / r)) (the blocks of its seq_len / r rows), for each
  /// ratio the layer program uses.
  std::span<const std::int32_t> compressed_blocks[kNumRatios];
};

/// @brief One chunk: up to R requests, their tokens laid out request after request.
struct ChunkInput {
  std::span<const RequestInput> requests;
  /// Insert stage only: the SWA cache slot of each new token (one per token, -1 to skip). Empty
  /// (with every compressed_slots list empty too): the device derives every slot from the block
  /// tables, the SWA slot of position p as slot_of(swa_blocks, swa_block_size, p) and a
  /// compressed row's likewise, which spares the host all per-token copies.
  std::span<const std::int32_t> swa_slots;
  /// Insert stage only, per ratio: the slot of each compressed row the chunk completes, in request
  /// order (exactly sum over requests of new_compressed_rows); empty when swa_slots is (derived slots).
  std::span<const std::int32_t> compressed_slots[kNumRatios];

  /// Sum of the requests' query_len (64-bit: a chunk the executor refuses may hold any values).
  [[nodiscard]] std::int64_t num_tokens() const noexcept {
    std::int64_t t = 0;
    for (const RequestInput& r : requests) t += r.query_len;
    return t;
  }
};

// ---- the metadata block ----

/// int32 words of one ratio's per-step scalars.
inline constexpr int kScalarWords = 8;
static_assert(sizeof(kernels::ChunkScalars) == kScalarWords * sizeof(std::int32_t),
              "the device reads one ChunkScalars per ratio at scalars + ratio_index(r)");
static_assert(alignof(kernels::ChunkScalars) <= 16, "ChunkScalars must fit the block's 16-byte regions");
static_assert(kScalarWords % 4 == 0, "the scalars region keeps the next region 16-byte aligned");

/// @brief Where each per-step array sits inside the chunk metadata block (int32 words).
///
/// The host writes the block into pinned staging; the graph's first node (the stage-in kernel)
/// copies it to the device block. Every offset is a multiple of 4 words (16 bytes).
struct ChunkMetaLayout {
  int scalars{0};                   ///< kNumRatios x ChunkScalars (kScalarWords words each)
  int query_start_loc{0};           ///< [R + 1]
  int seq_lens{0};                  ///< [R]
  int gather_lens{0};               ///< [R]
  int swa_block_table{0};           ///< [R, swa_table_width]
  int compressed_block_table[kNumRatios]{};  ///< per ratio (r = 4, 128): [R, compressed_table_width]; r = 1 unused
  int swa_slots{0};                 ///< [T]: slot of each new token in the SWA cache
  int compressed_slots[kNumRatios]{};  ///< per ratio: [compressed_slot_capacity(r)]
  int swa_table_width{0};
  int compressed_table_width{0};
  int words{0};                     ///< total size in int32 words

  [[nodiscard]] static ChunkMetaLayout make(const model::PipelineConfig& config);
  /// New compressed rows a chunk can produce for ratio r: max_new_compressed_rows(T, R, r).
  [[nodiscard]] static int compressed_slot_capacity(const model::PipelineConfig& config, int r) noexcept;
  [[nodiscard]] std::size_t bytes() const noexcept { return static_cast<std::size_t>(words) * 4; }
};

/// @brief The kernels' view of a metadata block in device memory, for a layer of ratio r.
[[nodiscard]] kernels::ChunkArrays chunk_arrays(const std::int32_t* device_words, const ChunkMetaLayout& layout,
                                                int ratio) noexcept;

/// @brief What the encoder found in a chunk: its size and, for a refused chunk, why.
struct ChunkCheck {
  RunStatus status{RunStatus::ok};  ///< ok, no_bucket or bad_chunk
  int requests{0};
  int tokens{0};
  int new_rows[kNumRatios]{};       ///< compressed rows the chunk completes, per ratio
  bool derive_slots{false};         ///< no slot lists: the device derives the insert slots
  int bad_request{-1};              ///< bad_chunk: the request at fault, -1 for a chunk-wide field
  const char* bad_field{nullptr};   ///< bad_chunk: the field at fault (a static string)
  const char* bad_reason{nullptr};  ///< bad_chunk: what is wrong with it (a static string)
};

/// @brief Where a chunk's rows start in the step's buffers (ChunkScalars::token_offset and
///        new_row_offset): a chunk run alone starts at row 0 of everything. A step's chunk c starts
///        where chunk c - 1 ends (next()), so a step's tokens and compressed rows are the chunks'
///        in order, request after request (docs/graphs.md, "Steps").
struct ChunkRows {
  int token_offset{0};
  int new_row_offset[kNumRatios]{};  ///< per ratio index (index 0 unused)
  /// Where the chunk after the checked one starts.
  [[nodiscard]] ChunkRows next(const ChunkCheck& checked) const noexcept {
    ChunkRows n = *this;
    n.token_offset += checked.tokens;
    for (int i = 1; i < kNumRatios; ++i) n.new_row_offset[i] += checked.new_rows[i];
    return n;
  }
};

/// @brief Checks chunks against a config and writes their metadata blocks; the replay path's host
///        work. No allocation (its scratch is sized at construction), no exception; not for use
///        by two threads at once (check() writes that scratch).
class ChunkEncoder {
 public:
  /// `insert`: the program records the insert stage, so slot lists (when given) are checked and staged.
  ChunkEncoder(const model::PipelineConfig& config, bool insert);

  [[nodiscard]] const ChunkMetaLayout& layout() const noexcept { return layout_; }

  /// Checks `chunk` for a program whose layers use the ratios in `ratio_mask` (bit ratio_index(r)).
  /// bad_chunk names the request, the field and the reason; no_bucket: more requests or tokens than
  /// the config's maximum. Beyond lengths and table sizes, what the device would otherwise skip or
  /// get wrong silently is refused here (docs/pipeline.md, "Bad input"):
  ///  - every block id the encoder stages (the SWA table's window entries, the compressed tables'
  ///    entries of the request's rows) must lie in [0, cache.swa_blocks) / [0, cache.compressed_blocks);
  ///  - with the insert stage, a slot list entry must be -1 or the slot its request's block table
  ///    gives that token's position (SWA) or that completed row (compressed);
  ///  - with the insert stage, no cache block may hold new positions (rows) of two requests, or of
  ///    one request twice: two writes to one slot in a step would race.
  [[nodiscard]] ChunkCheck check(const ChunkInput& chunk, int ratio_mask) noexcept;

  /// Starts fetching into the caches the block-table entries check() and write() read of `chunk`
  /// (the window's SWA entries, the compressed tables of the ratios in `ratio_mask`), so that a
  /// step's cache misses overlap instead of following each other. Reads only the requests and
  /// touches nothing else; requests with lengths check() would refuse are skipped.
  void prefetch(const ChunkInput& chunk, int ratio_mask) const noexcept;

  /// Writes a checked chunk's metadata into `words` (a block of layout().words), only what the
  /// kernels read this step: padded requests get zero lengths, and of the SWA block table only
  /// the entries of the window positions [seq_len - gather_len, seq_len) are written.
  /// `rows`: where the chunk's rows start in a step's buffers (default: row 0, a chunk run alone).
  void write(const ChunkInput& chunk, const ChunkCheck& checked, int ratio_mask, std::int32_t* words,
             const ChunkRows& rows = {}) const noexcept;

 private:
  int max_requests_;
  int max_tokens_;
  int max_model_len_;
  int window_;
  int block_tokens_;
  int swa_blocks_;         // blocks of each SWA cache
  int compressed_blocks_;  // blocks of each compressed cache
  bool insert_;
  // The per-request divisions by the block sizes, as multiplies: rows per SWA block, and per
  // ratio index (index 0 unused) compressed rows per block, block_tokens / r.
  core::Divisor swa_rows_per_block_;
  core::Divisor compressed_rows_per_block_[kNumRatios];
  ChunkMetaLayout layout_;
  // Scratch of the shared-block check: (block id, request) of every block a chunk writes, per
  // ratio index (0: the SWA cache). Sized at construction for the largest chunk.
  std::vector<std::uint64_t> written_[kNumRatios];
};

}  // namespace spg::graphs
