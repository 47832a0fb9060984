// Fuzzes the chunk encoder (src/spgraph/graphs/chunk_format): a small random config, then a chunk of random
// lengths, block tables and slot lists (mostly plausible, sometimes wrong). Properties:
//  - check() never crashes; a refusal is no_bucket or bad_chunk, and bad_chunk names a field, a
//    reason and a request in [-1, requests);
//  - an accepted chunk is within bounds once written (into a block of exactly layout().words, so
//    AddressSanitizer sees any write past it): the counts and lengths are the chunk's, every block
//    id the kernels read from the block lies in its cache, every listed slot is -1 or its table's
//    slot, and no two new rows of the step land in one slot (listed or derived).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "fuzz/fuzz_check.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"

using namespace spg;
using graphs::ChunkCheck;
using graphs::ChunkInput;
using graphs::RequestInput;
using graphs::RunStatus;

namespace {

model::PipelineConfig make_config(FuzzedDataProvider& in, bool& ok) {
  model::PipelineConfig c;
  c.max_requests = in.ConsumeIntegralInRange(1, 6);
  c.max_tokens = in.ConsumeIntegralInRange(1, 160);
  c.max_model_len = in.ConsumeIntegralInRange(1, 3000);
  const int window = in.ConsumeIntegralInRange(1, 300);
  const int which = in.ConsumeIntegralInRange(1, 7);  // bit 0: SWA-only, 1: C4A, 2: C128A
  if (which & 1) c.layers.push_back(model::LayerConfig{64, 512, 512, window, 1, 0, 0.0F, false});
  if (which & 2) c.layers.push_back(model::LayerConfig{64, 512, 512, window, 4, 512, 0.0F, true});
  if (which & 4) c.layers.push_back(model::LayerConfig{64, 512, 512, window, 128, 64, 0.0F, true});
  c.cache.swa_block_size = in.ConsumeIntegralInRange(1, 96);
  c.cache.block_tokens = 128 * in.ConsumeIntegralInRange(1, 3);
  c.cache.swa_blocks = in.ConsumeIntegralInRange(1, 400);
  c.cache.compressed_blocks = in.ConsumeIntegralInRange(1, 200);
  try {
    c.validate();
    ok = true;
  } catch (const InvalidArgument&) {
    ok = false;
  }
  return c;
}

/// A block id: mostly a valid one, sometimes one just outside or far outside the cache.
std::int32_t block_id(FuzzedDataProvider& in, int blocks) {
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0: return -1;
    case 1: return blocks;
    case 2: return in.ConsumeIntegral<std::int32_t>();
    default: return in.ConsumeIntegralInRange(0, blocks - 1);
  }
}

struct OwnedChunk {
  std::vector<RequestInput> requests;
  std::vector<std::vector<std::int32_t>> swa, comp[graphs::kNumRatios];
  std::vector<std::int32_t> swa_slots, comp_slots[graphs::kNumRatios];
  ChunkInput input;
};

