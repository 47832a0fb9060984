// The chunk's wire format: see chunk_format.hpp.
#include "spgraph/graphs/chunk_format.hpp"

#include <cstring>
#include <limits>

namespace spg::graphs {

namespace {
constexpr int round4(int words) { return (words + 3) / 4 * 4; }

// The ratios are powers of two: n / r of a non-negative n is a shift.
constexpr int kRatioShift[kNumRatios] = {0, 2, 7};
constexpr bool ratio_shifts_match() noexcept {
  for (int i = 0; i < kNumRatios; ++i) {
    if ((1 << kRatioShift[i]) != kRatios[i]) return false;
  }
  return true;
}
static_assert(ratio_shifts_match(), "kRatioShift must give kRatios");

/// n / kRatios[i] for n >= 0.
constexpr int divide_by_ratio(int n, int i) noexcept { return n >> kRatioShift[i]; }

ChunkCheck refuse(ChunkCheck c, int request, const char* field, const char* reason) noexcept {
  c.status = RunStatus::bad_chunk;
  c.bad_request = request;
  c.bad_field = field;
  c.bad_reason = reason;
  return c;
}

/// Whether any of `table[first, last)` lies outside [0, blocks): one unsigned compare an entry
/// (a negative id is above any block count as unsigned), OR-ed into one flag; the ranges are a
/// few entries to a few dozen.
bool any_outside(std::span<const std::int32_t> table, std::size_t first, std::size_t last, int blocks) noexcept {
  const std::int32_t* t = table.data();
  const auto limit = static_cast<std::uint32_t>(blocks);
  unsigned outside = 0;
  for (std::size_t i = first; i < last; ++i) outside |= static_cast<unsigned>(static_cast<std::uint32_t>(t[i]) >= limit);
  return outside != 0;
}

/// Whether slots[0 .. hi - lo) each are -1 or the slot `table` gives rows lo .. hi - 1: one
/// block's run of rows at a time, each run a branch-free int32 compare the compiler vectorizes.
/// Block ids are checked in range first, so a real row's slot fits int32 unless the cache holds
/// more than 2^31 rows (then only -1 can match, as the insert's int32 slots cannot reach it).
bool slots_follow_table(const std::int32_t* slots, std::span<const std::int32_t> table, const core::Divisor& per_block,
                        int lo, int hi) noexcept {
  const int rows_per_block = per_block.value();
  unsigned bad = 0;
  for (int row = lo; row < hi;) {
    const int block = per_block.divide(row);
    const int offset = row - block * rows_per_block;
    const int run = std::min(hi - row, rows_per_block - offset);
    const std::int64_t first = std::int64_t{table[static_cast<std::size_t>(block)]} * rows_per_block + offset;
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

/// Copies `n` int32 words in 16-byte moves the compiler inlines (the block-table rows are a few
/// to a few dozen words: a library call each would cost more than the copy).
void copy_words(std::int32_t* dst, const std::int32_t* src, std::size_t n) noexcept {
  std::size_t k = 0;
  for (; k + 4 <= n; k += 4) std::memcpy(dst + k, src + k, 16);
  for (; k < n; ++k) dst[k] = src[k];
}

/// Appends (block << 32 | request) for the blocks of `table` holding rows [lo, hi) (hi > lo).
std::size_t append_written(std::uint64_t* out, std::size_t n, std::span<const std::int32_t> table,
                           const core::Divisor& per_block, int lo, int hi, int request) noexcept {
  const int last = per_block.divide(hi - 1);
  for (int k = per_block.divide(lo); k <= last; ++k) {
    out[n++] = std::uint64_t{static_cast<std::uint32_t>(table[static_cast<std::size_t>(k)])} << 32 |
               static_cast<std::uint32_t>(request);
  }
  return n;
}

/// Sorts (block << 32 | request) entries; true, with the later request, when a block appears twice.
/// A chunk's lists are short (a few blocks a request): an insertion sort below 32 entries, which
/// is one compare an entry for the usual ascending tables.
bool shared_block(std::uint64_t* begin, std::uint64_t* end, int& request) noexcept {
  if (end - begin <= 32) {
    for (std::uint64_t* p = begin + (begin != end ? 1 : 0); p < end; ++p) {
      const std::uint64_t v = *p;
      std::uint64_t* q = p;
      for (; q > begin && q[-1] > v; --q) *q = q[-1];
      *q = v;
    }
  } else {
    std::sort(begin, end);
  }
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
    case RunStatus::not_staged: return "no step staged (stage() has not accepted one, or a run of a step replaced it)";
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
      block_tokens_(config.cache.block_tokens),
      swa_blocks_(config.cache.swa_blocks),
      compressed_blocks_(config.cache.compressed_blocks),
      insert_(insert),
      swa_rows_per_block_(config.cache.swa_block_size),
      layout_(ChunkMetaLayout::make(config)) {
  for (int i = 1; i < kNumRatios; ++i) compressed_rows_per_block_[i] = core::Divisor(block_tokens_ / kRatios[i]);
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
  // With the insert stage, the (block, request) pairs of every block the chunk writes, per ratio
  // index, for the shared-block rule at the end: gathered on the way while the tokens so far are
  // within T, the bound of the scratch (a chunk past T is refused before they are read).
  std::size_t written[kNumRatios] = {0, 0, 0};
  std::int64_t tokens = 0;
  for (int b = 0; b < c.requests; ++b) {
    const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
    if (r.query_len < 0) return refuse(c, b, "query_len", "negative");
    if (r.seq_len < r.query_len || r.seq_len > max_model_len_) {
      return refuse(c, b, "seq_len", "below query_len or above max_model_len");
    }
    // From here 0 <= query_len <= seq_len <= max_model_len: every division below is of a non-negative value.
    tokens += r.query_len;
    const int seq = r.seq_len;
    const int first = seq - r.query_len;  // the chunk's first new position of the request
    const auto swa_need = static_cast<std::size_t>(swa_rows_per_block_.divide_up(seq));
    if (r.swa_blocks.size() < swa_need) return refuse(c, b, "swa_blocks", "fewer entries than the sequence's blocks");
    // The entries write() stages: those of the window positions [seq_len - gather_len, seq_len).
    const auto swa_first =
        static_cast<std::size_t>(swa_rows_per_block_.divide(seq - gather_len(seq, r.query_len, window_)));
    if (any_outside(r.swa_blocks, swa_first, swa_need, swa_blocks_)) return refuse(c, b, "swa_blocks", kOutsideSwa);
    for (int i = 1; i < kNumRatios; ++i) {
      if (ratio_mask >> i & 1) {
        const auto need = static_cast<std::size_t>(compressed_rows_per_block_[i].divide_up(divide_by_ratio(seq, i)));
        if (r.compressed_blocks[i].size() < need) {
          return refuse(c, b, "compressed_blocks", "fewer entries than the sequence's compressed blocks");
        }
        if (any_outside(r.compressed_blocks[i], 0, need, compressed_blocks_)) {
          return refuse(c, b, "compressed_blocks", kOutsideCompressed);
        }
      }
    }
    for (int i = 1; i < kNumRatios; ++i) c.new_rows[i] += divide_by_ratio(seq, i) - divide_by_ratio(first, i);
    if (insert_ && r.query_len > 0 && tokens <= max_tokens_) {
      written[0] = append_written(written_[0].data(), written[0], r.swa_blocks, swa_rows_per_block_, first, seq, b);
      for (int i = 1; i < kNumRatios; ++i) {
        const int lo = divide_by_ratio(first, i);
        const int hi = divide_by_ratio(seq, i);
        if ((ratio_mask >> i & 1) && hi > lo) {
          written[i] = append_written(written_[i].data(), written[i], r.compressed_blocks[i],
                                      compressed_rows_per_block_[i], lo, hi, b);
        }
      }
    }
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
      if (!slots_follow_table(s, r.swa_blocks, swa_rows_per_block_, r.seq_len - r.query_len, r.seq_len)) {
        return refuse(c, b, "swa_slots", kNotTableSlot);
      }
      s += r.query_len;
    }
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(ratio_mask >> i & 1)) continue;
      s = chunk.compressed_slots[i].data();
      for (int b = 0; b < c.requests; ++b) {
        const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
        const int lo = divide_by_ratio(r.seq_len - r.query_len, i);
        const int hi = divide_by_ratio(r.seq_len, i);
        if (!slots_follow_table(s, r.compressed_blocks[i], compressed_rows_per_block_[i], lo, hi)) {
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
    int request = -1;
    std::uint64_t* out = written_[i].data();
    if (shared_block(out, out + written[i], request)) {
      return refuse(c, request, i == 0 ? "swa_blocks" : "compressed_blocks", kShared);
    }
  }
  return c;
}

namespace {
/// Prefetches the lines of table[first, last) (first < last, clamped to the table).
void prefetch_entries(std::span<const std::int32_t> table, std::size_t first, std::size_t last) noexcept {
  if (table.empty() || first >= last) return;
  last = std::min(last, table.size());
  first = std::min(first, last - 1);
  __builtin_prefetch(table.data() + first);
  __builtin_prefetch(table.data() + last - 1);  // the same line or the next: the rows are short
}
}  // namespace

void ChunkEncoder::prefetch(const ChunkInput& chunk, int ratio_mask) const noexcept {
  for (const RequestInput& r : chunk.requests) {
    if (r.query_len < 0 || r.seq_len < r.query_len || r.seq_len > max_model_len_) continue;
    const int seq = r.seq_len;
    prefetch_entries(r.swa_blocks,
                     static_cast<std::size_t>(swa_rows_per_block_.divide(seq - gather_len(seq, r.query_len, window_))),
                     static_cast<std::size_t>(swa_rows_per_block_.divide_up(seq)));
    for (int i = 1; i < kNumRatios; ++i) {
      if (ratio_mask >> i & 1) {
        prefetch_entries(r.compressed_blocks[i], 0,
                         static_cast<std::size_t>(compressed_rows_per_block_[i].divide_up(divide_by_ratio(seq, i))));
      }
    }
  }
}

void ChunkEncoder::write(const ChunkInput& chunk, const ChunkCheck& c, int ratio_mask, std::int32_t* w,
                         const ChunkRows& rows) const noexcept {
  const int n = c.requests;
  std::int32_t* const qsl = w + layout_.query_start_loc;
  std::int32_t* const seq_lens = w + layout_.seq_lens;
  std::int32_t* const gather_lens = w + layout_.gather_lens;
  int start = 0;
  int max_gather = 0;
  int max_seq = 0;
  qsl[0] = 0;
  for (int b = 0; b < n; ++b) {
    const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
    const int seq = r.seq_len;
    const int gather = gather_len(seq, r.query_len, window_);
    start += r.query_len;
    qsl[b + 1] = start;
    seq_lens[b] = seq;
    gather_lens[b] = gather;
    max_gather = std::max(max_gather, gather);
    max_seq = std::max(max_seq, seq);
    // Only the SWA blocks of the window positions [seq - gather, seq) are ever read (the gather's
    // window and the insert's new tokens): the rest of the row is left as it was.
    const auto swa_first = static_cast<std::size_t>(swa_rows_per_block_.divide(seq - gather));
    const auto swa_end = static_cast<std::size_t>(swa_rows_per_block_.divide_up(seq));
    if (swa_end > swa_first) {
      copy_words(w + layout_.swa_block_table + b * layout_.swa_table_width + swa_first, r.swa_blocks.data() + swa_first,
                 swa_end - swa_first);
    }
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(ratio_mask >> i & 1)) continue;
      const auto need = static_cast<std::size_t>(compressed_rows_per_block_[i].divide_up(divide_by_ratio(seq, i)));
      if (need > 0) {
        copy_words(w + layout_.compressed_block_table[i] + b * layout_.compressed_table_width,
                   r.compressed_blocks[i].data(), need);
      }
    }
  }
  // Padded requests: zero lengths.
  for (int b = n; b < max_requests_; ++b) {
    qsl[b + 1] = start;
    seq_lens[b] = 0;
    gather_lens[b] = 0;
  }
  auto* const scalars = reinterpret_cast<kernels::ChunkScalars*>(w + layout_.scalars);
  for (int i = 0; i < kNumRatios; ++i) {
    // N: the most compressed rows of any request, seq_len / r of the longest (none for r = 1).
    const int n_rows = i > 0 ? divide_by_ratio(max_seq, i) : 0;
    kernels::ChunkScalars& sc = scalars[i];
    sc.num_requests = n;
    sc.num_tokens = c.tokens;
    sc.n_rows = n_rows;
    sc.m_rows = n_rows + max_gather;
    sc.new_rows = insert_ ? c.new_rows[i] : 0;
    sc.derive_slots = c.derive_slots ? 1 : 0;
    sc.token_offset = rows.token_offset;
    sc.new_row_offset = i > 0 ? rows.new_row_offset[i] : 0;
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
