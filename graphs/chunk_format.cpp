// The chunk's wire format: see chunk_format.hpp.
#include "graphs/chunk_format.hpp"

#include <cstring>

namespace spg::graphs {

namespace {
constexpr int round4(int words) { return (words + 3) / 4 * 4; }

/// Compressed blocks a request of seq_len tokens reads: its seq_len / r rows, block_tokens / r a block.
std::size_t compressed_blocks_needed(int seq_len, int r, int block_tokens) noexcept {
  return static_cast<std::size_t>(blocks_for_rows(compressed_rows(seq_len, r), block_tokens / r));
}

ChunkCheck refuse(ChunkCheck c, int request, const char* field) noexcept {
  c.status = RunStatus::bad_chunk;
  c.bad_request = request;
  c.bad_field = field;
  return c;
}
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

int ChunkMetaLayout::compressed_slot_capacity(const memory::PipelineConfig& config, int r) noexcept {
  return config.max_tokens / r + config.max_requests;
}

ChunkMetaLayout ChunkMetaLayout::make(const memory::PipelineConfig& config) {
  ChunkMetaLayout m;
  const int R = config.max_requests;
  m.swa_table_width = config.swa_blocks_per_request();
  m.compressed_table_width = config.compressed_blocks_per_request();
  int at = 0;
  auto take = [&](int words) {
    const int offset = at;
    at += round4(words);
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

ChunkEncoder::ChunkEncoder(const memory::PipelineConfig& config, bool insert)
    : max_requests_(config.max_requests),
      max_tokens_(config.max_tokens),
      max_model_len_(config.max_model_len),
      window_(config.window()),
      swa_block_size_(config.cache.swa_block_size),
      block_tokens_(config.cache.block_tokens),
      insert_(insert),
      layout_(ChunkMetaLayout::make(config)) {}

ChunkCheck ChunkEncoder::check(const ChunkInput& chunk, int ratio_mask) const noexcept {
  ChunkCheck c;
  if (chunk.requests.size() > static_cast<std::size_t>(max_requests_)) {
    c.status = RunStatus::no_bucket;
    return c;
  }
  c.requests = static_cast<int>(chunk.requests.size());
  std::int64_t tokens = 0;
  for (int b = 0; b < c.requests; ++b) {
    const RequestInput& r = chunk.requests[static_cast<std::size_t>(b)];
    if (r.query_len < 0) return refuse(c, b, "query_len");
    if (r.seq_len < r.query_len || r.seq_len > max_model_len_) return refuse(c, b, "seq_len");
    tokens += r.query_len;
    const auto swa_need = static_cast<std::size_t>(blocks_for_rows(r.seq_len, swa_block_size_));
    if (r.swa_blocks.size() < swa_need) return refuse(c, b, "swa_blocks");
    for (int i = 1; i < kNumRatios; ++i) {
      if ((ratio_mask >> i & 1) && r.compressed_blocks[i].size() < compressed_blocks_needed(r.seq_len, kRatios[i], block_tokens_)) {
        return refuse(c, b, "compressed_blocks");
      }
      c.new_rows[i] += new_compressed_rows(r.seq_len, r.query_len, kRatios[i]);
    }
  }
  if (tokens > max_tokens_) {
    c.status = RunStatus::no_bucket;
    return c;
  }
  c.tokens = static_cast<int>(tokens);
  // No slot lists: the inserts derive every slot from the block tables on the device.
  c.derive_slots = chunk.swa_slots.empty();
  if (insert_ && c.requests > 0) {
    if (!c.derive_slots && chunk.swa_slots.size() != static_cast<std::size_t>(c.tokens)) return refuse(c, -1, "swa_slots");
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(ratio_mask >> i & 1)) continue;
      const std::size_t given = chunk.compressed_slots[i].size();
      if (c.derive_slots ? given != 0 : given != static_cast<std::size_t>(c.new_rows[i])) {
        return refuse(c, -1, "compressed_slots");  // both lists or neither; a list holds every completed row
      }
    }
  }
  return c;
}

void ChunkEncoder::write(const ChunkInput& chunk, const ChunkCheck& c, int ratio_mask, std::int32_t* w) const noexcept {
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
