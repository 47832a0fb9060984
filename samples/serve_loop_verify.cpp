// See serve_loop_verify.hpp.
#include "samples/serve_loop_verify.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "spgraph/core/error.hpp"
#include "spgraph/kernels/reference/accuracy.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"
#include "spgraph/kernels/reference/pipeline_reference.hpp"

namespace spg::samples {

namespace ref = kernels::reference;
using graphs::kNumRatios;
using graphs::ratio_index;

kernels::SyntheticFrontArgs front_layers(const graphs::Executor& ex) {
  kernels::SyntheticFrontArgs a;
  const model::PipelineConfig& cfg = ex.config();
  a.num_layers = static_cast<int>(cfg.layers.size());
  for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
    const model::LayerConfig& layer = cfg.layers[l];
    const graphs::LayerBuffers& v = ex.layer(l);
    kernels::FrontLayer& f = a.layers[l];
    f.k_rows = v.k_rows.data_handle();
    f.compress_ratio = layer.compress_ratio;
    if (layer.compress_ratio > 1) {
      f.compressed_k_rows = v.compressed_k_rows.data_handle();
      f.topk_indices = v.topk_indices.data_handle();
      f.top_k = layer.top_k;
    }
  }
  return a;
}

kernels::SyntheticFrontArgs make_front_args(const kernels::SyntheticFrontArgs& layers,
                                            std::span<const std::int32_t> query_start_loc,
                                            std::span<const std::int32_t> seq_lens,
                                            const int (&new_compressed_rows)[kNumRatios], std::uint64_t seed,
                                            std::uint64_t step) {
  kernels::SyntheticFrontArgs a = layers;
  a.seed = seed;
  a.step = step;
  a.num_requests = static_cast<int>(seq_lens.size());
  SPG_EXPECTS(a.num_requests <= kernels::kFrontMaxRequests && query_start_loc.size() == seq_lens.size() + 1,
              "make_front_args: " << seq_lens.size() << " requests (at most " << kernels::kFrontMaxRequests
                                  << ") and " << query_start_loc.size() << " query_start_loc entries");
  a.num_tokens = query_start_loc.back();
  for (std::size_t b = 0; b < query_start_loc.size(); ++b) a.query_start_loc[b] = query_start_loc[b];
  for (std::size_t b = 0; b < seq_lens.size(); ++b) a.seq_lens[b] = seq_lens[b];
  for (int i = 0; i < kNumRatios; ++i) a.new_compressed_rows[i] = new_compressed_rows[i];
  kernels::SyntheticFront::can_implement(a);
  return a;
}

kernels::SyntheticFrontArgs make_front_args(const kernels::SyntheticFrontArgs& layers, const scheduler::ChunkPlan& plan,
                                            std::uint64_t seed, std::uint64_t step) {
  int new_rows[kNumRatios] = {0, 0, 0};
  for (const scheduler::ChunkCachePlan& c : plan.caches) {
    if (c.ratio > 1) new_rows[graphs::ratio_index(c.ratio)] = c.num_new_rows();
  }
  return make_front_args(layers, plan.query_start_loc, plan.seq_lens, new_rows, seed, step);
}

kernels::SyntheticFrontArgs make_step_front_args(const kernels::SyntheticFrontArgs& layers,
                                                 const scheduler::StepPlan& plan, std::uint64_t seed,
                                                 std::uint64_t step) {
  SPG_EXPECTS(!plan.chunks.empty(), "make_step_front_args: the step has no chunks");
  int tokens = 0;
  int shortest = plan.chunks.front().seq_lens.front();
  int new_rows[kNumRatios] = {0, 0, 0};
  // The step's rows: every chunk's tokens and completed compressed rows, in chunk order.
  for (const scheduler::ChunkPlan& c : plan.chunks) {
    tokens += c.num_tokens;
    for (const std::int32_t s : c.seq_lens) shortest = std::min(shortest, static_cast<int>(s));
    for (const scheduler::ChunkCachePlan& cache : c.caches) {
      if (cache.ratio == 1) continue;
      new_rows[graphs::ratio_index(cache.ratio)] += cache.num_new_rows();
    }
  }
  const std::int32_t qsl[2] = {0, tokens};
  const std::int32_t seq[1] = {shortest};
  return make_front_args(layers, qsl, seq, new_rows, seed, step);
}

