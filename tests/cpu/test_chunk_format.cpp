// The chunk's wire format on the host: what the encoder accepts, what it refuses (naming the
// request and the field, writing nothing), and the metadata block it writes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "common/small_configs.hpp"
#include "spgraph/graphs/chunk_format.hpp"

using namespace spg;
using graphs::ChunkCheck;
using graphs::ChunkEncoder;
using graphs::ChunkInput;
using graphs::RequestInput;
using graphs::RunStatus;

namespace {

constexpr int kMask = 1 << 0 | 1 << 1;  // ratios 1 and 4

/// Two requests with block tables long enough for their lengths.
struct Chunk {
  std::vector<std::int32_t> swa{3, 9, 4, 17, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39};
  std::vector<std::int32_t> comp{5, 6, 7, 8, 10, 11};
  std::vector<RequestInput> requests;
  ChunkInput input;
  Chunk(int q0, int s0, int q1, int s1) {
    for (auto [q, s] : {std::pair{q0, s0}, std::pair{q1, s1}}) {
      RequestInput r;
      r.query_len = q;
      r.seq_len = s;
      r.swa_blocks = swa;
      r.compressed_blocks[1] = comp;
      requests.push_back(r);
    }
    input.requests = requests;
  }
};

/// The slot of every new token, from its request's SWA table (as a scheduler lists them).
std::vector<std::int32_t> listed_swa_slots(const Chunk& c) {
  std::vector<std::int32_t> out;
  for (const RequestInput& r : c.requests) {
    for (int p = r.seq_len - r.query_len; p < r.seq_len; ++p) {
      out.push_back(static_cast<std::int32_t>(graphs::slot_of(r.swa_blocks, 64, p)));
    }
  }
  return out;
}
/// The slot of every compressed row (r = 4) the chunk completes, from its request's table.
std::vector<std::int32_t> listed_compressed_slots(const Chunk& c) {
  std::vector<std::int32_t> out;
  for (const RequestInput& r : c.requests) {
    for (int row = (r.seq_len - r.query_len) / 4; row < r.seq_len / 4; ++row) {
      out.push_back(static_cast<std::int32_t>(graphs::slot_of(r.compressed_blocks[1], 256 / 4, row)));
    }
  }
  return out;
}

struct Refusal {
  RunStatus status;
  int request;
  std::string field;
  std::string reason;
};
Refusal refusal_of(ChunkEncoder& enc, const ChunkInput& in, int mask = kMask) {
  const ChunkCheck ck = enc.check(in, mask);
  return {ck.status, ck.bad_request, ck.bad_field != nullptr ? ck.bad_field : "", ck.bad_reason != nullptr ? ck.bad_reason : ""};
}

}  // namespace

TEST_CASE("derived per-step values follow docs/pipeline.md", "[chunk]") {
  CHECK(graphs::gather_len(1000, 10, 128) == 137);
  CHECK(graphs::gather_len(50, 10, 128) == 50);
  CHECK(graphs::compressed_rows(1001, 4) == 250);
  CHECK(graphs::compressed_rows(1001, 1) == 0);
  CHECK(graphs::new_compressed_rows(1001, 10, 4) == 250 - 247);
  CHECK(graphs::new_compressed_rows(1001, 10, 1) == 0);
  const std::vector<std::int32_t> table{7, 2, 9};
  CHECK(graphs::slot_of(table, 64, 130) == 9 * 64 + 2);
}

