// Sizing the pipeline pool from a PipelineConfig: see pipeline_pool.hpp and docs/memory.md.
#include "memory/pipeline_pool.hpp"

#include <algorithm>
#include <sstream>

namespace spg::memory {

namespace {
constexpr int round4(int words) { return (words + 3) / 4 * 4; }

std::string shape(std::initializer_list<std::int64_t> dims, const char* type) {
  std::ostringstream os;
  os << '[';
  bool first = true;
  for (std::int64_t d : dims) {
    os << (first ? "" : ", ") << d;
    first = false;
  }
  os << "] " << type;
  return os.str();
}

std::size_t product(std::initializer_list<std::int64_t> dims, std::size_t elem) {
  std::size_t n = elem;
  for (std::int64_t d : dims) n *= static_cast<std::size_t>(d);
  return n;
}

void add_array(PoolPlan& plan, std::string name, std::initializer_list<std::int64_t> dims, const char* type,
               std::size_t elem) {
  plan.add(SlotSpec{std::move(name), product(dims, elem), 256, MemoryKind::device, shape(dims, type)});
}
}  // namespace

int ChunkMetaLayout::compressed_slot_capacity(const PipelineConfig& config, int r) noexcept {
  return config.max_tokens / r + config.max_requests;
}

ChunkMetaLayout ChunkMetaLayout::make(const PipelineConfig& config) {
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
  for (int i = 1; i < kNumRatios; ++i) {
    m.compressed_block_table[i] = take(R * m.compressed_table_width);
  }
  m.swa_slots = take(config.max_tokens);
  for (int i = 1; i < kNumRatios; ++i) {
    m.compressed_slots[i] = take(compressed_slot_capacity(config, kRatios[i]));
  }
  m.words = at;
  return m;
}

std::string slots::layer_slot(std::size_t layer, const char* what) {
  return "layer" + std::to_string(layer) + "." + what;
}

int max_combined_width(const PipelineConfig& config) noexcept {
  int w = 0;
  for (const LayerConfig& l : config.layers) w = std::max(w, l.combined_width());
  return w;
}

std::int64_t max_kv_rows(const PipelineConfig& config) noexcept {
  std::int64_t m = 0;
  for (const LayerConfig& l : config.layers) m = std::max(m, config.max_kv_rows(l));
  return m;
}

PoolPlan plan_pipeline_pool(const PipelineConfig& config) {
  config.validate();
  const std::int64_t R = config.max_requests;
  const std::int64_t T = config.max_tokens;
  const ChunkMetaLayout meta = ChunkMetaLayout::make(config);

  PoolPlan plan;
  plan.add(SlotSpec{slots::kChunkMeta, meta.bytes(), 256, MemoryKind::device,
                    shape({meta.words}, "int32 (chunk metadata)")});
  plan.add(SlotSpec{slots::kStepStatus, kStepStatusBytes, 256, MemoryKind::device, "StepStatus"});
  // One workspace, reused by every layer in turn: sized for the layer with the most rows.
  add_array(plan, slots::kKvWorkspace, {R, max_kv_rows(config), kHeadDim}, "bf16", 2);
  add_array(plan, slots::kCombined, {T, max_combined_width(config)}, "int32", 4);
  add_array(plan, slots::kTopkLens, {T}, "int32", 4);

  for (std::size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& l = config.layers[i];
    const std::int64_t r = l.compress_ratio;
    auto name = [&](const char* what) { return slots::layer_slot(i, what); };
    add_array(plan, name("q"), {T, l.h_q, l.d_qk}, "bf16", 2);
    if (r > 1) add_array(plan, name("topk_indices"), {T, l.top_k}, "int32", 4);
    if (l.attn_sink) add_array(plan, name("attn_sink"), {l.h_q}, "f32", 4);
    add_array(plan, name("k_rows"), {T, kHeadDim}, "bf16", 2);
    if (r > 1) {
      add_array(plan, name("compressed_k_rows"), {ChunkMetaLayout::compressed_slot_capacity(config, l.compress_ratio), kHeadDim},
                "bf16", 2);
    }
    const std::int64_t swa_stride = cache_block_stride(config.cache.swa_block_size);
    plan.add(SlotSpec{name("swa_cache"), static_cast<std::size_t>(config.cache.swa_blocks * swa_stride), 256,
                      MemoryKind::device,
                      shape({config.cache.swa_blocks, swa_stride}, "bytes (blocks x stride)")});
    if (r > 1) {
      const std::int64_t c_stride = cache_block_stride(static_cast<int>(config.cache.block_tokens / r));
      plan.add(SlotSpec{name("compressed_cache"), static_cast<std::size_t>(config.cache.compressed_blocks * c_stride),
                        256, MemoryKind::device,
                        shape({config.cache.compressed_blocks, c_stride}, "bytes (blocks x stride)")});
    }
    add_array(plan, name("out"), {T, l.h_q, l.d_v}, "bf16", 2);
    add_array(plan, name("lse"), {T, l.h_q}, "f32", 4);
    add_array(plan, name("max_logits"), {T, l.h_q}, "f32", 4);
  }

  for (const char* staging : slots::kStaging) {
    plan.add(SlotSpec{staging, meta.bytes(), 256, MemoryKind::pinned_host, shape({meta.words}, "int32 (staging)")});
  }
  return plan;
}

}  // namespace spg::memory