Verifier::Verifier(graphs::Executor& ex, std::uint64_t seed) : ex_(ex), seed_(seed), rng_(seed ^ 0xabcdefULL) {
  if (ex.step_layout().max_chunks > 0) splitter_.emplace(ex.config(), ex.step_layout());
}

Verifier::Snapshot Verifier::snapshot(std::size_t layer, bool compressed, const std::vector<std::int32_t>& blocks) const {
  const graphs::PagedCache& cache = compressed ? ex_.layer(layer).compressed_cache : ex_.layer(layer).swa_cache;
  const auto stride = static_cast<std::size_t>(cache.layout.block_stride);
  Snapshot s;
  s.blocks = blocks;
  s.bytes.resize(blocks.size() * stride);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    SPG_CUDA_TRY(cudaMemcpy(s.bytes.data() + i * stride, cache.data + static_cast<std::size_t>(blocks[i]) * stride, stride,
                            cudaMemcpyDeviceToHost));
  }
  return s;
}

namespace {
std::vector<std::int32_t> referenced_blocks(const scheduler::ChunkCachePlan& c) {
  std::vector<std::int32_t> blocks;
  for (const auto& row : c.block_tables) blocks.insert(blocks.end(), row.begin(), row.end());
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  return blocks;
}
}  // namespace

void Verifier::snapshot_all(const std::vector<const scheduler::ChunkPlan*>& chunks) {
  ex_.synchronize();
  const model::PipelineConfig& cfg = ex_.config();
  swa_before_.clear();
  comp_before_.clear();
  // Every block any of the chunks references, each once.
  auto blocks_of = [&](int ratio) {
    std::vector<std::int32_t> blocks;
    for (const scheduler::ChunkPlan* c : chunks) {
      const std::vector<std::int32_t> b = referenced_blocks(c->cache(ratio));
      blocks.insert(blocks.end(), b.begin(), b.end());
    }
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    return blocks;
  };
  for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
    const int r = cfg.layers[l].compress_ratio;
    swa_before_.push_back(snapshot(l, false, blocks_of(1)));
    comp_before_.push_back(r > 1 ? snapshot(l, true, blocks_of(r)) : Snapshot{});
  }
}

void Verifier::before(const scheduler::ChunkPlan& plan) { snapshot_all({&plan}); }

void Verifier::before(const scheduler::StepPlan& step) {
  std::vector<const scheduler::ChunkPlan*> chunks;
  for (const scheduler::ChunkPlan& c : step.chunks) chunks.push_back(&c);
  snapshot_all(chunks);
}