TEST_CASE("the encoder stages a valid chunk: lengths, scalars, only the window's SWA blocks", "[chunk]") {
  const auto cfg = test::two_layer_config();
  ChunkEncoder enc(cfg, true);
  Chunk c(10, 1000, 5, 70);
  const ChunkCheck ck = enc.check(c.input, kMask);
  REQUIRE(ck.status == RunStatus::ok);
  CHECK(ck.requests == 2);
  CHECK(ck.tokens == 15);
  CHECK(ck.derive_slots);
  CHECK(ck.new_rows[1] == (1000 / 4 - 990 / 4) + (70 / 4 - 65 / 4));
  const auto& m = enc.layout();
  std::vector<std::int32_t> w(static_cast<std::size_t>(m.words), -5);
  enc.write(c.input, ck, kMask, w.data());
  CHECK(w[static_cast<std::size_t>(m.query_start_loc) + 0] == 0);
  CHECK(w[static_cast<std::size_t>(m.query_start_loc) + 2] == 15);
  CHECK(w[static_cast<std::size_t>(m.query_start_loc) + 4] == 15);  // padded requests repeat num_tokens
  CHECK(w[static_cast<std::size_t>(m.gather_lens) + 0] == 137);
  CHECK(w[static_cast<std::size_t>(m.gather_lens) + 1] == 70);      // min(seq_len, 5 + 127)
  CHECK(w[static_cast<std::size_t>(m.seq_lens) + 3] == 0);
  kernels::ChunkScalars sc4{};
  std::memcpy(&sc4, w.data() + m.scalars + graphs::kScalarWords, sizeof sc4);
  CHECK(sc4.num_requests == 2);
  CHECK(sc4.num_tokens == 15);
  CHECK(sc4.n_rows == 250);
  CHECK(sc4.m_rows == 250 + 137);
  CHECK(sc4.derive_slots == 1);
  // Request 0's window is positions [863, 1000): blocks 13 .. 15 of its table; the rest untouched.
  const std::size_t row0 = static_cast<std::size_t>(m.swa_block_table);
  CHECK(w[row0 + 12] == -5);
  CHECK(w[row0 + 13] == c.swa[13]);
  CHECK(w[row0 + 15] == c.swa[15]);
  CHECK(w[row0 + 16] == -5);
}

TEST_CASE("the encoder refuses a bad chunk naming the request and the field", "[chunk]") {
  const auto cfg = test::two_layer_config();
  ChunkEncoder enc(cfg, true);
  auto refused = [&](const ChunkInput& in, int request, const char* field) {
    const ChunkCheck ck = enc.check(in, kMask);
    CHECK(ck.status == RunStatus::bad_chunk);
    CHECK(ck.bad_request == request);
    REQUIRE(ck.bad_field != nullptr);
    CHECK(std::string(ck.bad_field) == field);
  };
  {
    Chunk c(10, 1000, -3, 70);  // a negative query_len is a bad chunk, not "no bucket"
    refused(c.input, 1, "query_len");
  }
  {
    Chunk c(10, 1000, 5, 3);
    refused(c.input, 1, "seq_len");
  }
  {
    Chunk c(10, 1537, 5, 70);
    refused(c.input, 0, "seq_len");
  }
  {
    Chunk c(10, 1000, 5, 70);
    c.requests[0].swa_blocks = c.requests[0].swa_blocks.subspan(0, 15);
    refused(c.input, 0, "swa_blocks");
  }
  {
    Chunk c(10, 1000, 5, 70);
    c.requests[1].compressed_blocks[1] = {};
    refused(c.input, 1, "compressed_blocks");
  }
  {
    // Slot lists: one per token, and exactly one per completed compressed row.
    Chunk c(10, 1000, 5, 70);
    std::vector<std::int32_t> swa_slots = listed_swa_slots(c);
    std::vector<std::int32_t> comp_slots = listed_compressed_slots(c);
    REQUIRE(comp_slots.size() == 4);
    c.input.swa_slots = swa_slots;
    c.input.compressed_slots[1] = std::span<const std::int32_t>(comp_slots).subspan(0, 3);
    refused(c.input, -1, "compressed_slots");  // 4 rows are completed, 3 given
    c.input.compressed_slots[1] = comp_slots;
    CHECK(enc.check(c.input, kMask).status == RunStatus::ok);
    c.input.swa_slots = std::span<const std::int32_t>(swa_slots).subspan(0, 14);
    refused(c.input, -1, "swa_slots");
    c.input.swa_slots = {};  // a compressed list without the SWA one
    refused(c.input, -1, "compressed_slots");
  }
  {
    Chunk c(40, 1000, 30, 70);  // 70 tokens > max_tokens
    CHECK(enc.check(c.input, kMask).status == RunStatus::no_bucket);
  }
  {
    std::vector<RequestInput> five(5);
    ChunkInput in;
    in.requests = five;
    CHECK(enc.check(in, kMask).status == RunStatus::no_bucket);
  }
}

