// The chunk's wire format: see chunk_format.hpp.
#include "spgraph/graphs/chunk_format.hpp"

#include <cstring>
#include <limits>

namespace spg::graphs {

namespace {
constexpr int round4(int words) { return (words + 3) / 4 * 4; }

/// Compressed blocks a request of seq_len tokens reads: its seq_len / r rows, block_tokens / r a block.
std::size_t compressed_blocks_needed(int seq_len, int r, int block_tokens) noexcept {
  return static_cast<std::size_t>(blocks_for_rows(compressed_rows(seq_len, r), block_tokens / r));
}

ChunkCheck refuse(ChunkCheck c, int request, const char* field, const char* reason) noexcept {
  c.status = RunStatus::bad_chunk;
  c.bad_request = request;
  c.bad_field = field;
  c.bad_reason = reason;
  return c;
}

/// Whether any of `table[first, last)` lies outside [0, blocks): signed compares OR-ed into one
/// mask, a loop the compiler vectorizes even for the SSE2 baseline.
bool any_outside(std::span<const std::int32_t> table, std::size_t first, std::size_t last, int blocks) noexcept {
  const std::int32_t* t = table.data();
  unsigned outside = 0;
  for (std::size_t i = first; i < last; ++i) outside |= static_cast<unsigned>((t[i] < 0) | (t[i] >= blocks));
  return outside != 0;
}

/// Whether slots[0 .. hi - lo) each are -1 or the slot `table` gives rows lo .. hi - 1: one
/// block's run of rows at a time, each run a branch-free int32 compare the compiler vectorizes.
/// Block ids are checked in range first, so a real row's slot fits int32 unless the cache holds
/// more than 2^31 rows (then only -1 can match, as the insert's int32 slots cannot reach it).
bool slots_follow_table(const std::int32_t* slots, std::span<const std::int32_t> table, int rows_per_block, int lo,
                        int hi) noexcept {
  unsigned bad = 0;
  for (int row = lo; row < hi;) {
    const int offset = row % rows_per_block;
    const int run = std::min(hi - row, rows_per_block - offset);
    const std::int64_t first = std::int64_t{table[static_cast<std::size_t>(row / rows_per_block)]} * rows_per_block + offset;
    if (first + run > std::numeric_limits<std::int32_t>::max()) {
      for (int j = 0; j < run; ++j) bad |= static_cast<unsigned>(slots[j] != -1);
    } else {
      const auto f = static_cast<std::int32_t>(first);
      for (int j = 0; j < run; ++j) bad |= static_cast<unsigned>((slots[j] != -1) & (slots[j] != f + j));
    }
    slots += run;
    row += run;
  }
  return bad == 0;
}

/// Sorts (block << 32 | request) entries; true, with the later request, when a block appears twice.
bool shared_block(std::uint64_t* begin, std::uint64_t* end, int& request) noexcept {
  std::sort(begin, end);
  for (std::uint64_t* p = begin; p + 1 < end; ++p) {
    if ((p[0] >> 32) == (p[1] >> 32)) {
      request = static_cast<int>(p[1] & 0xFFFFFFFFU);
      return true;
    }
  }
  return false;
}

constexpr const char* kOutsideSwa = "a block id the step reads is outside [0, cache.swa_blocks)";
constexpr const char* kOutsideCompressed = "a block id the step reads is outside [0, cache.compressed_blocks)";
constexpr const char* kNotTableSlot = "a slot other than -1 or the one its request's block table gives";
constexpr const char* kShared = "a cache block holds new rows of two requests (or twice of one): their writes would race";
}  // namespace

const char* run_status_name(RunStatus s) noexcept {
  switch (s) {
    case RunStatus::ok: return "ok";
    case RunStatus::no_bucket: return "no bucket holds the chunk (more requests or tokens than the largest bucket)";
    case RunStatus::bad_chunk: return "chunk inconsistent with the config (lengths, block tables or slots)";
    case RunStatus::bad_program: return "no such program";
    case RunStatus::not_warmed_up: return "warmup() has not run";
    case RunStatus::cuda_error: return "a CUDA call failed";
  }
  return "unknown";
}

int ChunkMetaLayout::compressed_slot_capacity(const model::PipelineConfig& config, int r) noexcept {
  return max_new_compressed_rows(config.max_tokens, config.max_requests, r);
}

ChunkMetaLayout ChunkMetaLayout::make(const model::PipelineConfig& config) {
  ChunkMetaLayout m;
  const int R = config.max_requests;
  m.swa_table_width = config.swa_blocks_per_request();
  m.compressed_table_width = config.compressed_blocks_per_request();
  int at = 0;
  auto take = [&](int count) {
    const int offset = at;
    at += round4(count);
    return offset;
  };
  m.scalars = take(kNumRatios * kScalarWords);
  m.query_start_loc = take(R + 1);
  m.seq_lens = take(R);
  m.gather_lens = take(R);
  m.swa_block_table = take(R * m.swa_table_width);
  for (int i = 1; i < kNumRatios; ++i) m.compressed_block_table[i] = take(R * m.compressed_table_width);
  m.swa_slots = take(config.max_tokens);
  for (int i = 1; i < kNumRatios; ++i) m.compressed_slots[i] = take(compressed_slot_capacity(config, kRatios[i]));
  m.words = at;
  return m;
}

kernels::ChunkArrays chunk_arrays(const std::int32_t* device_words, const ChunkMetaLayout& layout, int ratio) noexcept {
  const auto* scalars = reinterpret_cast<const kernels::ChunkScalars*>(device_words + layout.scalars);
  return kernels::ChunkArrays{scalars + ratio_index(ratio), device_words + layout.query_start_loc,
                              device_words + layout.seq_lens, device_words + layout.gather_lens};
}

ChunkEncoder::ChunkEncoder(const model::PipelineConfig& config, bool insert)
    : max_requests_(config.max_requests),
      max_tokens_(config.max_tokens),
      max_model_len_(config.max_model_len),
      window_(config.window()),
      swa_block_size_(config.cache.swa_block_size),
      block_tokens_(config.cache.block_tokens),
      swa_blocks_(config.cache.swa_blocks),
      compressed_blocks_(config.cache.compressed_blocks),
      insert_(insert),
      layout_(ChunkMetaLayout::make(config)) {
  // A request writes at most one block per new position (row), so a chunk at most T (T / r + R).
  written_[0].resize(static_cast<std::size_t>(config.max_tokens));
  for (int i = 1; i < kNumRatios; ++i) {
    written_[i].resize(static_cast<std::size_t>(ChunkMetaLayout::compressed_slot_capacity(config, kRatios[i])));
  }
}

ChunkCheck ChunkEncoder::check(const ChunkInput& chunk, int ratio_mask) noexcept {
  ChunkCheck c;
  if (chunk.requests.size() > static_cast<std::size_t>(max_requests_)) {
    c.status = RunStatus::no_bucket;
    return c;
  }
  c.requests = static_cast<int>(chunk.requests.size());
  std::int64_t tokens = 0;
  for (int b = 0; b < c.requests; ++b) {
    const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
    if (r.query_len < 0) return refuse(c, b, "query_len", "negative");
    if (r.seq_len < r.query_len || r.seq_len > max_model_len_) {
      return refuse(c, b, "seq_len", "below query_len or above max_model_len");
    }
    tokens += r.query_len;
    const auto swa_need = static_cast<std::size_t>(blocks_for_rows(r.seq_len, swa_block_size_));
    if (r.swa_blocks.size() < swa_need) return refuse(c, b, "swa_blocks", "fewer entries than the sequence's blocks");
    // The entries write() stages: those of the window positions [seq_len - gather_len, seq_len).
    const auto swa_first =
        static_cast<std::size_t>((r.seq_len - gather_len(r.seq_len, r.query_len, window_)) / swa_block_size_);
    if (any_outside(r.swa_blocks, swa_first, swa_need, swa_blocks_)) return refuse(c, b, "swa_blocks", kOutsideSwa);
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(ratio_mask >> i & 1)) continue;
      const std::size_t need = compressed_blocks_needed(r.seq_len, kRatios[i], block_tokens_);
      if (r.compressed_blocks[i].size() < need) {
        return refuse(c, b, "compressed_blocks", "fewer entries than the sequence's compressed blocks");
      }
      if (any_outside(r.compressed_blocks[i], 0, need, compressed_blocks_)) {
        return refuse(c, b, "compressed_blocks", kOutsideCompressed);
      }
    }
    for (int i = 1; i < kNumRatios; ++i) c.new_rows[i] += new_compressed_rows(r.seq_len, r.query_len, kRatios[i]);
  }
  if (tokens > max_tokens_) {
    c.status = RunStatus::no_bucket;
    return c;
  }
  c.tokens = static_cast<int>(tokens);
  // No slot lists: the inserts derive every slot from the block tables on the device.
  c.derive_slots = chunk.swa_slots.empty();
  if (!insert_ || c.requests == 0) return c;

  if (!c.derive_slots && chunk.swa_slots.size() != static_cast<std::size_t>(c.tokens)) {
    return refuse(c, -1, "swa_slots", "not one entry per token");
  }
  for (int i = 1; i < kNumRatios; ++i) {
    if (!(ratio_mask >> i & 1)) continue;
    const std::size_t given = chunk.compressed_slots[i].size();
    if (c.derive_slots ? given != 0 : given != static_cast<std::size_t>(c.new_rows[i])) {
      // Both lists or neither; a list holds exactly the rows the chunk completes.
      return refuse(c, -1, "compressed_slots",
                    c.derive_slots ? "given without swa_slots" : "not one entry per completed compressed row");
    }
  }
  // A listed slot is -1 (skip) or the slot the block table gives: anything else would write a row
  // the table does not own (another request's, or one the step reads), silently.
  if (!c.derive_slots) {
    const std::int32_t* s = chunk.swa_slots.data();
    for (int b = 0; b < c.requests; ++b) {
      const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
      if (!slots_follow_table(s, r.swa_blocks, swa_block_size_, r.seq_len - r.query_len, r.seq_len)) {
        return refuse(c, b, "swa_slots", kNotTableSlot);
      }
      s += r.query_len;
    }
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(ratio_mask >> i & 1)) continue;
      const int ratio = kRatios[i];
      s = chunk.compressed_slots[i].data();
      for (int b = 0; b < c.requests; ++b) {
        const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
        const int lo = (r.seq_len - r.query_len) / ratio;
        const int hi = r.seq_len / ratio;
        if (!slots_follow_table(s, r.compressed_blocks[i], block_tokens_ / ratio, lo, hi)) {
          return refuse(c, b, "compressed_slots", kNotTableSlot);
        }
        s += hi - lo;
      }
    }
  }
  // Listed or derived, every written slot is then the table's: two writes to one slot can only
  // come from a block that holds new rows of two requests (or two table entries of one).
  for (int i = 0; i < kNumRatios; ++i) {
    if (i > 0 && !(ratio_mask >> i & 1)) continue;
    const int ratio = kRatios[i];
    const int rows_per_block = i == 0 ? swa_block_size_ : block_tokens_ / ratio;
    std::uint64_t* out = written_[i].data();
    std::size_t n = 0;
    for (int b = 0; b < c.requests; ++b) {
      const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
      const int lo = i == 0 ? r.seq_len - r.query_len : (r.seq_len - r.query_len) / ratio;  // first new row
      const int hi = i == 0 ? r.seq_len : r.seq_len / ratio;                                  // past the last
      if (hi <= lo) continue;
      const std::span<const std::int32_t> table = i == 0 ? r.swa_blocks : r.compressed_blocks[i];
      for (int k = lo / rows_per_block; k <= (hi - 1) / rows_per_block; ++k) {
        out[n++] = std::uint64_t{static_cast<std::uint32_t>(table[static_cast<std::size_t>(k)])} << 32 |
                   static_cast<std::uint32_t>(b);
      }
    }
    int request = -1;
    if (shared_block(out, out + n, request)) return refuse(c, request, i == 0 ? "swa_blocks" : "compressed_blocks", kShared);
  }
  return c;
}