namespace {

/// Block table rows of `cache` in compact ids (a block's place in `snap`), R_bucket x width, -1 padded.
std::vector<std::int32_t> compact_table(const std::vector<std::int32_t>& snapshot_blocks,
                                        const scheduler::ChunkCachePlan& cache, int r_bucket, int width) {
  std::unordered_map<std::int32_t, std::int32_t> index;
  for (std::size_t i = 0; i < snapshot_blocks.size(); ++i) index[snapshot_blocks[i]] = static_cast<std::int32_t>(i);
  std::vector<std::int32_t> t(static_cast<std::size_t>(r_bucket) * width, -1);
  for (std::size_t b = 0; b < cache.block_tables.size(); ++b) {
    for (std::size_t k = 0; k < cache.block_tables[b].size(); ++k) {
      t[b * static_cast<std::size_t>(width) + k] = index.at(cache.block_tables[b][k]);
    }
  }
  return t;
}

/// The model front's query rows of the sampled tokens (others zero), [t_bucket, h_q * d_qk]:
/// token t's is the query buffer's row token_offset + t.
std::vector<std::uint16_t> front_queries(std::uint64_t seed, std::size_t l, const model::LayerConfig& layer,
                                         int t_bucket, const std::vector<int>& tokens, int token_offset) {
  const std::size_t row = static_cast<std::size_t>(layer.h_q) * layer.d_qk;
  std::vector<std::uint16_t> q(static_cast<std::size_t>(t_bucket) * row, 0);
  for (int t : tokens) {
    const std::size_t src = static_cast<std::size_t>(token_offset + t) * row;
    for (std::size_t k = 0; k < row; ++k) {
      q[static_cast<std::size_t>(t) * row + k] =
          ref::bf16_round(kernels::front_q_value(seed, static_cast<int>(l), src + k));
    }
  }
  return q;
}

/// The model front's top-k rows of every real token, [t_bucket, top_k], -1 padded: token t's is
/// the front's row token_offset + t, drawn for its request's seq_len (or for `topk_seq_len` when
/// positive: a step's front draws every row for the step's shortest sequence).
std::vector<std::int32_t> front_topk_rows(std::uint64_t seed, std::uint64_t step, std::size_t l,
                                          const model::LayerConfig& layer, const scheduler::ChunkPlan& plan,
                                          int t_bucket, int token_offset, int topk_seq_len) {
  const int r = layer.compress_ratio;
  std::vector<std::int32_t> topk(static_cast<std::size_t>(t_bucket) * layer.top_k, -1);
  for (int b = 0; b < plan.num_requests; ++b) {
    const int rows = (topk_seq_len > 0 ? topk_seq_len : plan.seq_lens[static_cast<std::size_t>(b)]) / r;
    for (int t = plan.query_start_loc[static_cast<std::size_t>(b)]; t < plan.query_start_loc[static_cast<std::size_t>(b) + 1]; ++t) {
      for (int j = 0; j < layer.top_k; ++j) {
        topk[static_cast<std::size_t>(t) * layer.top_k + j] =
            kernels::front_topk(seed, step, static_cast<int>(l), token_offset + t, j, layer.top_k, rows);
      }
    }
  }
  return topk;
}

/// The sinks serve_loop uploads for layer `l` (empty when the layer has none).
std::vector<float> front_sinks(std::uint64_t seed, std::size_t l, const model::LayerConfig& layer) {
  std::vector<float> sink;
  if (layer.attn_sink) {
    for (int h = 0; h < layer.h_q; ++h) sink.push_back(4.0F * kernels::front_q_value(seed + 7, static_cast<int>(l), static_cast<std::uint64_t>(h)));
  }
  return sink;
}

unsigned fault_total(const ref::FaultLog& log) {
  return static_cast<unsigned>(log.counts[0] + log.counts[1] + log.counts[2] + log.counts[3] + log.counts[4]);
}

/// Placement::step_chunk of a chunk run alone, and of what a step's cache check covers: the whole step.
constexpr int kChunkAlone = -1;
constexpr int kWholeStep = -2;

/// "chunk N" (a chunk run alone, N the front's counter), "step N chunk c" (a step's chunk c) or
/// "step N" (the whole step).
void print_where(std::uint64_t front_step, int step_chunk) {
  if (step_chunk == kChunkAlone) {
    std::fprintf(stderr, "verify: chunk %llu", static_cast<unsigned long long>(front_step));
  } else if (step_chunk == kWholeStep) {
    std::fprintf(stderr, "verify: step %llu", static_cast<unsigned long long>(front_step));
  } else {
    std::fprintf(stderr, "verify: step %llu chunk %d", static_cast<unsigned long long>(front_step), step_chunk);
  }
}

}  // namespace

std::vector<int> Verifier::sample_tokens(int num_tokens) {
  // The first, the last and up to six more.
  std::vector<int> tokens{0, num_tokens - 1};
  for (int i = 0; i < 6 && num_tokens > 2; ++i) tokens.push_back(static_cast<int>(rng_() % static_cast<std::uint64_t>(num_tokens)));
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  return tokens;
}