TEST_CASE("an empty chunk stages zero lengths", "[chunk]") {
  const auto cfg = test::two_layer_config();
  ChunkEncoder enc(cfg, true);
  const ChunkInput empty{};
  const ChunkCheck ck = enc.check(empty, kMask);
  REQUIRE(ck.status == RunStatus::ok);
  CHECK(ck.tokens == 0);
  std::vector<std::int32_t> w(static_cast<std::size_t>(enc.layout().words), 9);
  enc.write(empty, ck, kMask, w.data());
  for (int b = 0; b <= cfg.max_requests; ++b) CHECK(w[static_cast<std::size_t>(enc.layout().query_start_loc + b)] == 0);
}

TEST_CASE("every block id the encoder stages must lie inside its cache", "[chunk]") {
  // Issue 17: an id outside [0, num_blocks) reached the device, which zero-filled the rows or
  // skipped them and counted a fault that only the last step's status showed.
  const auto cfg = test::two_layer_config();  // 103 SWA blocks, 29 compressed blocks
  ChunkEncoder enc(cfg, true);
  Chunk c(10, 1000, 5, 70);
  REQUIRE(refusal_of(enc, c.input).status == RunStatus::ok);
  // Request 0's window is positions [863, 1000): SWA table entries 13 .. 15.
  for (const std::int32_t bad : {103, -1, -7, 1 << 30}) {
    INFO("SWA block id " << bad);
    c.swa[14] = bad;
    const Refusal r = refusal_of(enc, c.input);
    CHECK(r.status == RunStatus::bad_chunk);
    CHECK(r.request == 0);
    CHECK(r.field == "swa_blocks");
    CHECK(r.reason == "a block id the step reads is outside [0, cache.swa_blocks)");
  }
  c.swa[14] = 30;
  c.swa[5] = 5000;  // outside the window: never staged, never read
  CHECK(refusal_of(enc, c.input).status == RunStatus::ok);
  c.comp[3] = 29;  // request 0's rows 0 .. 249 span compressed entries 0 .. 3
  Refusal r = refusal_of(enc, c.input);
  CHECK(r.status == RunStatus::bad_chunk);
  CHECK(r.request == 0);
  CHECK(r.field == "compressed_blocks");
  CHECK(r.reason == "a block id the step reads is outside [0, cache.compressed_blocks)");
  // A program without C4A layers does not read the r = 4 tables.
  CHECK(refusal_of(enc, c.input, 1 << 0).status == RunStatus::ok);
  c.comp[3] = 8;
  c.comp[5] = -3;  // past request 0's 4 entries: not read
  CHECK(refusal_of(enc, c.input).status == RunStatus::ok);
  // The encoder without the insert stage reads the same tables and checks them the same way.
  ChunkEncoder read_only(cfg, false);
  c.swa[13] = 103;
  CHECK(refusal_of(read_only, c.input).field == "swa_blocks");
}

