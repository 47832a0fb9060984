// Host-side world for executor tests: random caches and inputs in the pool, random chunks with
// consistent block tables and insert slots, and the whole-pipeline CPU reference built from the
// per-stage references in src/spgraph/kernels/reference/.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/kernels/reference/accuracy.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"
#include "spgraph/kernels/reference/pipeline_reference.hpp"

namespace spg::test {

namespace ref = kernels::reference;
using graphs::kNumRatios;
using graphs::ratio_index;
using model::kHeadDim;

/// Copies host rows into a view's rows (any row stride): rows of the view's inner extents, packed.
template <class T, class View>
void upload_rows(const View& v, const T* host, std::size_t rows) {
  std::size_t row = 1;
  for (std::size_t i = 1; i < v.rank(); ++i) row *= v.extent(i);
  SPG_CUDA_TRY(cudaMemcpy2D(v.data_handle(), v.stride(0) * sizeof(T), host, row * sizeof(T), row * sizeof(T), rows,
                            cudaMemcpyHostToDevice));
}
/// Copies a view's first `rows` rows to the host, packed.
template <class T, class View>
std::vector<T> download_rows(const View& v, std::size_t rows) {
  std::size_t row = 1;
  for (std::size_t i = 1; i < v.rank(); ++i) row *= v.extent(i);
  std::vector<T> host(rows * row);
  SPG_CUDA_TRY(cudaMemcpy2D(host.data(), row * sizeof(T), v.data_handle(), v.stride(0) * sizeof(T), row * sizeof(T), rows,
                            cudaMemcpyDeviceToHost));
  return host;
}

/// A small three-layer program (C4A, SWA-only, C128A) with odd cache sizes.
inline model::PipelineConfig small_program() {
  model::PipelineConfig c;
  c.max_requests = 4;
  c.max_tokens = 64;
  c.max_model_len = 1536;
  c.layers = {model::LayerConfig{64, 512, 512, 128, 4, 512, 0.0F, true},
              model::LayerConfig{64, 512, 512, 128, 1, 0, 0.0F, false},
              model::LayerConfig{128, 512, 512, 128, 128, 64, 0.0F, true}};
  c.cache.swa_block_size = 64;
  c.cache.block_tokens = 256;
  c.cache.swa_blocks = 103;
  c.cache.compressed_blocks = 29;
  return c;
}

inline std::uint16_t random_bf16(std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> n(0.0F, scale);
  return ref::bf16_round(n(rng));
}

/// One chunk's host data (owning) and its ChunkInput view.
struct ChunkData {
  std::vector<graphs::RequestInput> requests;
  std::vector<std::vector<std::int32_t>> swa_blocks;
  std::vector<std::vector<std::int32_t>> compressed_blocks[kNumRatios];
  std::vector<std::int32_t> swa_slots;
  std::vector<std::int32_t> compressed_slots[kNumRatios];
  std::vector<int> compressed_source[kNumRatios];  // new compressed row -> token that completed it

  graphs::ChunkInput input() const {
    graphs::ChunkInput in;
    in.requests = requests;
    in.swa_slots = swa_slots;
    for (int i = 0; i < kNumRatios; ++i) in.compressed_slots[i] = compressed_slots[i];
    return in;
  }
  int tokens() const { return input().num_tokens(); }
};

/// Random caches, q, top-k indices, sinks and new K rows for every layer, mirrored on the host.
class World {
 public:
  World(graphs::Executor& ex, std::uint64_t seed) : ex_(ex), cfg_(ex.config()), rng_(seed) {
    const std::size_t L = cfg_.layers.size();
    swa_.resize(L);
    comp_.resize(L);
    q_.resize(L);
    sink_.resize(L);
    k_rows_.resize(L);
    ck_rows_.resize(L);
    topk_.resize(L);
    for (std::size_t l = 0; l < L; ++l) {
      const auto& layer = cfg_.layers[l];
      fill_cache(swa_[l], swa_layout(l));
      if (layer.compress_ratio > 1) fill_cache(comp_[l], comp_layout(l));
      q_[l].resize(std::size_t{1} * cfg_.max_tokens * layer.h_q * layer.d_qk);
      for (auto& v : q_[l]) v = random_bf16(rng_, 1.0F);
      if (layer.attn_sink) {
        sink_[l].resize(static_cast<std::size_t>(layer.h_q));
        std::normal_distribution<float> n(0.0F, 2.0F);
        for (auto& v : sink_[l]) v = n(rng_);
      }
      k_rows_[l].resize(std::size_t{1} * cfg_.max_tokens * kHeadDim);
      for (auto& v : k_rows_[l]) v = random_bf16(rng_, 0.1F);
      if (layer.compress_ratio > 1) {
        const int cap = graphs::ChunkMetaLayout::compressed_slot_capacity(cfg_, layer.compress_ratio);
        ck_rows_[l].resize(std::size_t{1} * cap * kHeadDim);
        for (auto& v : ck_rows_[l]) v = random_bf16(rng_, 0.05F);
      }
      topk_[l].assign(std::size_t{1} * cfg_.max_tokens * std::max(layer.top_k, 1), -1);
    }
    upload_all();
  }