kernels::CacheLayout Verifier::insert_reference(std::size_t l, Snapshot& state, bool compressed,
                                                const scheduler::ChunkCachePlan& cache, const Placement& at,
                                                bool& ok) const {
  // The CPU insert of the front's rows into `state`: the chunk's K rows start at its token offset
  // (SWA) or its new-row offset (compressed) in the front's buffers.
  const kernels::CacheLayout& layout = compressed ? ex_.layer(l).compressed_cache.layout : ex_.layer(l).swa_cache.layout;
  const int rows_per_block = layout.block_size;
  const auto compact = kernels::CacheLayout::make(
      rows_per_block, static_cast<int>(std::max<std::size_t>(1, state.blocks.size())), layout.block_stride);
  const int row_offset = compressed ? at.rows.new_row_offset[ratio_index(cache.ratio)] : at.rows.token_offset;
  std::unordered_map<std::int32_t, std::int32_t> index;
  for (std::size_t i = 0; i < state.blocks.size(); ++i) index[state.blocks[i]] = static_cast<std::int32_t>(i);
  std::vector<std::int32_t> slots;
  std::vector<std::uint16_t> rows;
  for (std::size_t i = 0; i < cache.slot_mapping.size(); ++i) {
    const std::int32_t s = cache.slot_mapping[i];
    slots.push_back(index.at(s / rows_per_block) * rows_per_block + s % rows_per_block);
    for (int d = 0; d < model::kHeadDim; ++d) {
      rows.push_back(ref::bf16_round(kernels::front_k_value(seed_, at.front_step, 2 * static_cast<int>(l) + (compressed ? 1 : 0),
                                                            row_offset + static_cast<int>(i), d)));
    }
  }
  ref::FaultLog log;
  if (!slots.empty()) {
    ref::kv_insert(rows.data(), slots.data(), static_cast<int>(slots.size()), static_cast<int>(slots.size()),
                   state.bytes.data(), compact, log);
  }
  if (log.counts != decltype(log.counts){}) {
    print_where(at.front_step, at.step_chunk);
    std::fprintf(stderr, " layer %zu: %u faults in the reference %s insert\n", l, fault_total(log),
                 compressed ? "compressed" : "SWA");
    ok = false;
  }
  return compact;
}

bool Verifier::cache_matches(std::size_t l, const Snapshot& state, bool compressed, const Placement& at) const {
  const Snapshot after_dev = snapshot(l, compressed, state.blocks);
  if (after_dev.bytes != state.bytes) {
    print_where(at.front_step, at.step_chunk);
    std::fprintf(stderr, " layer %zu: %s cache bytes after insert differ from the reference\n", l,
                 compressed ? "compressed" : "SWA");
    return false;
  }
  return true;
}

bool Verifier::outputs_match(std::size_t l, const std::vector<int>& tokens, const ref::SparseMlaReferenceOutputs& want,
                             const ref::FaultLog& log, const Placement& at) const {
  // The accuracy bars of docs/pipeline.md, over the sampled tokens, at the chunk's rows.
  const std::size_t h = static_cast<std::size_t>(ex_.config().layers[l].h_q);
  std::vector<std::uint16_t> out(tokens.size() * h * 512);
  std::vector<float> lse(tokens.size() * h);
  std::vector<float> mx(tokens.size() * h);
  const graphs::LayerBuffers& v = ex_.layer(l);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto t = static_cast<std::size_t>(at.rows.token_offset + tokens[i]);
    SPG_CUDA_TRY(cudaMemcpy(out.data() + i * h * 512, v.out.data_handle() + v.out.mapping()(t, 0, 0), h * 1024, cudaMemcpyDeviceToHost));
    SPG_CUDA_TRY(cudaMemcpy(lse.data() + i * h, v.lse.data_handle() + v.lse.mapping()(t, 0), h * 4, cudaMemcpyDeviceToHost));
    SPG_CUDA_TRY(cudaMemcpy(mx.data() + i * h, v.max_logits.data_handle() + v.max_logits.mapping()(t, 0), h * 4, cudaMemcpyDeviceToHost));
  }
  const ref::AccuracyScore s_out = ref::score_out(out, want.out);
  const ref::AccuracyScore s_lse = ref::score_stat(lse, want.lse);
  const ref::AccuracyScore s_max = ref::score_stat(mx, want.max_logits);
  const double worst = std::max({s_out.worst, s_lse.worst, s_max.worst});
  if (!s_out.out_ok() || !s_lse.stat_ok() || !s_max.stat_ok() || log.counts != decltype(log.counts){}) {
    print_where(at.front_step, at.step_chunk);
    std::fprintf(stderr, " layer %zu: worst error %.3g x the bar, %u reference faults\n", l, worst, fault_total(log));
    return false;
  }
  return true;
}