TEST_CASE("a listed slot must be -1 or the slot its request's block table gives", "[chunk]") {
  // Issue 17: a slot list pointing at another row in range (or at one row twice) was accepted and
  // silently overwrote cache rows.
  const auto cfg = test::two_layer_config();
  ChunkEncoder enc(cfg, true);
  Chunk c(10, 1000, 5, 70);
  std::vector<std::int32_t> swa_slots = listed_swa_slots(c);
  std::vector<std::int32_t> comp_slots = listed_compressed_slots(c);
  c.input.swa_slots = swa_slots;
  c.input.compressed_slots[1] = comp_slots;
  REQUIRE(refusal_of(enc, c.input).status == RunStatus::ok);
  auto expect = [&](int request, const char* field) {
    const Refusal r = refusal_of(enc, c.input);
    CHECK(r.status == RunStatus::bad_chunk);
    CHECK(r.request == request);
    CHECK(r.field == field);
    CHECK(r.reason == "a slot other than -1 or the one its request's block table gives");
  };
  SECTION("a slot of another row in range") {
    swa_slots[12] = swa_slots[12] + 1;  // token 12 is request 1's third
    expect(1, "swa_slots");
  }
  SECTION("one slot twice") {
    swa_slots[3] = swa_slots[2];
    expect(0, "swa_slots");
  }
  SECTION("a slot outside the cache") {
    swa_slots[14] = 103 * 64;
    expect(1, "swa_slots");
    swa_slots[14] = -2;
    expect(1, "swa_slots");
  }
  SECTION("a compressed slot of another row") {
    comp_slots[3] = comp_slots[2];
    expect(1, "compressed_slots");
  }
  SECTION("-1 skips a row and is always accepted") {
    swa_slots[0] = -1;
    swa_slots[14] = -1;
    comp_slots[1] = -1;
    CHECK(refusal_of(enc, c.input).status == RunStatus::ok);
  }
}

TEST_CASE("no cache block may hold new rows of two requests", "[chunk]") {
  const auto cfg = test::two_layer_config();
  ChunkEncoder enc(cfg, true);
  Chunk c(10, 1000, 5, 70);
  // Request 1's new positions 65 .. 69 are in its table's entry 1; request 0's 990 .. 999 in entry 15.
  std::vector<std::int32_t> other = c.swa;
  c.requests[1].swa_blocks = other;
  other[1] = c.swa[15];  // the block request 0 writes
  Refusal r = refusal_of(enc, c.input);  // derived slots: the device would write both rows there
  CHECK(r.status == RunStatus::bad_chunk);
  CHECK(r.request == 1);
  CHECK(r.field == "swa_blocks");
  CHECK(r.reason == "a cache block holds new rows of two requests (or twice of one): their writes would race");
  // The same with slot lists that follow the tables (they agree, so only the shared block is wrong).
  std::vector<std::int32_t> swa_slots = listed_swa_slots(c);
  std::vector<std::int32_t> comp_slots = listed_compressed_slots(c);
  c.input.swa_slots = swa_slots;
  c.input.compressed_slots[1] = comp_slots;
  CHECK(refusal_of(enc, c.input).reason == r.reason);
  // Sharing a block of old positions (a common prefix) is fine: nothing writes it.
  other[1] = c.swa[1];
  other[0] = c.swa[15];
  c.input.swa_slots = {};
  c.input.compressed_slots[1] = {};
  CHECK(refusal_of(enc, c.input).status == RunStatus::ok);
  // One request's table naming one block twice for its new positions.
  Chunk one(60, 130, 0, 0);  // positions 70 .. 129: entries 1 and 2
  one.swa[2] = one.swa[1];
  r = refusal_of(enc, one.input);
  CHECK(r.status == RunStatus::bad_chunk);
  CHECK(r.request == 0);
  CHECK(r.field == "swa_blocks");
  // Compressed blocks: request 1's new row 16 lands in its entry 0, request 0's rows 247 .. 249 in entry 3.
  std::vector<std::int32_t> comp_other = c.comp;
  c.requests[1].compressed_blocks[1] = comp_other;
  comp_other[0] = c.comp[3];
  r = refusal_of(enc, c.input);
  CHECK(r.status == RunStatus::bad_chunk);
  CHECK(r.request == 1);
  CHECK(r.field == "compressed_blocks");
  CHECK(refusal_of(enc, c.input, 1 << 0).status == RunStatus::ok);  // no C4A layer: the r = 4 cache is not written
  // Without the insert stage nothing is written: shared blocks are no hazard.
  ChunkEncoder read_only(cfg, false);
  CHECK(refusal_of(read_only, c.input).status == RunStatus::ok);
}