void make_chunk(FuzzedDataProvider& in, const model::PipelineConfig& c, OwnedChunk& o) {
  const int n = in.ConsumeIntegralInRange(0, c.max_requests + 1);
  o.swa.resize(static_cast<std::size_t>(n));
  for (auto& t : o.comp) t.resize(static_cast<std::size_t>(n));
  const int bs = c.cache.swa_block_size;
  for (int b = 0; b < n; ++b) {
    RequestInput r;
    r.query_len = in.ConsumeIntegralInRange(-1, c.max_tokens / 2 + 2);
    r.seq_len = std::max(0, r.query_len) + in.ConsumeIntegralInRange(-1, c.max_model_len);
    // Tables: usually exactly the blocks the sequence needs (distinct per request, as an allocator
    // hands them out), sometimes a few short or long, sometimes with shared or bad ids.
    const int seq = std::max(r.seq_len, 0);
    const int swa_need = (seq + bs - 1) / bs;
    const int swa_len = std::max(0, swa_need + in.ConsumeIntegralInRange(-1, 2) * (in.ConsumeBool() ? 1 : 0));
    auto& swa = o.swa[static_cast<std::size_t>(b)];
    for (int i = 0; i < swa_len; ++i) {
      swa.push_back(in.ConsumeIntegralInRange(0, 7) == 0 ? block_id(in, c.cache.swa_blocks)
                                                         : (b * 97 + i) % c.cache.swa_blocks);
    }
    r.swa_blocks = swa;
    for (int i = 1; i < graphs::kNumRatios; ++i) {
      const int ratio = graphs::kRatios[i];
      const int rpb = c.cache.block_tokens / ratio;
      const int need = (seq / ratio + rpb - 1) / rpb;
      const int len = std::max(0, need + (in.ConsumeIntegralInRange(0, 5) == 0 ? in.ConsumeIntegralInRange(-1, 2) : 0));
      auto& t = o.comp[i][static_cast<std::size_t>(b)];
      for (int k = 0; k < len; ++k) {
        t.push_back(in.ConsumeIntegralInRange(0, 7) == 0 ? block_id(in, c.cache.compressed_blocks)
                                                         : (b * 53 + k * i) % c.cache.compressed_blocks);
      }
      r.compressed_blocks[i] = t;
    }
    o.requests.push_back(r);
  }
  o.input.requests = o.requests;
  // Slot lists: none (derived), the tables' slots (with some -1 and some wrong), or noise.
  const int mode = in.ConsumeIntegralInRange(0, 2);
  if (mode == 0) return;
  for (int b = 0; b < n; ++b) {
    const RequestInput& r = o.requests[static_cast<std::size_t>(b)];
    for (int p = std::max(0, r.seq_len - r.query_len); p < r.seq_len; ++p) {
      const auto k = static_cast<std::size_t>(p / bs);
      std::int32_t s = k < r.swa_blocks.size() ? static_cast<std::int32_t>(graphs::slot_of(r.swa_blocks, bs, p)) : 0;
      if (mode == 2 || in.ConsumeIntegralInRange(0, 31) == 0) s = in.ConsumeIntegralInRange(-2, bs * c.cache.swa_blocks);
      o.swa_slots.push_back(s);
    }
    for (int i = 1; i < graphs::kNumRatios; ++i) {
      const int ratio = graphs::kRatios[i];
      const int rpb = c.cache.block_tokens / ratio;
      for (int row = std::max(0, r.seq_len - r.query_len) / ratio; row < r.seq_len / ratio; ++row) {
        const auto k = static_cast<std::size_t>(row / rpb);
        std::int32_t s = k < r.compressed_blocks[i].size()
                             ? static_cast<std::int32_t>(graphs::slot_of(r.compressed_blocks[i], rpb, row))
                             : 0;
        if (mode == 2 || in.ConsumeIntegralInRange(0, 31) == 0) s = in.ConsumeIntegralInRange(-2, rpb * c.cache.compressed_blocks);
        o.comp_slots[i].push_back(s);
      }
    }
  }
  if (in.ConsumeIntegralInRange(0, 7) == 0 && !o.swa_slots.empty()) o.swa_slots.pop_back();
  o.input.swa_slots = o.swa_slots;
  for (int i = 1; i < graphs::kNumRatios; ++i) o.input.compressed_slots[i] = o.comp_slots[i];
}