bool Verifier::verify_layer(const scheduler::ChunkPlan& plan, std::size_t l, int bucket, const std::vector<int>& tokens,
                            const Placement& at) {
  const model::PipelineConfig& cfg = ex_.config();
  const model::LayerConfig& layer = cfg.layers[l];
  const int r = layer.compress_ratio;
  const int r_bucket = ex_.buckets().r_of(bucket);
  const int t_bucket = ex_.buckets().t_of(bucket);
  const graphs::ChunkMetaLayout meta = graphs::ChunkMetaLayout::make(cfg);
  bool ok = true;

  // 1. The insert stage on the expected caches (compared with the device's by the caller).
  const auto swa_compact = insert_reference(l, swa_before_[l], false, plan.cache(1), at, ok);
  kernels::CacheLayout c_compact{};
  if (r > 1) c_compact = insert_reference(l, comp_before_[l], true, plan.cache(r), at, ok);

  // 2. Gather, combine, attention on the sampled tokens, from the caches as inserted.
  const auto swa_table = compact_table(swa_before_[l].blocks, plan.cache(1), r_bucket, meta.swa_table_width);
  const auto c_table = r > 1 ? compact_table(comp_before_[l].blocks, plan.cache(r), r_bucket, meta.compressed_table_width)
                             : std::vector<std::int32_t>{};
  const std::vector<std::uint16_t> q = front_queries(seed_, l, layer, t_bucket, tokens, at.rows.token_offset);
  const std::vector<std::int32_t> topk =
      r > 1 ? front_topk_rows(seed_, at.front_step, l, layer, plan, t_bucket, at.rows.token_offset, at.topk_seq_len)
            : std::vector<std::int32_t>{};
  const std::vector<int> q_lens(plan.query_lens.begin(), plan.query_lens.end());
  const std::vector<int> s_lens(plan.seq_lens.begin(), plan.seq_lens.end());
  ref::LayerStepInputs in;
  in.layer = &layer;
  in.swa = ref::CacheView{swa_before_[l].bytes.data(), swa_compact, swa_table.data(), meta.swa_table_width};
  if (r > 1) in.compressed = ref::CacheView{comp_before_[l].bytes.data(), c_compact, c_table.data(), meta.compressed_table_width};
  in.chunk = ref::make_host_chunk(q_lens, s_lens, r, layer.window, r_bucket);
  in.r_bucket = r_bucket;
  in.t_bucket = t_bucket;
  in.max_rows_per_request = cfg.max_kv_rows(layer);
  in.q = q.data();
  in.topk = r > 1 ? topk.data() : nullptr;
  const std::vector<float> sinks = front_sinks(seed_, l, layer);  // in.attn_sink views it: keep it alive
  in.attn_sink = sinks;
  in.tokens = tokens;
  ref::FaultLog log;
  const ref::SparseMlaReferenceOutputs want = ref::layer_step_reference(in, log);

  // 3. The device's outputs against the reference's.
  return outputs_match(l, tokens, want, log, at) && ok;
}