// Host cost of the encoder at the V4 program's chunk limit (T = 2048, 4 requests of 512 new tokens
// at 64K context), with and without slot lists: check() then write(), as run() does. Hidden (not
// run by CTest); run it with: spgraph_cpu_tests "[.chunk-cost]" on an idle machine.
TEST_CASE("encoder host cost per chunk at T = 2048", "[.chunk-cost]") {
  const model::PipelineConfig cfg = model::PipelineConfig::v4_default();
  ChunkEncoder enc(cfg, true);
  const int bs = cfg.cache.swa_block_size;
  const int swa_width = cfg.swa_blocks_per_request();
  const int comp_width = cfg.compressed_blocks_per_request();
  std::vector<std::vector<std::int32_t>> swa(4), comp4(4), comp128(4);
  std::vector<RequestInput> requests(4);
  std::vector<std::int32_t> swa_slots, slots4, slots128;
  for (int b = 0; b < 4; ++b) {
    for (int i = 0; i < swa_width; ++i) swa[static_cast<std::size_t>(b)].push_back(b * swa_width + i * 7 % swa_width);  // a permutation per request
    for (int i = 0; i < comp_width; ++i) {
      comp4[static_cast<std::size_t>(b)].push_back(b * comp_width + i * 3 % comp_width);
      comp128[static_cast<std::size_t>(b)].push_back(b * comp_width + (i * 5 + 1) % comp_width);
    }
    RequestInput& r = requests[static_cast<std::size_t>(b)];
    r.query_len = 512;
    r.seq_len = 65536 - 1000 * b;
    r.swa_blocks = swa[static_cast<std::size_t>(b)];
    r.compressed_blocks[1] = comp4[static_cast<std::size_t>(b)];
    r.compressed_blocks[2] = comp128[static_cast<std::size_t>(b)];
    for (int p = r.seq_len - r.query_len; p < r.seq_len; ++p) swa_slots.push_back(static_cast<std::int32_t>(graphs::slot_of(r.swa_blocks, bs, p)));
    for (int row = (r.seq_len - r.query_len) / 4; row < r.seq_len / 4; ++row) {
      slots4.push_back(static_cast<std::int32_t>(graphs::slot_of(r.compressed_blocks[1], cfg.cache.block_tokens / 4, row)));
    }
    for (int row = (r.seq_len - r.query_len) / 128; row < r.seq_len / 128; ++row) {
      slots128.push_back(static_cast<std::int32_t>(graphs::slot_of(r.compressed_blocks[2], cfg.cache.block_tokens / 128, row)));
    }
  }
  constexpr int kAllRatios = 1 << 0 | 1 << 1 | 1 << 2;
  std::vector<std::int32_t> words(static_cast<std::size_t>(enc.layout().words));
  for (const bool listed : {false, true}) {
    ChunkInput in;
    in.requests = requests;
    if (listed) {
      in.swa_slots = swa_slots;
      in.compressed_slots[1] = slots4;
      in.compressed_slots[2] = slots128;
    }
    REQUIRE(in.num_tokens() == 2048);
    REQUIRE(enc.check(in, kAllRatios).status == RunStatus::ok);
    constexpr int kIterations = 20000;
    double best = 1e30;
    for (int round = 0; round < 5; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      int sink = 0;
      for (int i = 0; i < kIterations; ++i) {
        const ChunkCheck ck = enc.check(in, kAllRatios);
        enc.write(in, ck, kAllRatios, words.data());
        sink += ck.tokens + words[static_cast<std::size_t>(i) % words.size()];
      }
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kIterations;
      best = std::min(best, us);
      CHECK(sink != 0);
    }
    std::printf("encoder check + write, T = 2048, 4 requests, %s: %.3f us per chunk (best of 5 x %d)\n",
                listed ? "slot lists given" : "derived slots", best, kIterations);
  }
}