  /// The layouts of layer l's caches as the executor holds them (a bound cache may pad its blocks).
  kernels::CacheLayout swa_layout(std::size_t l) const { return ex_.layer(l).swa_cache.layout; }
  kernels::CacheLayout comp_layout(std::size_t l) const { return ex_.layer(l).compressed_cache.layout; }

  /// A random chunk of `n` requests and `tokens` tokens (query_len 0 allowed when tokens < n).
  ChunkData random_chunk(int n, int tokens, int max_seq = -1, int min_seq = 0) {
    if (max_seq < 0) max_seq = cfg_.max_model_len;
    ChunkData c;
    std::vector<int> q(static_cast<std::size_t>(n), 0);
    for (int t = 0; t < tokens; ++t) q[static_cast<std::size_t>(rng_() % static_cast<std::uint64_t>(n))]++;
    std::vector<std::int32_t> swa_free(static_cast<std::size_t>(cfg_.cache.swa_blocks));
    std::iota(swa_free.begin(), swa_free.end(), 0);
    std::shuffle(swa_free.begin(), swa_free.end(), rng_);
    std::vector<std::int32_t> c_free(static_cast<std::size_t>(cfg_.cache.compressed_blocks));
    std::iota(c_free.begin(), c_free.end(), 0);
    std::shuffle(c_free.begin(), c_free.end(), rng_);
    std::size_t swa_next = 0;
    std::size_t c_next[kNumRatios] = {0, 0, 0};
    std::vector<std::int32_t> c_free_r[kNumRatios] = {{}, c_free, c_free};
    std::shuffle(c_free_r[2].begin(), c_free_r[2].end(), rng_);
    for (int b = 0; b < n; ++b) {
      const int ql = q[static_cast<std::size_t>(b)];
      const int lo = std::max(0, min_seq - ql);
      const int prefix = lo + static_cast<int>(rng_() % static_cast<std::uint64_t>(max_seq - ql - lo + 1));
      graphs::RequestInput r;
      r.query_len = ql;
      r.seq_len = prefix + ql;
      const int swa_need = (r.seq_len + cfg_.cache.swa_block_size - 1) / cfg_.cache.swa_block_size;
      c.swa_blocks.emplace_back(swa_free.begin() + static_cast<std::ptrdiff_t>(swa_next),
                                swa_free.begin() + static_cast<std::ptrdiff_t>(swa_next + swa_need));
      swa_next += static_cast<std::size_t>(swa_need);
      const int c_need = (r.seq_len + cfg_.cache.block_tokens - 1) / cfg_.cache.block_tokens;
      for (int i = 1; i < kNumRatios; ++i) {
        c.compressed_blocks[i].emplace_back(c_free_r[i].begin() + static_cast<std::ptrdiff_t>(c_next[i]),
                                            c_free_r[i].begin() + static_cast<std::ptrdiff_t>(c_next[i] + c_need));
        c_next[i] += static_cast<std::size_t>(c_need);
      }
      c.requests.push_back(r);
    }
    int token = 0;
    for (int b = 0; b < n; ++b) {
      const auto& r = c.requests[static_cast<std::size_t>(b)];
      for (int p = r.seq_len - r.query_len; p < r.seq_len; ++p, ++token) {
        const int bs = cfg_.cache.swa_block_size;
        c.swa_slots.push_back(c.swa_blocks[static_cast<std::size_t>(b)][static_cast<std::size_t>(p / bs)] * bs + p % bs);
        for (int i = 1; i < kNumRatios; ++i) {
          const int ratio = graphs::kRatios[i];
          if ((p + 1) % ratio != 0) continue;
          const int row = (p + 1) / ratio - 1;
          const int rpb = cfg_.cache.block_tokens / ratio;
          c.compressed_slots[i].push_back(
              c.compressed_blocks[i][static_cast<std::size_t>(b)][static_cast<std::size_t>(row / rpb)] * rpb + row % rpb);
          c.compressed_source[i].push_back(token);
        }
      }
    }
    // Block table rows reference the owning vectors.
    for (int b = 0; b < n; ++b) {
      auto& r = c.requests[static_cast<std::size_t>(b)];
      r.swa_blocks = c.swa_blocks[static_cast<std::size_t>(b)];
      for (int i = 1; i < kNumRatios; ++i) r.compressed_blocks[i] = c.compressed_blocks[i][static_cast<std::size_t>(b)];
    }
    return c;
  }