void ChunkEncoder::write(const ChunkInput& chunk, const ChunkCheck& c, int ratio_mask, std::int32_t* w,
                         const ChunkRows& rows) const noexcept {
  const int n = c.requests;
  int max_gather = 0;
  int* qsl = w + layout_.query_start_loc;
  qsl[0] = 0;
  for (int b = 0; b < max_requests_; ++b) {
    const bool real = b < n;
    const RequestInput* r = real ? &chunk.requests[static_cast<std::size_t>(b)] : nullptr;
    const int seq = real ? r->seq_len : 0;
    const int gather = real ? gather_len(seq, r->query_len, window_) : 0;
    qsl[b + 1] = qsl[b] + (real ? r->query_len : 0);
    w[layout_.seq_lens + b] = seq;
    w[layout_.gather_lens + b] = gather;
    max_gather = std::max(max_gather, gather);
    if (!real) continue;
    // Only the SWA blocks of the window positions [seq - gather, seq) are ever read (the gather's
    // window and the insert's new tokens): the rest of the row is left as it was.
    const auto swa_first = static_cast<std::size_t>((seq - gather) / swa_block_size_);
    const auto swa_end = static_cast<std::size_t>(blocks_for_rows(seq, swa_block_size_));
    if (swa_end > swa_first) {
      std::memcpy(w + layout_.swa_block_table + b * layout_.swa_table_width + swa_first,
                  r->swa_blocks.data() + swa_first, (swa_end - swa_first) * 4);
    }
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(ratio_mask >> i & 1)) continue;
      const std::size_t need = compressed_blocks_needed(seq, kRatios[i], block_tokens_);
      if (need > 0) {
        std::memcpy(w + layout_.compressed_block_table[i] + b * layout_.compressed_table_width,
                    r->compressed_blocks[i].data(), need * 4);
      }
    }
  }
  for (int i = 0; i < kNumRatios; ++i) {
    int n_rows = 0;
    for (int b = 0; b < n; ++b) {
      n_rows = std::max(n_rows, compressed_rows(chunk.requests[static_cast<std::size_t>(b)].seq_len, kRatios[i]));
    }
    auto* sc = reinterpret_cast<kernels::ChunkScalars*>(w + layout_.scalars) + i;
    sc->num_requests = n;
    sc->num_tokens = c.tokens;
    sc->n_rows = n_rows;
    sc->m_rows = n_rows + max_gather;
    sc->new_rows = insert_ ? c.new_rows[i] : 0;
    sc->derive_slots = c.derive_slots ? 1 : 0;
    sc->token_offset = rows.token_offset;
    sc->new_row_offset = i > 0 ? rows.new_row_offset[i] : 0;
  }
  if (insert_ && n > 0 && !c.derive_slots) {
    std::memcpy(w + layout_.swa_slots, chunk.swa_slots.data(), chunk.swa_slots.size_bytes());
    for (int i = 1; i < kNumRatios; ++i) {
      if ((ratio_mask >> i & 1) && !chunk.compressed_slots[i].empty()) {
        std::memcpy(w + layout_.compressed_slots[i], chunk.compressed_slots[i].data(),
                    chunk.compressed_slots[i].size_bytes());
      }
    }
  }
}

}  // namespace spg::graphs
