// Pipeline: see pipeline.hpp.
#include "graphs/pipeline.hpp"

#include <algorithm>

#include "kernels/stage_in/stage_in.hpp"
#include "memory/error.hpp"

namespace spg::graphs {

namespace {

using memory::LayerConfig;
using memory::PipelineConfig;

kernels::SparseMlaArgs attention_args(const PipelineConfig& config, const LayerConfig& l, int r_bucket,
                                      int t_bucket) {
  kernels::SparseMlaArgs a{};
  a.kv_row_stride = memory::kHeadDim;
  a.s_kv = static_cast<int>(std::int64_t{r_bucket} * config.max_kv_rows(l));
  a.topk = l.combined_width();  // the attention's index rows are the combined rows: top-k + window
  a.s_q = t_bucket;
  a.h_q = l.h_q;
  a.d_qk = l.d_qk;
  a.sm_scale = l.scale();
  return a;
}

}  // namespace

const char* stage_name(Stage s) noexcept {
  switch (s) {
    case Stage::insert_swa: return "insert-swa";
    case Stage::insert_compressed: return "insert-compressed";
    case Stage::gather: return "gather";
    case Stage::combine: return "combine";
    case Stage::attention: return "attention";
  }
  return "?";
}

std::size_t Pipeline::attention_workspace_bytes(const PipelineConfig& config, const std::vector<int>& layers,
                                                int r_bucket, int t_bucket) {
  std::size_t bytes = 0;
  for (int i : layers) {
    const LayerConfig& l = config.layers[static_cast<std::size_t>(i)];
    bytes = std::max(bytes, kernels::SparseMla::workspace_bytes(attention_args(config, l, r_bucket, t_bucket)));
  }
  return bytes;
}

Pipeline::Pipeline(const PipelineConfig& config, const PipelineBuffers& buffers, const std::vector<int>& layers,
                   int r_bucket, int t_bucket, bool insert)
    : r_bucket_(r_bucket), t_bucket_(t_bucket), attention_workspace_(buffers.attention_workspace) {
  SPG_EXPECTS(r_bucket >= 1 && r_bucket <= config.max_requests,
              "r_bucket = " << r_bucket << " must be in [1, " << config.max_requests << "]");
  SPG_EXPECTS(t_bucket >= 1 && t_bucket <= config.max_tokens,
              "t_bucket = " << t_bucket << " must be in [1, " << config.max_tokens << "]");
  SPG_EXPECTS(!layers.empty(), "a layer program must hold at least one layer");
  SPG_EXPECTS(buffers.layers != nullptr && buffers.layers->size() == config.layers.size(),
              "Pipeline: the buffers must hold one LayerBuffers per layer of the config");
  const ChunkMetaLayout meta = ChunkMetaLayout::make(config);
  meta_bytes_ = meta.bytes();
  device_meta_ = reinterpret_cast<std::byte*>(buffers.chunk_meta);
  for (int s = 0; s < 2; ++s) staging_[s] = buffers.staging[s];
  status_block_ = buffers.status;
  SPG_EXPECTS(status_block_ != nullptr, "Pipeline: the buffers need a status block");
  status_ = &status_block_->step;
  for (const std::byte* staging : staging_) {
    kernels::StageIn::can_implement(staging, device_meta_, meta_bytes_, status_block_);
  }

  const std::int32_t* words = buffers.chunk_meta;
  const auto* scalars = reinterpret_cast<const kernels::ChunkScalars*>(words + meta.scalars);
  const StepWorkspace& ws = buffers.workspace;
  // Reads of the views below are in-bounds by construction: every view holds at least T (or
  // R x M_max) rows, and each stage touches only the bucket's.
  for (int index : layers) {
    SPG_EXPECTS(index >= 0 && index < static_cast<int>(config.layers.size()),
                "layer index " << index << " must be in [0, " << config.layers.size() << ")");
    const LayerConfig& l = config.layers[static_cast<std::size_t>(index)];
    const LayerBuffers& lb = (*buffers.layers)[static_cast<std::size_t>(index)];
    const int r = l.compress_ratio;
    const int ri = ratio_index(r);
    const std::int64_t m_max = config.max_kv_rows(l);
    LayerLaunches launch;

    if (insert) {
      launch.insert_swa = true;
      launch.swa_insert = kernels::KvInsertArgs{lb.k_rows.data_handle(),   words + meta.swa_slots,
                                                &scalars[0].num_tokens,    t_bucket,
                                                lb.swa_cache.data,         lb.swa_cache.layout,
                                                status_};
      // A chunk given without slots has them derived from its block tables on the device.
      auto derive_from = [&](kernels::KvInsertArgs& ins, int ratio, const std::int32_t* table, int stride) {
        ins.derive = &scalars[ratio_index(ratio)].derive_slots;
        ins.compress_ratio = ratio;
        ins.block_table = table;
        ins.block_table_stride = stride;
        ins.query_start_loc = words + meta.query_start_loc;
        ins.seq_lens = words + meta.seq_lens;
        ins.num_requests = &scalars[ratio_index(ratio)].num_requests;
        ins.requests_bucket = r_bucket;
      };
      derive_from(launch.swa_insert, 1, words + meta.swa_block_table, meta.swa_table_width);
      kernels::KvInsert::can_implement(launch.swa_insert);
      if (r > 1) {
        const int rows = std::min(max_new_compressed_rows(t_bucket, r_bucket, r), ChunkMetaLayout::compressed_slot_capacity(config, r));
        launch.insert_compressed = true;
        launch.compressed_insert = kernels::KvInsertArgs{lb.compressed_k_rows.data_handle(),
                                                         words + meta.compressed_slots[ri],
                                                         &scalars[ri].new_rows,
                                                         rows,
                                                         lb.compressed_cache.data,
                                                         lb.compressed_cache.layout,
                                                         status_};
        derive_from(launch.compressed_insert, r, words + meta.compressed_block_table[ri], meta.compressed_table_width);
        kernels::KvInsert::can_implement(launch.compressed_insert);
      }
    }

    kernels::KvGatherArgs& g = launch.gather;
    g.chunk = chunk_arrays(words, meta, r);
    g.compress_ratio = r;
    g.requests_bucket = r_bucket;
    g.max_rows_per_request = m_max;
    g.kv = ws.kv.data_handle();
    g.status = status_;
    if (r > 1) {
      g.part = kernels::GatherPart::both;
      g.cache = lb.compressed_cache.data;
      g.layout = lb.compressed_cache.layout;
      g.block_table = words + meta.compressed_block_table[ri];
      g.block_table_stride = meta.compressed_table_width;
      g.window_cache = lb.swa_cache.data;
      g.window_layout = lb.swa_cache.layout;
      g.window_block_table = words + meta.swa_block_table;
      g.window_block_table_stride = meta.swa_table_width;
    } else {
      g.part = kernels::GatherPart::window;
      g.cache = lb.swa_cache.data;
      g.layout = lb.swa_cache.layout;
      g.block_table = words + meta.swa_block_table;
      g.block_table_stride = meta.swa_table_width;
    }
    // The gather resolves its rows while the kernel before it finishes, unless that kernel is the
    // stage-in, which writes the metadata and block tables the resolution reads.
    g.overlap_prologue = insert || !layers_.empty();
    kernels::KvGather::can_implement(g);

    const int width = l.combined_width();
    kernels::CombineIndicesArgs& c = launch.combine;
    c.topk_indices = r > 1 ? lb.topk_indices.data_handle() : nullptr;
    c.top_k = l.top_k;
    c.compress_ratio = r;
    c.window = l.window;
    c.chunk = chunk_arrays(words, meta, r);
    c.tokens_bucket = t_bucket;
    c.requests_bucket = r_bucket;
    c.combined = ws.combined_indices.data_handle();
    c.combined_width = width;
    c.lens = ws.combined_lens.data_handle();
    c.status = status_;
    kernels::CombineIndices::can_implement(c);

    kernels::SparseMlaArgs& a = launch.attention;
    a = attention_args(config, l, r_bucket, t_bucket);
    a.q = lb.q.data_handle();
    a.q_token_stride = static_cast<std::int64_t>(lb.q.stride(0));
    a.kv = ws.kv.data_handle();
    a.indices = c.combined;
    a.topk_length = c.lens;
    a.attn_sink = l.attn_sink ? lb.attn_sink.data_handle() : nullptr;
    a.num_tokens = &scalars[ri].num_tokens;
    a.out = lb.out.data_handle();
    a.out_token_stride = static_cast<std::int64_t>(lb.out.stride(0));
    a.lse = lb.lse.data_handle();
    a.max_logits = lb.max_logits.data_handle();
    kernels::SparseMla::can_implement(a);
    launch.attention_split = kernels::SparseMla::plan(a).split;  // + a merge kernel
    layers_.push_back(launch);
  }
}

int Pipeline::kernel_launches() const noexcept {
  int n = 1;  // the stage-in kernel
  for (const LayerLaunches& l : layers_) {
    n += 3 + (l.insert_swa ? 1 : 0) + (l.insert_compressed ? 1 : 0) + (l.attention_split ? 1 : 0);
  }
  return n;
}

cudaError_t Pipeline::record_stage_in(int staging, cudaStream_t stream) const noexcept {
  return kernels::StageIn::run(staging_[staging & 1], device_meta_, meta_bytes_, status_block_, stream);
}

cudaError_t Pipeline::record_stage(std::size_t layer, Stage s, cudaStream_t stream) const noexcept {
  if (layer >= layers_.size()) return cudaErrorInvalidValue;
  const LayerLaunches& l = layers_[layer];
  switch (s) {
    case Stage::insert_swa: return l.insert_swa ? kernels::KvInsert::run(l.swa_insert, nullptr, stream) : cudaSuccess;
    case Stage::insert_compressed:
      return l.insert_compressed ? kernels::KvInsert::run(l.compressed_insert, nullptr, stream) : cudaSuccess;
    case Stage::gather: return kernels::KvGather::run(l.gather, nullptr, stream);
    case Stage::combine: return kernels::CombineIndices::run(l.combine, nullptr, stream);
    case Stage::attention: return kernels::SparseMla::run(l.attention, attention_workspace_, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t Pipeline::record(int staging, cudaStream_t stream) const noexcept {
  cudaError_t e = record_stage_in(staging, stream);
  for (std::size_t layer = 0; layer < layers_.size() && e == cudaSuccess; ++layer) {
    for (const Stage s : kStages) {
      e = record_stage(layer, s, stream);
      if (e != cudaSuccess) break;
    }
  }
  return e;
}

}  // namespace spg::graphs
