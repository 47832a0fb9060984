// Pipeline: see pipeline.hpp.
#include "graphs/pipeline.hpp"

#include <algorithm>

#include "memory/error.hpp"

namespace spg::graphs {

namespace {

using memory::ChunkMetaLayout;
using memory::LayerConfig;
using memory::PipelineConfig;
namespace slots = memory::slots;

kernels::SparseMlaArgs attention_args(const PipelineConfig& config, const LayerConfig& l, int r_bucket,
                                      int t_bucket) {
  kernels::SparseMlaArgs a{};
  a.kv_row_stride = memory::kHeadDim;
  a.s_kv = static_cast<int>(std::int64_t{r_bucket} * config.max_kv_rows(l));
  a.topk = l.combined_width();
  a.s_q = t_bucket;
  a.h_q = l.h_q;
  a.d_qk = l.d_qk;
  a.sm_scale = l.scale();
  return a;
}

}  // namespace

std::size_t Pipeline::attention_workspace_bytes(const PipelineConfig& config, const std::vector<int>& layers,
                                                int r_bucket, int t_bucket) {
  std::size_t bytes = 0;
  for (int i : layers) {
    const LayerConfig& l = config.layers[static_cast<std::size_t>(i)];
    bytes = std::max(bytes, kernels::SparseMla::workspace_bytes(attention_args(config, l, r_bucket, t_bucket)));
  }
  return bytes;
}

Pipeline::Pipeline(const PipelineConfig& config, const memory::BufferPool& pool, const std::vector<int>& layers,
                   int r_bucket, int t_bucket, bool insert, void* attention_workspace)
    : r_bucket_(r_bucket), t_bucket_(t_bucket), attention_workspace_(attention_workspace) {
  SPG_EXPECTS(r_bucket >= 1 && r_bucket <= config.max_requests,
              "r_bucket = " << r_bucket << " must be in [1, " << config.max_requests << "]");
  SPG_EXPECTS(t_bucket >= 1 && t_bucket <= config.max_tokens,
              "t_bucket = " << t_bucket << " must be in [1, " << config.max_tokens << "]");
  SPG_EXPECTS(!layers.empty(), "a layer program must hold at least one layer");
  const ChunkMetaLayout meta = ChunkMetaLayout::make(config);
  meta_bytes_ = meta.bytes();
  device_meta_ = pool.bytes(slots::kChunkMeta, meta_bytes_);
  for (int s = 0; s < 2; ++s) staging_[s] = pool.bytes(slots::kStaging[s], meta_bytes_);
  status_ = reinterpret_cast<kernels::StepStatus*>(pool.bytes(slots::kStepStatus, sizeof(kernels::StepStatus)));
  for (const void* staging : staging_) kernels::StageIn::can_implement(staging, device_meta_, meta_bytes_, status_);

  const auto* words = reinterpret_cast<const std::int32_t*>(device_meta_);
  const auto* scalars = reinterpret_cast<const kernels::ChunkScalars*>(words + meta.scalars);
  auto chunk_arrays = [&](int r) {
    return kernels::ChunkArrays{scalars + memory::ratio_index(r), words + meta.query_start_loc, words + meta.seq_lens,
                                words + meta.gather_lens};
  };
  const auto swa_layout = kernels::CacheLayout::make(config.cache.swa_block_size, config.cache.swa_blocks);

  for (int index : layers) {
    SPG_EXPECTS(index >= 0 && index < static_cast<int>(config.layers.size()),
                "layer index " << index << " must be in [0, " << config.layers.size() << ")");
    const LayerConfig& l = config.layers[static_cast<std::size_t>(index)];
    const auto li = static_cast<std::size_t>(index);
    auto slot = [&](const char* what) { return slots::layer_slot(li, what); };
    const int r = l.compress_ratio;
    const int ri = memory::ratio_index(r);
    const std::int64_t m_max = config.max_kv_rows(l);
    LayerLaunches launch;

    auto* swa_cache = reinterpret_cast<std::uint8_t*>(pool.bytes(slot("swa_cache"), swa_layout.bytes()));
    kernels::CacheLayout c_layout{};
    std::uint8_t* c_cache = nullptr;
    if (r > 1) {
      c_layout = kernels::CacheLayout::make(config.cache.block_tokens / r, config.cache.compressed_blocks);
      c_cache = reinterpret_cast<std::uint8_t*>(pool.bytes(slot("compressed_cache"), c_layout.bytes()));
    }

    if (insert) {
      launch.insert_swa = true;
      launch.swa_insert = kernels::KvInsertArgs{
          pool.span<__nv_bfloat16>(slot("k_rows"), std::size_t{1} * t_bucket * memory::kHeadDim).data(),
          words + meta.swa_slots, &scalars[0].num_tokens, t_bucket, swa_cache, swa_layout, status_};
      // A chunk given without slots has them derived from its block tables on the device.
      auto derive_from = [&](kernels::KvInsertArgs& ins, int ratio, const std::int32_t* table, int stride) {
        ins.derive = &scalars[memory::ratio_index(ratio)].derive_slots;
        ins.compress_ratio = ratio;
        ins.block_table = table;
        ins.block_table_stride = stride;
        ins.query_start_loc = words + meta.query_start_loc;
        ins.seq_lens = words + meta.seq_lens;
        ins.num_requests = &scalars[memory::ratio_index(ratio)].num_requests;
        ins.requests_bucket = r_bucket;
      };
      derive_from(launch.swa_insert, 1, words + meta.swa_block_table, meta.swa_table_width);
      kernels::KvInsert::can_implement(launch.swa_insert);
      if (r > 1) {
        const int rows = std::min(t_bucket / r + r_bucket, ChunkMetaLayout::compressed_slot_capacity(config, r));
        launch.insert_compressed = true;
        launch.compressed_insert = kernels::KvInsertArgs{
            pool.span<__nv_bfloat16>(slot("compressed_k_rows"), std::size_t{1} * rows * memory::kHeadDim).data(),
            words + meta.compressed_slots[ri], &scalars[ri].new_rows, rows, c_cache, c_layout, status_};
        derive_from(launch.compressed_insert, r, words + meta.compressed_block_table[ri], meta.compressed_table_width);
        kernels::KvInsert::can_implement(launch.compressed_insert);
      }
    }

    auto* kv = pool.span<__nv_bfloat16>(slots::kKvWorkspace,
                                        static_cast<std::size_t>(r_bucket * m_max * memory::kHeadDim))
                   .data();
    kernels::KvGatherArgs& g = launch.gather;
    g.chunk = chunk_arrays(r);
    g.compress_ratio = r;
    g.requests_bucket = r_bucket;
    g.max_rows_per_request = m_max;
    g.kv = kv;
    g.status = status_;
    if (r > 1) {
      g.part = kernels::GatherPart::both;
      g.cache = c_cache;
      g.layout = c_layout;
      g.block_table = words + meta.compressed_block_table[ri];
      g.block_table_stride = meta.compressed_table_width;
      g.window_cache = swa_cache;
      g.window_layout = swa_layout;
      g.window_block_table = words + meta.swa_block_table;
      g.window_block_table_stride = meta.swa_table_width;
    } else {
      g.part = kernels::GatherPart::window;
      g.cache = swa_cache;
      g.layout = swa_layout;
      g.block_table = words + meta.swa_block_table;
      g.block_table_stride = meta.swa_table_width;
    }
    // The gather resolves its rows while the kernel before it finishes, unless that kernel is the
    // stage-in, which writes the metadata and block tables the resolution reads.
    g.overlap_prologue = insert || !layers_.empty();
    kernels::KvGather::can_implement(g);

    const int width = l.combined_width();
    auto* combined = pool.span<std::int32_t>(slots::kCombined, std::size_t{1} * t_bucket * width).data();
    auto* lens = pool.span<std::int32_t>(slots::kTopkLens, static_cast<std::size_t>(t_bucket)).data();
    kernels::CombineIndicesArgs& c = launch.combine;
    c.topk_indices = r > 1 ? pool.span<std::int32_t>(slot("topk_indices"), std::size_t{1} * t_bucket * l.top_k).data()
                           : nullptr;
    c.top_k = l.top_k;
    c.compress_ratio = r;
    c.window = l.window;
    c.chunk = chunk_arrays(r);
    c.tokens_bucket = t_bucket;
    c.requests_bucket = r_bucket;
    c.combined = combined;
    c.combined_width = width;
    c.lens = lens;
    c.status = status_;
    kernels::CombineIndices::can_implement(c);

    kernels::SparseMlaArgs& a = launch.attention;
    a = attention_args(config, l, r_bucket, t_bucket);
    const std::size_t q_elems = std::size_t{1} * t_bucket * l.h_q * l.d_qk;
    const std::size_t o_elems = std::size_t{1} * t_bucket * l.h_q;
    a.q = pool.span<__nv_bfloat16>(slot("q"), q_elems).data();
    a.kv = kv;
    a.indices = combined;
    a.topk_length = lens;
    a.attn_sink = l.attn_sink ? pool.span<float>(slot("attn_sink"), static_cast<std::size_t>(l.h_q)).data() : nullptr;
    a.num_tokens = &scalars[ri].num_tokens;
    a.out = pool.span<__nv_bfloat16>(slot("out"), o_elems * l.d_v).data();
    a.lse = pool.span<float>(slot("lse"), o_elems).data();
    a.max_logits = pool.span<float>(slot("max_logits"), o_elems).data();
    kernels::SparseMla::can_implement(a);
    launch.attention_split = kernels::SparseMla::plan(a).split;  // + a merge kernel
    layers_.push_back(launch);
  }
}

int Pipeline::kernel_launches() const noexcept {
  int n = 0;
  for (const LayerLaunches& l : layers_) {
    n += 3 + (l.insert_swa ? 1 : 0) + (l.insert_compressed ? 1 : 0) + (l.attention_split ? 1 : 0);
  }
  return n;
}

cudaError_t Pipeline::record_stage(int stage, int staging, cudaStream_t stream) const noexcept {
  if (stage == 0) return kernels::StageIn::run(staging_[staging & 1], device_meta_, meta_bytes_, status_, stream);
  const LayerLaunches& l = layers_[static_cast<std::size_t>((stage - 1) / 5)];
  switch ((stage - 1) % 5) {
    case 0: return l.insert_swa ? kernels::KvInsert::run(l.swa_insert, nullptr, stream) : cudaSuccess;
    case 1: return l.insert_compressed ? kernels::KvInsert::run(l.compressed_insert, nullptr, stream) : cudaSuccess;
    case 2: return kernels::KvGather::run(l.gather, nullptr, stream);
    case 3: return kernels::CombineIndices::run(l.combine, nullptr, stream);
    default: return kernels::SparseMla::run(l.attention, attention_workspace_, stream);
  }
}

cudaError_t Pipeline::record(int staging, cudaStream_t stream) const noexcept {
  for (int stage = 0; stage < stage_count(); ++stage) {
    const cudaError_t e = record_stage(stage, staging, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace spg::graphs
