// Sizing the pipeline pool from a PipelineConfig: see pipeline_pool.hpp and docs/memory.md.
#include "spgraph/graphs/pipeline_pool.hpp"

#include <algorithm>
#include <sstream>

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"

namespace spg::graphs {

using model::LayerConfig;
using memory::MemoryKind;
using model::PipelineConfig;
using memory::PoolPlan;
using memory::SlotSpec;

namespace {

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

bool is_bound(const LayerBuffers& b, LayerBuffer which) noexcept {
  switch (which) {
    case LayerBuffer::q: return bound(b.q);
    case LayerBuffer::topk_indices: return bound(b.topk_indices);
    case LayerBuffer::k_rows: return bound(b.k_rows);
    case LayerBuffer::compressed_k_rows: return bound(b.compressed_k_rows);
    case LayerBuffer::swa_cache: return bound(b.swa_cache);
    case LayerBuffer::compressed_cache: return bound(b.compressed_cache);
    case LayerBuffer::attn_sink: return bound(b.attn_sink);
    case LayerBuffer::out: return bound(b.out);
    case LayerBuffer::lse: return bound(b.lse);
    case LayerBuffer::max_logits: return bound(b.max_logits);
  }
  return false;
}

}  // namespace

std::string slots::layer_slot(std::size_t layer, LayerBuffer b) {
  return "layer" + std::to_string(layer) + "." + layer_buffer_name(b);
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

PoolPlan plan_pipeline_pool(const PipelineConfig& config, const std::vector<LayerBuffers>& bound, bool insert,
                            const StepBounds& step) {
  SPG_EXPECTS(bound.empty() || bound.size() == config.layers.size(),
              "buffers holds " << bound.size() << " entries; it must be empty or hold one per layer ("
                               << config.layers.size() << ")");
  return plan_pipeline_pool(
      config, [&](std::size_t layer, LayerBuffer b) { return !bound.empty() && is_bound(bound[layer], b); }, insert,
      step);
}

PoolPlan plan_pipeline_pool(const PipelineConfig& config, const std::function<bool(std::size_t, LayerBuffer)>& bound,
                            bool insert, const StepBounds& step) {
  config.validate();
  const std::int64_t R = config.max_requests;
  const std::int64_t T = config.max_tokens;
  const ChunkMetaLayout meta = ChunkMetaLayout::make(config);

  PoolPlan plan;
  plan.add(SlotSpec{slots::kChunkMeta, meta.bytes(), 256, MemoryKind::device,
                    shape({meta.words}, "int32 (chunk metadata)")});
  plan.add(SlotSpec{slots::kStepStatus, kStepStatusBytes, 256, MemoryKind::device, "StatusBlock (step and run faults)"});
  // One workspace, reused by every layer in turn: sized for the layer with the most rows.
  add_array(plan, slots::kKvWorkspace, {R, max_kv_rows(config), model::kHeadDim}, "bf16", 2);
  add_array(plan, slots::kCombined, {T, max_combined_width(config)}, "int32", 4);
  add_array(plan, slots::kCombinedLens, {T}, "int32", 4);

  for (std::size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& l = config.layers[i];
    for (const LayerBuffer b : kLayerBuffers) {
      if (!layer_uses(l, b, insert) || bound(i, b)) continue;
      const std::string name = slots::layer_slot(i, b);
      const auto rows = static_cast<std::int64_t>(b == LayerBuffer::swa_cache || b == LayerBuffer::compressed_cache
                                                      ? 0
                                                      : required_rows(config, l, b, step));
      switch (b) {
        case LayerBuffer::q: add_array(plan, name, {rows, l.h_q, l.d_qk}, "bf16", 2); break;
        case LayerBuffer::topk_indices: add_array(plan, name, {rows, l.top_k}, "int32", 4); break;
        case LayerBuffer::k_rows:
        case LayerBuffer::compressed_k_rows: add_array(plan, name, {rows, model::kHeadDim}, "bf16", 2); break;
        case LayerBuffer::swa_cache:
        case LayerBuffer::compressed_cache: {
          const kernels::CacheLayout c = required_cache(config, l, b);
          plan.add(SlotSpec{name, c.bytes(), 256, MemoryKind::device,
                            shape({c.num_blocks, c.block_stride}, "bytes (blocks x stride)")});
          break;
        }
        case LayerBuffer::attn_sink: add_array(plan, name, {l.h_q}, "f32", 4); break;
        case LayerBuffer::out: add_array(plan, name, {rows, l.h_q, l.d_v}, "bf16", 2); break;
        case LayerBuffer::lse:
        case LayerBuffer::max_logits: add_array(plan, name, {rows, l.h_q}, "f32", 4); break;
      }
    }
  }

  for (const char* staging : slots::kStaging) {
    plan.add(SlotSpec{staging, meta.bytes(), 256, MemoryKind::pinned_host, shape({meta.words}, "int32 (staging)")});
  }
  plan.add(SlotSpec{slots::kStagingRelease, kStagingReleaseBytes, 64, MemoryKind::pinned_host,
                    "uint32 [2][4] (staging release: sequence numbers, released)"});
  return plan;
}

}  // namespace spg::graphs