  /// Fresh random top-k indices for the chunk's tokens (about 10% -1), uploaded.
  void randomize_topk(const ChunkData& c) {
    for (std::size_t l = 0; l < cfg_.layers.size(); ++l) {
      const auto& layer = cfg_.layers[l];
      if (layer.compress_ratio == 1) continue;
      std::fill(topk_[l].begin(), topk_[l].end(), -1);
      int token = 0;
      for (const auto& r : c.requests) {
        const int rows = r.seq_len / layer.compress_ratio;
        for (int t = 0; t < r.query_len; ++t, ++token) {
          for (int j = 0; j < layer.top_k; ++j) {
            const bool none = rows == 0 || rng_() % 10 == 0;
            topk_[l][static_cast<std::size_t>(token) * layer.top_k + j] =
                none ? -1 : static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(rows));
          }
        }
      }
      upload_rows(ex_.layer(l).topk_indices, topk_[l].data(), static_cast<std::size_t>(cfg_.max_tokens));
      SPG_CUDA_TRY(cudaDeviceSynchronize());
    }
  }

  /// Random top-k indices for every token row of the pool, valid for any request of at least
  /// `min_seq` tokens (indices < min_seq / r), uploaded.
  void randomize_topk_all(int min_seq) {
    for (std::size_t l = 0; l < cfg_.layers.size(); ++l) {
      const auto& layer = cfg_.layers[l];
      if (layer.compress_ratio == 1) continue;
      const int rows = min_seq / layer.compress_ratio;
      for (auto& v : topk_[l]) {
        v = rows == 0 || rng_() % 10 == 0 ? -1 : static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(rows));
      }
      upload_rows(ex_.layer(l).topk_indices, topk_[l].data(), static_cast<std::size_t>(cfg_.max_tokens));
      SPG_CUDA_TRY(cudaDeviceSynchronize());
    }
  }

  /// Applies the insert stage to the host caches, as the device does when the executor inserts.
  void apply_insert(const ChunkData& c, const std::vector<int>& layers) {
    for (int li : layers) {
      const auto l = static_cast<std::size_t>(li);
      const auto& layer = cfg_.layers[l];
      ref::FaultLog log;
      ref::kv_insert(k_rows_[l].data(), c.swa_slots.data(), static_cast<int>(c.swa_slots.size()),
                     static_cast<int>(c.swa_slots.size()), swa_[l].data(), swa_layout(l), log);
      if (layer.compress_ratio > 1) {
        const int i = ratio_index(layer.compress_ratio);
        const int n = static_cast<int>(c.compressed_slots[i].size());
        ref::kv_insert(ck_rows_[l].data(), c.compressed_slots[i].data(), n, n, comp_[l].data(), comp_layout(l), log);
      }
      REQUIRE(log.count(kernels::Fault::slot) == 0);
    }
  }

  /// Expected outputs of layer `l` for a chunk run at (r_bucket, t_bucket): [t_bucket, h_q, ...].
  ref::SparseMlaReferenceOutputs reference(const ChunkData& c, std::size_t l, int r_bucket, int t_bucket,
                                           ref::LayerStepIntermediates* keep = nullptr) const {
    const auto& layer = cfg_.layers[l];
    const int r = layer.compress_ratio;
    const int ri = ratio_index(r);
    std::vector<int> q_lens, s_lens;
    for (const auto& req : c.requests) {
      q_lens.push_back(req.query_len);
      s_lens.push_back(req.seq_len);
    }
    const graphs::ChunkMetaLayout meta = graphs::ChunkMetaLayout::make(cfg_);
    std::vector<std::int32_t> swa_table(static_cast<std::size_t>(r_bucket) * meta.swa_table_width, -7);
    std::vector<std::int32_t> c_table(static_cast<std::size_t>(r_bucket) * meta.compressed_table_width, -7);
    for (std::size_t b = 0; b < c.requests.size(); ++b) {
      std::copy(c.swa_blocks[b].begin(), c.swa_blocks[b].end(),
                swa_table.begin() + static_cast<std::ptrdiff_t>(b) * meta.swa_table_width);
      if (r > 1) {
        std::copy(c.compressed_blocks[ri][b].begin(), c.compressed_blocks[ri][b].end(),
                  c_table.begin() + static_cast<std::ptrdiff_t>(b) * meta.compressed_table_width);
      }
    }
    ref::LayerStepInputs in;
    in.layer = &layer;
    in.swa = ref::CacheView{swa_[l].data(), swa_layout(l), swa_table.data(), meta.swa_table_width};
    if (r > 1) in.compressed = ref::CacheView{comp_[l].data(), comp_layout(l), c_table.data(), meta.compressed_table_width};
    in.chunk = ref::make_host_chunk(q_lens, s_lens, r, layer.window, r_bucket);
    in.r_bucket = r_bucket;
    in.t_bucket = t_bucket;
    in.max_rows_per_request = cfg_.max_kv_rows(layer);
    in.q = q_[l].data();
    in.topk = r > 1 ? topk_[l].data() : nullptr;
    in.attn_sink = sink_[l];
    ref::FaultLog log;
    auto out = ref::layer_step_reference(in, log, keep);
    REQUIRE(log.counts == std::array<std::uint32_t, kernels::kFaultKinds>{});
    return out;
  }

  graphs::Executor& executor() { return ex_; }
  std::mt19937_64& rng() { return rng_; }

 private:
  void fill_cache(std::vector<std::uint8_t>& cache, const kernels::CacheLayout& layout) {
    cache.assign(layout.bytes(), 0);
    std::vector<std::uint16_t> row(kHeadDim);
    for (std::int64_t s = 0; s < layout.capacity(); ++s) {
      // Values near 0.1, the calibration of the accuracy bars (docs/testing.md), with row scales
      // spread over five binades so the FP8 tiles see many exponents.
      const float scale = 0.1F * std::ldexp(1.0F, -static_cast<int>(rng_() % 5));
      for (auto& v : row) v = random_bf16(rng_, scale);
      ref::quantize_row(row.data(), cache.data() + layout.row_offset(s), cache.data() + layout.scale_offset(s));
    }
  }

  // Pageable copies run on the legacy stream, which does not order against the executor's
  // non-blocking stream: wait for the whole device before any step can read the data.
  void upload_all() {
    const auto T = static_cast<std::size_t>(cfg_.max_tokens);
    for (std::size_t l = 0; l < cfg_.layers.size(); ++l) {
      const graphs::LayerBuffers& v = ex_.layer(l);
      auto cache = [](const graphs::PagedCache& c, const std::vector<std::uint8_t>& host) {
        SPG_CUDA_TRY(cudaMemcpy(c.data, host.data(), host.size(), cudaMemcpyHostToDevice));
      };
      cache(v.swa_cache, swa_[l]);
      if (!comp_[l].empty()) cache(v.compressed_cache, comp_[l]);
      upload_rows(v.q, q_[l].data(), T);
      if (!sink_[l].empty()) {
        SPG_CUDA_TRY(cudaMemcpy(v.attn_sink.data_handle(), sink_[l].data(), sink_[l].size() * 4, cudaMemcpyHostToDevice));
      }
      if (graphs::bound(v.k_rows)) upload_rows(v.k_rows, k_rows_[l].data(), T);
      if (graphs::bound(v.compressed_k_rows)) {
        upload_rows(v.compressed_k_rows, ck_rows_[l].data(), ck_rows_[l].size() / kHeadDim);
      }
    }
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }

  graphs::Executor& ex_;
  const model::PipelineConfig& cfg_;
  std::mt19937_64 rng_;
  std::vector<std::vector<std::uint8_t>> swa_, comp_;
  std::vector<std::vector<std::uint16_t>> q_, k_rows_, ck_rows_;
  std::vector<std::vector<float>> sink_;
  std::vector<std::vector<std::int32_t>> topk_;
};

