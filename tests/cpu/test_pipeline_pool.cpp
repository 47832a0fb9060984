// The pipeline pool's slot formulas (docs/memory.md) and the config's validation messages.
#include <string>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/model/pipeline_config.hpp"

using namespace spg::memory;
using namespace spg::model;
using namespace spg::graphs;
using spg::kernels::CacheLayout;

namespace {
std::string validation_error(const PipelineConfig& c) {
  try {
    c.validate();
  } catch (const spg::InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("cache block stride is data rows, scale rows, padded to 576", "[pool]") {
  CHECK(CacheLayout::min_block_stride(64) == 37440);  // 64 * 584 = 37376 -> 65 * 576
  CHECK(CacheLayout::min_block_stride(2) == 1728);    // 1168 -> 3 * 576
  CHECK(CacheLayout::min_block_stride(72) == 72 * 584);  // 42048 = 73 * 576 exactly
  CHECK(CacheLayout::min_block_stride(1) == 1152);
}

TEST_CASE("pipeline pool sizes every slot from the config", "[pool]") {
  LayerConfig c4{};  // h128, d512, W128, r4, top_k 1024
  const PipelineConfig config = PipelineConfig::single_layer(c4, 3, 1000, 10000);
  const PoolPlan plan = plan_pipeline_pool(config);

  // M_max = 10000 / 4 + min(10000, 1000 + 127) = 2500 + 1127
  CHECK(max_kv_rows(config) == 3627);
  CHECK(plan.slot(slots::kKvWorkspace).spec.bytes == 3ull * 3627 * 512 * 2);
  CHECK(plan.slot(slots::kCombined).spec.bytes == 1000ull * 1152 * 4);  // round_up(1024 + 128, 128)
  CHECK(plan.slot(slots::kCombinedLens).spec.bytes == 1000ull * 4);
  CHECK(plan.slot("layer0.q").spec.bytes == 1000ull * 128 * 512 * 2);
  CHECK(plan.slot("layer0.topk_indices").spec.bytes == 1000ull * 1024 * 4);
  CHECK(plan.slot("layer0.out").spec.bytes == 1000ull * 128 * 512 * 2);
  CHECK(plan.slot("layer0.lse").spec.bytes == 1000ull * 128 * 4);
  CHECK(plan.slot("layer0.compressed_k_rows").spec.bytes == (1000ull / 4 + 3) * 512 * 2);
  CHECK(plan.slot("layer0.swa_cache").spec.bytes ==
        static_cast<std::size_t>(config.cache.swa_blocks) * CacheLayout::min_block_stride(64));
  CHECK(plan.slot("layer0.compressed_cache").spec.bytes ==
        static_cast<std::size_t>(config.cache.compressed_blocks) * CacheLayout::min_block_stride(64));
  CHECK(plan.find("layer0.attn_sink") != nullptr);
  CHECK(plan.slot(slots::kStaging[0]).spec.kind == MemoryKind::pinned_host);
  CHECK(plan.slot(slots::kStaging[1]).spec.bytes == plan.slot(slots::kChunkMeta).spec.bytes);
}

TEST_CASE("chunk metadata layout holds every per-step array, 16-byte aligned", "[pool]") {
  PipelineConfig config = PipelineConfig::v4_default();
  const ChunkMetaLayout m = ChunkMetaLayout::make(config);
  const int R = config.max_requests;
  CHECK(m.swa_table_width == 1024);
  CHECK(m.compressed_table_width == 256);
  CHECK(m.query_start_loc >= m.scalars + kNumRatios * kScalarWords);
  CHECK(m.seq_lens >= m.query_start_loc + R + 1);
  CHECK(m.swa_slots >= m.compressed_block_table[2] + R * m.compressed_table_width);
  CHECK(m.words >= m.compressed_slots[2] + ChunkMetaLayout::compressed_slot_capacity(config, 128));
  for (int offset : {m.scalars, m.query_start_loc, m.seq_lens, m.gather_lens, m.swa_block_table,
                     m.compressed_block_table[1], m.compressed_block_table[2], m.swa_slots, m.compressed_slots[1],
                     m.compressed_slots[2], m.words}) {
    CHECK(offset % 4 == 0);
  }
}

TEST_CASE("the default V4 program plans and fits an H200", "[pool]") {
  const PipelineConfig config = PipelineConfig::v4_default();
  const PoolPlan plan = plan_pipeline_pool(config);
  CHECK(config.layers.size() == 8);
  CHECK(plan.device_bytes() > (1ull << 30));
  CHECK(plan.device_bytes() < (40ull << 30));
  CHECK(plan.pinned_bytes() > 0);
}

TEST_CASE("config validation names the field, its value and its bounds", "[pool]") {
  PipelineConfig c = PipelineConfig::v4_default();
  CHECK(validation_error(c) == "no error");

  PipelineConfig bad = c;
  bad.max_requests = 0;
  CHECK(validation_error(bad).find("max_requests = 0 must be in [1, 64]") != std::string::npos);
  bad = c;
  bad.layers[2].compress_ratio = 8;
  CHECK(validation_error(bad).find("layers[2].compress_ratio = 8 must be 1, 4 or 128") != std::string::npos);
  bad = c;
  bad.layers[0].top_k = 700;
  CHECK(validation_error(bad).find("layers[0].top_k = 700 must be 512 or 1024") != std::string::npos);
  bad = c;
  bad.layers[3].top_k = 64;  // an SWA-only layer
  CHECK(validation_error(bad).find("layers[3].top_k = 64 must be 0") != std::string::npos);
  bad = c;
  bad.layers[1].h_q = 96;
  CHECK(validation_error(bad).find("layers[1].h_q = 96 must be 64 or 128") != std::string::npos);
  bad = c;
  bad.layers[5].window = 64;
  CHECK(validation_error(bad).find("layers[5].window = 64 differs") != std::string::npos);
  bad = c;
  bad.layers.clear();
  CHECK(validation_error(bad).find("at least one layer") != std::string::npos);
  bad = c;
  bad.cache.block_tokens = 200;
  CHECK(validation_error(bad).find("cache.block_tokens = 200") != std::string::npos);
  CHECK_THROWS_AS(plan_pipeline_pool(bad), spg::InvalidArgument);
}

TEST_CASE("the chunk metadata copied every step has an upper bound", "[pool]") {
  // Issue 17: max_requests 64 x max_model_len 2^20 with 1-token SWA blocks made a 256 MiB block
  // that the stage-in would copy on every step.
  PipelineConfig c = PipelineConfig::v4_default();
  c.max_requests = 64;
  c.max_model_len = 1 << 20;
  c.cache.swa_block_size = 1;
  const std::string msg = validation_error(c);
  CHECK(msg.find("the chunk metadata's block tables, max_requests x (max_model_len / cache.swa_block_size + 2 x "
                 "max_model_len / cache.block_tokens) = 64 x (1048576 + 2 x 4096) = 67633152 entries") !=
        std::string::npos);
  CHECK(msg.find("must be at most 4194304 (16 MiB)") != std::string::npos);
  CHECK_THROWS_AS(plan_pipeline_pool(c), spg::InvalidArgument);
  // The largest accepted block stays near the bound: the tables are all that can grow.
  c.max_requests = 4;
  c.cache.swa_block_size = 1;  // 4 x (2^20 + 8192) = 4227072 entries: still too many
  CHECK(validation_error(c) != "no error");
  c.cache.swa_block_size = 2;  // 4 x (2^19 + 8192) = 2129920 entries
  CHECK(validation_error(c) == "no error");
  c.max_requests = 7;  // 3727360 entries
  c.max_tokens = 65536;
  REQUIRE(validation_error(c) == "no error");
  CHECK(c.chunk_table_entries() <= kMaxChunkTableEntries);
  CHECK(ChunkMetaLayout::make(c).bytes() <= (std::size_t{16} << 20) + (std::size_t{1} << 20));
  c.max_requests = 8;  // 4259840 entries
  CHECK(validation_error(c).find("= 4259840 entries") != std::string::npos);
}
