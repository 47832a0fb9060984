// Pipeline: see pipeline.hpp.
#include "spgraph/graphs/pipeline.hpp"

#include <algorithm>

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/detail/trace.hpp"
#include "spgraph/kernels/stage_in/stage_in.hpp"

namespace spg::graphs {

namespace {

using model::LayerConfig;
using model::PipelineConfig;

kernels::SparseMlaArgs attention_args(const PipelineConfig& config, const LayerConfig& l, int r_bucket,
                                      int t_bucket) {
  kernels::SparseMlaArgs a{};
  a.kv_row_stride = model::kHeadDim;
  a.s_kv = static_cast<int>(std::int64_t{r_bucket} * config.max_kv_rows(l));
  a.topk = l.combined_width();  // the attention's index rows are the combined rows: top-k + window
  a.s_q = t_bucket;
  a.h_q = l.h_q;
  a.d_qk = l.d_qk;
  a.sm_scale = l.scale();
  return a;
}

/// Where a step's stages read their per-step data: the device metadata block (its layout), the
/// shared workspaces and the fault counters, for one bucket.
struct StepSources {
  const std::int32_t* words;  // the device metadata block
  ChunkMetaLayout meta;
  StepWorkspace ws;
  kernels::StepStatus* status;
  int r_bucket;
  int t_bucket;
  bool step_rows;  // a body of the step graph: every per-token row at the chunk's offset
  [[nodiscard]] const kernels::ChunkScalars& scalars(int ratio) const noexcept {
    return reinterpret_cast<const kernels::ChunkScalars*>(words + meta.scalars)[ratio_index(ratio)];
  }
};

void check_shape(const PipelineConfig& config, const PipelineBuffers& buffers, const std::vector<int>& layers,
                 int r_bucket, int t_bucket) {
  SPG_EXPECTS(r_bucket >= 1 && r_bucket <= config.max_requests,
              "r_bucket = " << r_bucket << " must be in [1, " << config.max_requests << "]");
  SPG_EXPECTS(t_bucket >= 1 && t_bucket <= config.max_tokens,
              "t_bucket = " << t_bucket << " must be in [1, " << config.max_tokens << "]");
  SPG_EXPECTS(!layers.empty(), "a layer program must hold at least one layer");
  SPG_EXPECTS(buffers.layers != nullptr && buffers.layers->size() == config.layers.size(),
              "Pipeline: the buffers must hold one LayerBuffers per layer of the config");
}

/// The insert stages: the SWA insert always, the compressed insert for a compressed layer. A chunk
/// given without slots has them derived from its block tables on the device.
void insert_stages(const PipelineConfig& config, const LayerConfig& l, const LayerBuffers& lb, const StepSources& src,
                   LayerLaunches& launch) {
  const ChunkMetaLayout& meta = src.meta;
  const std::int32_t* words = src.words;
  auto derive_from = [&](kernels::KvInsertArgs& ins, int ratio, const std::int32_t* table, int stride) {
    ins.derive = &src.scalars(ratio).derive_slots;
    ins.compress_ratio = ratio;
    ins.block_table = table;
    ins.block_table_stride = stride;
    ins.query_start_loc = words + meta.query_start_loc;
    ins.seq_lens = words + meta.seq_lens;
    ins.num_requests = &src.scalars(ratio).num_requests;
    ins.requests_bucket = src.r_bucket;
  };
  launch.insert_swa = true;
  launch.swa_insert = kernels::KvInsertArgs{lb.k_rows.data_handle(),  words + meta.swa_slots,
                                            &src.scalars(1).num_tokens, src.t_bucket,
                                            lb.swa_cache.data,        lb.swa_cache.layout,
                                            src.status};
  derive_from(launch.swa_insert, 1, words + meta.swa_block_table, meta.swa_table_width);
  if (src.step_rows) {  // the chunk's tokens' K rows, at its offset in the step's rows
    launch.swa_insert.row_offset = &src.scalars(1).token_offset;
    launch.swa_insert.source_rows = static_cast<std::int64_t>(lb.k_rows.extent(0));
  }
  kernels::KvInsert::can_implement(launch.swa_insert);
  const int r = l.compress_ratio;
  if (r > 1) {
    const int ri = ratio_index(r);
    const int rows = std::min(max_new_compressed_rows(src.t_bucket, src.r_bucket, r), ChunkMetaLayout::compressed_slot_capacity(config, r));
    launch.insert_compressed = true;
    launch.compressed_insert = kernels::KvInsertArgs{lb.compressed_k_rows.data_handle(),
                                                     words + meta.compressed_slots[ri],
                                                     &src.scalars(r).new_rows,
                                                     rows,
                                                     lb.compressed_cache.data,
                                                     lb.compressed_cache.layout,
                                                     src.status};
    derive_from(launch.compressed_insert, r, words + meta.compressed_block_table[ri], meta.compressed_table_width);
    if (src.step_rows) {  // the rows the chunk completes, after those of the step's earlier chunks
      launch.compressed_insert.row_offset = &src.scalars(r).new_row_offset;
      launch.compressed_insert.source_rows = static_cast<std::int64_t>(lb.compressed_k_rows.extent(0));
    }
    kernels::KvInsert::can_implement(launch.compressed_insert);
  }
}

/// The gather: the compressed rows and the window (one launch) for a compressed layer, the window
/// alone for an SWA-only one, into the shared kv workspace.
kernels::KvGatherArgs gather_stage(const PipelineConfig& config, const LayerConfig& l, const LayerBuffers& lb,
                                   const StepSources& src, bool overlap_prologue) {
  const ChunkMetaLayout& meta = src.meta;
  const int r = l.compress_ratio;
  kernels::KvGatherArgs g{};
  g.chunk = chunk_arrays(src.words, meta, r);
  g.compress_ratio = r;
  g.requests_bucket = src.r_bucket;
  g.max_rows_per_request = config.max_kv_rows(l);
  g.kv = src.ws.kv.data_handle();
  g.status = src.status;
  if (r > 1) {
    g.part = kernels::GatherPart::both;
    g.cache = lb.compressed_cache.data;
    g.layout = lb.compressed_cache.layout;
    g.block_table = src.words + meta.compressed_block_table[ratio_index(r)];
    g.block_table_stride = meta.compressed_table_width;
    g.window_cache = lb.swa_cache.data;
    g.window_layout = lb.swa_cache.layout;
    g.window_block_table = src.words + meta.swa_block_table;
    g.window_block_table_stride = meta.swa_table_width;
  } else {
    g.part = kernels::GatherPart::window;
    g.cache = lb.swa_cache.data;
    g.layout = lb.swa_cache.layout;
    g.block_table = src.words + meta.swa_block_table;
    g.block_table_stride = meta.swa_table_width;
  }
  g.overlap_prologue = overlap_prologue;
  kernels::KvGather::can_implement(g);
  return g;
}

/// The combine: each token's top-k picks and window into one index row of the shared workspace.
kernels::CombineIndicesArgs combine_stage(const LayerConfig& l, const LayerBuffers& lb, const StepSources& src) {
  const int r = l.compress_ratio;
  kernels::CombineIndicesArgs c{};
  c.topk_indices = r > 1 ? lb.topk_indices.data_handle() : nullptr;
  c.top_k = l.top_k;
  c.compress_ratio = r;
  c.window = l.window;
  c.chunk = chunk_arrays(src.words, src.meta, r);
  c.tokens_bucket = src.t_bucket;
  c.requests_bucket = src.r_bucket;
  c.combined = src.ws.combined_indices.data_handle();
  c.combined_width = l.combined_width();
  c.lens = src.ws.combined_lens.data_handle();
  c.status = src.status;
  if (src.step_rows) {
    c.token_offset = &src.scalars(r).token_offset;
    c.topk_rows = r > 1 ? static_cast<std::int64_t>(lb.topk_indices.extent(0)) : 0;
  }
  kernels::CombineIndices::can_implement(c);
  return c;
}

/// The attention over the gathered rows, with the combined index rows of `combine`.
kernels::SparseMlaArgs attention_stage(const PipelineConfig& config, const LayerConfig& l, const LayerBuffers& lb,
                                       const StepSources& src, const kernels::CombineIndicesArgs& combine) {
  kernels::SparseMlaArgs a = attention_args(config, l, src.r_bucket, src.t_bucket);
  a.q = lb.q.data_handle();
  a.q_token_stride = static_cast<std::int64_t>(lb.q.stride(0));
  a.kv = src.ws.kv.data_handle();
  a.indices = combine.combined;
  a.topk_length = combine.lens;
  a.attn_sink = l.attn_sink ? lb.attn_sink.data_handle() : nullptr;
  a.num_tokens = &src.scalars(l.compress_ratio).num_tokens;
  a.out = lb.out.data_handle();
  a.out_token_stride = static_cast<std::int64_t>(lb.out.stride(0));
  a.lse = lb.lse.data_handle();
  a.max_logits = lb.max_logits.data_handle();
  if (src.step_rows) {  // q and the outputs at the chunk's rows; out's descriptor spans all of out
    a.token_offset = &src.scalars(l.compress_ratio).token_offset;
    a.out_rows = static_cast<std::int64_t>(lb.out.extent(0));
  }
  kernels::SparseMla::can_implement(a);
  return a;
}

/// Kernels stage `s` of a layer launches: 0 for an insert the layer does not record, 2 for the
/// split-top-k attention (partials and merge), else 1.
int stage_kernels(const LayerLaunches& l, Stage s) noexcept {
  switch (s) {
    case Stage::insert_swa: return l.insert_swa ? 1 : 0;
    case Stage::insert_compressed: return l.insert_compressed ? 1 : 0;
    case Stage::gather: return 1;
    case Stage::combine: return 1;
    case Stage::attention: return l.attention_split ? 2 : 1;
  }
  return 0;
}

detail::TracePhase trace_phase(Stage s) noexcept {
  switch (s) {
    case Stage::insert_swa: return detail::TracePhase::insert_swa;
    case Stage::insert_compressed: return detail::TracePhase::insert_compressed;
    case Stage::gather: return detail::TracePhase::gather;
    case Stage::combine: return detail::TracePhase::combine;
    case Stage::attention: return detail::TracePhase::attention;
  }
  return detail::TracePhase::attention;
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
                   int r_bucket, int t_bucket, bool insert, bool step_rows)
    : r_bucket_(r_bucket), t_bucket_(t_bucket), step_rows_(step_rows) {
  check_shape(config, buffers, layers, r_bucket, t_bucket);
  const ChunkMetaLayout meta = ChunkMetaLayout::make(config);
  meta_bytes_ = meta.bytes();
  device_meta_ = reinterpret_cast<std::byte*>(buffers.chunk_meta);
  for (int s = 0; s < 2; ++s) {
    staging_[s] = buffers.staging[s];
    release_[s] = buffers.release[s];
  }
  status_block_ = buffers.status;
  SPG_EXPECTS(status_block_ != nullptr, "Pipeline: the buffers need a status block");
  status_ = &status_block_->step;
  for (int s = 0; s < 2; ++s) kernels::StageIn::can_implement(staging_[s], device_meta_, meta_bytes_, status_block_, release_[s]);

  const StepSources src{buffers.chunk_meta, meta, buffers.workspace, status_, r_bucket, t_bucket, step_rows};
  // Reads of the views below are in-bounds by construction: every view holds at least T (or
  // R x M_max) rows, and each stage touches only the bucket's.
  for (int index : layers) {
    SPG_EXPECTS(index >= 0 && index < static_cast<int>(config.layers.size()),
                "layer index " << index << " must be in [0, " << config.layers.size() << ")");
    const LayerConfig& l = config.layers[static_cast<std::size_t>(index)];
    const LayerBuffers& lb = (*buffers.layers)[static_cast<std::size_t>(index)];
    LayerLaunches launch;
    launch.layer = index;
    if (insert) insert_stages(config, l, lb, src, launch);
    // The gather resolves its rows while the kernel before it finishes, unless that kernel is the
    // stage-in, which writes the metadata and block tables the resolution reads.
    launch.gather = gather_stage(config, l, lb, src, /*overlap_prologue=*/insert || !layers_.empty());
    launch.combine = combine_stage(l, lb, src);
    launch.attention = attention_stage(config, l, lb, src, launch.combine);
    // Planned, its workspace carved and its descriptor encoded once: a step only launches it.
    launch.attention_launch = kernels::SparseMla::initialize(launch.attention, buffers.attention_workspace);
    launch.attention_split = launch.attention_launch.plan().split;  // + a merge kernel
    layers_.push_back(launch);
  }
}

int Pipeline::kernel_launches() const noexcept {
  int n = 1;  // the stage-in kernel
  for (const LayerLaunches& l : layers_) {
    for (const Stage s : kStages) n += stage_kernels(l, s);
  }
  return n;
}

cudaError_t Pipeline::record_stage_in(int staging, cudaStream_t stream) const noexcept {
  const detail::TraceRange range(detail::TracePhase::stage_in);
  return kernels::StageIn::run(staging_[staging & 1], device_meta_, meta_bytes_, status_block_, stream,
                               release_[staging & 1]);
}

cudaError_t Pipeline::record_stage(std::size_t layer, Stage s, cudaStream_t stream) const noexcept {
  if (layer >= layers_.size()) return cudaErrorInvalidValue;
  const LayerLaunches& l = layers_[layer];
  if ((s == Stage::insert_swa && !l.insert_swa) || (s == Stage::insert_compressed && !l.insert_compressed)) {
    return cudaSuccess;  // a stage this layer does not have
  }
  const detail::TraceRange range(trace_phase(s), l.layer);
  switch (s) {
    case Stage::insert_swa: return kernels::KvInsert::run(l.swa_insert, stream);
    case Stage::insert_compressed: return kernels::KvInsert::run(l.compressed_insert, stream);
    case Stage::gather: return kernels::KvGather::run(l.gather, stream);
    case Stage::combine: return kernels::CombineIndices::run(l.combine, stream);
    case Stage::attention: return l.attention_launch.run(stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t Pipeline::record(int staging, cudaStream_t stream) const noexcept {
  const cudaError_t e = record_stage_in(staging, stream);
  return e == cudaSuccess ? record_layers(stream) : e;
}

cudaError_t Pipeline::record_layers(cudaStream_t stream) const noexcept {
  cudaError_t e = cudaSuccess;
  for (std::size_t layer = 0; layer < layers_.size() && e == cudaSuccess; ++layer) {
    for (const Stage s : kStages) {
      e = record_stage(layer, s, stream);
      if (e != cudaSuccess) break;
    }
  }
  return e;
}

}  // namespace spg::graphs