void Verifier::after(const scheduler::ChunkPlan& plan, int bucket, std::uint64_t step) {
  ex_.synchronize();
  const std::vector<int> tokens = sample_tokens(plan.num_tokens);
  const Placement at{step, kChunkAlone, {}, 0};
  bool ok = true;
  for (std::size_t l = 0; l < ex_.config().layers.size(); ++l) {
    ok = verify_layer(plan, l, bucket, tokens, at) && ok;
    ok = cache_matches(l, swa_before_[l], false, at) && ok;
    if (ex_.config().layers[l].compress_ratio > 1) ok = cache_matches(l, comp_before_[l], true, at) && ok;
  }
  ++chunks_checked_;
  ok ? ++passed_ : ++failed_;
}

bool Verifier::split_matches(const scheduler::StepPlan& step, std::uint64_t front_step) {
  SPG_EXPECTS(splitter_.has_value(), "Verifier: a step needs an executor with step options (max_step_requests)");
  const graphs::StepSplit split = splitter_->split(step.input());
  bool same = split.status == graphs::RunStatus::ok && split.chunks == static_cast<int>(step.chunks.size());
  for (int c = 0; same && c < split.chunks; ++c) {
    const graphs::ChunkInput in = splitter_->chunk(c);
    const scheduler::ChunkPlan& plan = step.chunks[static_cast<std::size_t>(c)];
    same = in.requests.size() == static_cast<std::size_t>(plan.num_requests);
    for (std::size_t b = 0; same && b < in.requests.size(); ++b) {
      same = in.requests[b].query_len == plan.query_lens[b] && in.requests[b].seq_len == plan.seq_lens[b];
    }
  }
  if (!same) {
    print_where(front_step, kWholeStep);
    std::fprintf(stderr, " (scheduler step %lld): the executor splits it into %d chunks (status %s), not the scheduler's %zu\n",
                 static_cast<long long>(step.step), split.chunks, graphs::run_status_name(split.status), step.chunks.size());
  }
  return same;
}

void Verifier::after(const scheduler::StepPlan& step, std::uint64_t front_step) {
  ex_.synchronize();
  const model::PipelineConfig& cfg = ex_.config();
  const bool split_ok = split_matches(step, front_step);
  bool ok = split_ok;
  // Each chunk's rows of the step and its draws, in the step's order.
  std::vector<Placement> at;
  std::vector<std::vector<int>> tokens;
  std::vector<int> buckets;
  int shortest = step.chunks.front().seq_lens.front();
  for (const scheduler::ChunkPlan& c : step.chunks) {
    for (const std::int32_t s : c.seq_lens) shortest = std::min(shortest, static_cast<int>(s));
  }
  graphs::ChunkRows rows{};
  for (std::size_t c = 0; c < step.chunks.size(); ++c) {
    const scheduler::ChunkPlan& plan = step.chunks[c];
    at.push_back(Placement{front_step, static_cast<int>(c), rows, shortest});
    tokens.push_back(sample_tokens(plan.num_tokens));
    buckets.push_back(ex_.buckets().lookup(plan.num_requests, plan.num_tokens));
    rows.token_offset += plan.num_tokens;
    for (const scheduler::ChunkCachePlan& cache : plan.caches) {
      if (cache.ratio > 1) rows.new_row_offset[ratio_index(cache.ratio)] += cache.num_new_rows();
    }
  }
  const Placement whole{front_step, kWholeStep, rows, shortest};
  for (std::size_t l = 0; split_ok && l < cfg.layers.size(); ++l) {
    // The chunks in order on the expected caches (chunk c's reference sees chunks 0 .. c's inserts,
    // as the device's chunk c did), then the caches once against the device's after the step.
    for (std::size_t c = 0; c < step.chunks.size(); ++c) {
      ok = verify_layer(step.chunks[c], l, buckets[c], tokens[c], at[c]) && ok;
    }
    ok = cache_matches(l, swa_before_[l], false, whole) && ok;
    if (cfg.layers[l].compress_ratio > 1) ok = cache_matches(l, comp_before_[l], true, whole) && ok;
  }
  chunks_checked_ += static_cast<int>(step.chunks.size());
  ok ? ++passed_ : ++failed_;
}

}  // namespace spg::samples