/// Fills a view's bytes with 0xFF (NaN for bf16 and f32, -1 for int32) on the device.
template <class View>
void poison(const View& v) {
  if (!graphs::bound(v)) return;
  SPG_CUDA_TRY(cudaMemset(v.data_handle(), 0xFF, graphs::span_bytes(v)));
}

/// NaN (0xFF bytes) into every output of every layer, so a step that writes nothing, or fewer rows
/// than its bucket's, fails whatever it is compared with. Waits for the executor first.
inline void poison_outputs(graphs::Executor& ex) {
  ex.synchronize();
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    poison(ex.layer(l).out);
    poison(ex.layer(l).lse);
    poison(ex.layer(l).max_logits);
  }
  SPG_CUDA_TRY(cudaDeviceSynchronize());  // the memsets ran on the legacy stream
}

/// A layer's outputs copied back: out as bf16 bits, lse and max_logits.
struct LayerOutputs {
  std::vector<std::uint16_t> out;
  std::vector<float> lse, max_logits;
  bool operator==(const LayerOutputs& o) const {
    return out == o.out && std::memcmp(lse.data(), o.lse.data(), lse.size() * 4) == 0 &&
           std::memcmp(max_logits.data(), o.max_logits.data(), max_logits.size() * 4) == 0;
  }
};

