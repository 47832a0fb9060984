// The chunk's wire format on the host: what the encoder accepts, what it refuses (naming the
// request and the field, writing nothing), and the metadata block it writes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/catch.hpp"
#include "graphs/chunk_format.hpp"

using namespace spg;
using graphs::ChunkCheck;
using graphs::ChunkEncoder;
using graphs::ChunkInput;
using graphs::RequestInput;
using graphs::RunStatus;

namespace {

memory::PipelineConfig config() {
  memory::PipelineConfig c;
  c.max_requests = 4;
  c.max_tokens = 64;
  c.max_model_len = 1536;
  c.layers = {memory::LayerConfig{64, 512, 512, 128, 4, 512, 0.0F, true},
              memory::LayerConfig{64, 512, 512, 128, 1, 0, 0.0F, false}};
  c.cache.swa_blocks = 103;
  c.cache.compressed_blocks = 29;
  return c;
}

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
  const auto cfg = config();
  const ChunkEncoder enc(cfg, true);
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
  const auto cfg = config();
  const ChunkEncoder enc(cfg, true);
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
    std::vector<std::int32_t> swa_slots(15, 7);
    std::vector<std::int32_t> comp_slots(3, 1);
    c.input.swa_slots = swa_slots;
    c.input.compressed_slots[1] = comp_slots;
    CHECK(enc.check(c.input, kMask).status == RunStatus::bad_chunk);  // 4 rows are completed, 3 given
    CHECK(std::string(enc.check(c.input, kMask).bad_field) == "compressed_slots");
    comp_slots.push_back(2);
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
  const auto cfg = config();
  const ChunkEncoder enc(cfg, true);
  const ChunkInput empty{};
  const ChunkCheck ck = enc.check(empty, kMask);
  REQUIRE(ck.status == RunStatus::ok);
  CHECK(ck.tokens == 0);
  std::vector<std::int32_t> w(static_cast<std::size_t>(enc.layout().words), 9);
  enc.write(empty, ck, kMask, w.data());
  for (int b = 0; b <= cfg.max_requests; ++b) CHECK(w[static_cast<std::size_t>(enc.layout().query_start_loc + b)] == 0);
}