/// Independent reading of an accepted chunk's block, as the kernels read it.
void check_block(const model::PipelineConfig& c, const graphs::ChunkEncoder& enc, const ChunkInput& in,
                 const ChunkCheck& ck, int mask, bool insert, const std::vector<std::int32_t>& w) {
  const graphs::ChunkMetaLayout& m = enc.layout();
  const int bs = c.cache.swa_block_size;
  SPG_FUZZ_CHECK(ck.requests <= c.max_requests && ck.tokens <= c.max_tokens, "%d requests, %d tokens", ck.requests, ck.tokens);
  SPG_FUZZ_CHECK(static_cast<std::int64_t>(ck.tokens) == in.num_tokens(), "tokens %d", ck.tokens);
  const auto* qsl = w.data() + m.query_start_loc;
  SPG_FUZZ_CHECK(qsl[0] == 0 && qsl[c.max_requests] == ck.tokens, "query_start_loc ends at %d", qsl[c.max_requests]);
  for (int i = 0; i < graphs::kNumRatios; ++i) {
    kernels::ChunkScalars sc{};
    std::memcpy(&sc, w.data() + m.scalars + i * graphs::kScalarWords, sizeof sc);
    SPG_FUZZ_CHECK(sc.num_requests == ck.requests && sc.num_tokens == ck.tokens, "scalars of ratio index %d", i);
    SPG_FUZZ_CHECK(sc.n_rows >= 0 && sc.m_rows >= sc.n_rows && sc.m_rows <= c.max_kv_rows(model::LayerConfig{64, 512, 512, c.window(), graphs::kRatios[i], 64, 0.0F, false}),
                   "N %d, M %d", sc.n_rows, sc.m_rows);
  }
  std::set<std::int64_t> written[graphs::kNumRatios];  // slots of new rows, per cache kind
  std::size_t t = 0;
  std::size_t crow[graphs::kNumRatios] = {0, 0, 0};
  for (int b = 0; b < ck.requests; ++b) {
    const RequestInput& r = in.requests[static_cast<std::size_t>(b)];
    SPG_FUZZ_CHECK(qsl[b + 1] - qsl[b] == r.query_len && w[static_cast<std::size_t>(m.seq_lens + b)] == r.seq_len,
                   "request %d lengths", b);
    const int gather = w[static_cast<std::size_t>(m.gather_lens + b)];
    SPG_FUZZ_CHECK(gather == std::min(r.seq_len, r.query_len + c.window() - 1), "request %d gather_len %d", b, gather);
    const std::int32_t* swa_row = w.data() + m.swa_block_table + b * m.swa_table_width;
    // The gather's window and the insert's new positions: the staged entries must be in the cache.
    for (int p = r.seq_len - gather; p < r.seq_len; ++p) {
      const std::int32_t id = swa_row[p / bs];
      SPG_FUZZ_CHECK(id >= 0 && id < c.cache.swa_blocks, "request %d position %d reads SWA block %d", b, p, id);
    }
    for (int i = 1; i < graphs::kNumRatios; ++i) {
      if (!(mask >> i & 1)) continue;
      const int ratio = graphs::kRatios[i];
      const int rpb = c.cache.block_tokens / ratio;
      const std::int32_t* row = w.data() + m.compressed_block_table[i] + b * m.compressed_table_width;
      for (int k = 0; k < r.seq_len / ratio; ++k) {
        SPG_FUZZ_CHECK(row[k / rpb] >= 0 && row[k / rpb] < c.cache.compressed_blocks, "request %d compressed row %d", b, k);
      }
      if (!insert) continue;
      for (int k = (r.seq_len - r.query_len) / ratio; k < r.seq_len / ratio; ++k, ++crow[i]) {
        const std::int64_t derived = std::int64_t{row[k / rpb]} * rpb + k % rpb;
        std::int64_t s = derived;
        if (!ck.derive_slots) {
          s = w[static_cast<std::size_t>(m.compressed_slots[i]) + crow[i]];
          SPG_FUZZ_CHECK(s == -1 || s == derived, "request %d compressed row %d slot %lld, its table gives %lld", b, k,
                         static_cast<long long>(s), static_cast<long long>(derived));
        }
        if (s != -1) SPG_FUZZ_CHECK(written[i].insert(s).second, "two new compressed rows in slot %lld", static_cast<long long>(s));
      }
    }
    if (!insert) continue;
    for (int p = r.seq_len - r.query_len; p < r.seq_len; ++p, ++t) {
      const std::int64_t derived = std::int64_t{swa_row[p / bs]} * bs + p % bs;
      std::int64_t s = derived;
      if (!ck.derive_slots) {
        s = w[static_cast<std::size_t>(m.swa_slots) + t];
        SPG_FUZZ_CHECK(s == -1 || s == derived, "token %zu slot %lld, its table gives %lld", t, static_cast<long long>(s),
                       static_cast<long long>(derived));
      }
      if (s != -1) SPG_FUZZ_CHECK(written[0].insert(s).second, "two new tokens in SWA slot %lld", static_cast<long long>(s));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  bool valid = false;
  const model::PipelineConfig config = make_config(in, valid);
  if (!valid) return 0;
  const bool insert = in.ConsumeBool();
  int mask = 0;
  for (const auto& l : config.layers) mask |= 1 << graphs::ratio_index(l.compress_ratio);
  graphs::ChunkEncoder enc(config, insert);
  OwnedChunk chunk;
  make_chunk(in, config, chunk);
  const ChunkCheck ck = enc.check(chunk.input, mask);
  const ChunkCheck again = enc.check(chunk.input, mask);
  SPG_FUZZ_CHECK(ck.status == again.status && ck.bad_field == again.bad_field, "check() is not deterministic");
  if (ck.status != RunStatus::ok) {
    SPG_FUZZ_CHECK(ck.status == RunStatus::no_bucket || ck.status == RunStatus::bad_chunk, "status %d",
                   static_cast<int>(ck.status));
    if (ck.status == RunStatus::bad_chunk) {
      SPG_FUZZ_CHECK(ck.bad_field != nullptr && ck.bad_reason != nullptr, "bad_chunk without a field or reason");
      SPG_FUZZ_CHECK(ck.bad_request >= -1 && ck.bad_request < static_cast<int>(chunk.requests.size()), "bad_request %d",
                     ck.bad_request);
    }
    return 0;
  }
  // Exactly the block's words on the heap: a write past the block is an AddressSanitizer report.
  std::vector<std::int32_t> words(static_cast<std::size_t>(enc.layout().words), 0x7F7F7F7F);
  enc.write(chunk.input, ck, mask, words.data());
  check_block(config, enc, chunk.input, ck, mask, insert, words);
  return 0;
}