inline LayerOutputs read_outputs(graphs::Executor& ex, std::size_t l, int t_bucket) {
  const graphs::LayerBuffers& v = ex.layer(l);
  const auto rows = static_cast<std::size_t>(t_bucket);
  ex.synchronize();
  LayerOutputs o;
  o.out = download_rows<std::uint16_t>(v.out, rows);
  o.lse = download_rows<float>(v.lse, rows);
  o.max_logits = download_rows<float>(v.max_logits, rows);
  return o;
}

/// The accuracy bars of docs/pipeline.md; fails on the worst element with its position.
inline void check_against_reference(const LayerOutputs& got, const ref::SparseMlaReferenceOutputs& want,
                                    const std::string& what) {
  INFO(what);
  const ref::AccuracyScore out = ref::score_out(got.out, want.out);
  INFO("out: worst element " << out.worst_index << " at " << out.worst << " x its bar, got "
                             << (out.worst_index < got.out.size() ? ref::bf16_value(got.out[out.worst_index]) : 0.0F)
                             << ", want " << (out.worst_index < want.out.size() ? want.out[out.worst_index] : 0.0)
                             << "; 1 - cos = " << out.cos_diff);
  CHECK(out.out_ok());
  for (const auto& [g, w, name] : {std::tuple{&got.lse, &want.lse, "lse"}, std::tuple{&got.max_logits, &want.max_logits, "max_logits"}}) {
    const ref::AccuracyScore st = ref::score_stat(*g, *w);
    INFO(name << ": worst element " << st.worst_index << " at " << st.worst << " x its bar");
    CHECK(st.stat_ok());
  }
}

}  // namespace spg::test
