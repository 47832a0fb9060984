// The whole-step CPU reference (gather -> combine -> attention) against a direct computation
// from the formulas of docs/pipeline.md: dequantize each attended row straight from the paged
// caches and apply the attention definition token by token.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/kernels/reference/pipeline_reference.hpp"

namespace ref = spg::kernels::reference;
using spg::kernels::CacheLayout;

namespace {

struct Cache {
  CacheLayout layout;
  std::vector<std::uint8_t> bytes;
};

Cache random_cache(std::mt19937_64& rng, int block_size, int blocks) {
  Cache c{CacheLayout::make(block_size, blocks), {}};
  c.bytes.assign(c.layout.bytes(), 0);
  std::normal_distribution<float> n(0.0F, 1.0F);
  std::vector<std::uint16_t> row(512);
  for (std::int64_t s = 0; s < c.layout.capacity(); ++s) {
    for (auto& v : row) v = ref::bf16_round(n(rng));
    ref::quantize_row(row.data(), c.bytes.data() + c.layout.row_offset(s), c.bytes.data() + c.layout.scale_offset(s));
  }
  return c;
}

std::vector<double> row_of(const Cache& c, std::int64_t slot) {
  std::vector<std::uint16_t> bits(512);
  ref::dequantize_row(c.bytes.data() + c.layout.row_offset(slot), c.bytes.data() + c.layout.scale_offset(slot), bits.data());
  std::vector<double> v(512);
  for (int i = 0; i < 512; ++i) v[static_cast<std::size_t>(i)] = ref::bf16_value(bits[static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

TEST_CASE("the whole-step reference equals the formulas applied directly", "[pipeline_reference]") {
  std::mt19937_64 rng(17);
  for (int r : {4, 1, 128}) {
    spg::model::LayerConfig layer{64, 512, 512, 128, r, r == 1 ? 0 : (r == 4 ? 512 : 64), 0.0F, true};
    const int R = 3;
    const int swa_bs = 64;
    const int rows_per_block = 256 / r;
    const int width_swa = 24;
    const int width_c = 6;
    Cache swa = random_cache(rng, swa_bs, R * width_swa);
    Cache comp = random_cache(rng, rows_per_block, R * width_c);
    const std::vector<int> q_lens{5, 0, 11};
    const std::vector<int> s_lens{700, 90, 1300};
    const int T = 16;  // bucket: 16 real tokens
    const int r_bucket = 4;
    std::vector<std::int32_t> swa_table(static_cast<std::size_t>(r_bucket) * width_swa, -1);
    std::vector<std::int32_t> c_table(static_cast<std::size_t>(r_bucket) * width_c, -1);
    for (int b = 0; b < R; ++b) {
      for (int i = 0; i < width_swa; ++i) swa_table[static_cast<std::size_t>(b * width_swa + i)] = (b * width_swa + i * 7) % (R * width_swa);
      for (int i = 0; i < width_c; ++i) c_table[static_cast<std::size_t>(b * width_c + i)] = R * width_c - 1 - (b * width_c + i);
    }
    std::vector<std::uint16_t> q(static_cast<std::size_t>(T) * 64 * 512);
    std::normal_distribution<float> n(0.0F, 1.0F);
    for (auto& v : q) v = ref::bf16_round(n(rng));
    std::vector<std::int32_t> topk(static_cast<std::size_t>(T) * std::max(layer.top_k, 1), -1);
    std::vector<float> sink(64);
    for (auto& s : sink) s = n(rng);

    int t = 0;
    for (int b = 0; b < R; ++b) {
      for (int k = 0; k < q_lens[static_cast<std::size_t>(b)]; ++k, ++t) {
        for (int j = 0; j < layer.top_k; ++j) {
          const int rows = s_lens[static_cast<std::size_t>(b)] / r;
          topk[static_cast<std::size_t>(t * layer.top_k + j)] = rng() % 9 == 0 ? -1 : static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(rows));
        }
      }
    }

    ref::LayerStepInputs in;
    in.layer = &layer;
    in.swa = ref::CacheView{swa.bytes.data(), swa.layout, swa_table.data(), width_swa};
    in.compressed = ref::CacheView{comp.bytes.data(), comp.layout, c_table.data(), width_c};
    in.chunk = ref::make_host_chunk(q_lens, s_lens, r, layer.window, r_bucket);
    in.r_bucket = r_bucket;
    in.t_bucket = T;
    in.max_rows_per_request = 1300 / r + 16 + 127;
    in.q = q.data();
    in.topk = r > 1 ? topk.data() : nullptr;
    in.attn_sink = sink;
    ref::FaultLog log;
    const auto got = ref::layer_step_reference(in, log);
    CHECK(log.counts == decltype(log.counts){});

    // Direct: token by token from the caches.
    double worst = 0;
    t = 0;
    for (int b = 0; b < R; ++b) {
      const int ql = q_lens[static_cast<std::size_t>(b)];
      const int sl = s_lens[static_cast<std::size_t>(b)];
      for (int k = 0; k < ql; ++k, ++t) {
        const int pos = sl - ql + k;
        std::vector<std::vector<double>> rows;
        if (r > 1) {
          const int topk_len = std::min((pos + 1) / r, layer.top_k);
          for (int j = 0; j < topk_len; ++j) {
            const int idx = topk[static_cast<std::size_t>(t * layer.top_k + j)];
            if (idx < 0) continue;
            rows.push_back(row_of(comp, c_table[static_cast<std::size_t>(b * width_c + idx / rows_per_block)] * rows_per_block + idx % rows_per_block));
          }
        }
        const int swa_len = std::min(pos + 1, layer.window);
        for (int p = pos - swa_len + 1; p <= pos; ++p) {
          rows.push_back(row_of(swa, swa_table[static_cast<std::size_t>(b * width_swa + p / swa_bs)] * swa_bs + p % swa_bs));
        }
        for (int h = 0; h < 64; ++h) {
          std::vector<double> s;
          for (const auto& row : rows) {
            double dot = 0;
            for (int d = 0; d < 512; ++d) dot += ref::bf16_value(q[(static_cast<std::size_t>(t) * 64 + h) * 512 + d]) * row[static_cast<std::size_t>(d)];
            s.push_back(dot * layer.scale());
          }
          double m = -INFINITY;
          for (double v : s) m = std::max(m, v);
          double sum = 0;
          for (double v : s) sum += std::exp(v - m);
          const double lse = m + std::log(sum);
          const double norm = std::log(std::exp(lse) + std::exp(static_cast<double>(sink[static_cast<std::size_t>(h)])));
          const std::size_t o = static_cast<std::size_t>(t) * 64 + static_cast<std::size_t>(h);
          worst = std::max(worst, std::abs(got.lse[o] - lse));
          worst = std::max(worst, std::abs(got.max_logits[o] - m));
          for (int d = 0; d < 512; ++d) {
            double want = 0;
            for (std::size_t j = 0; j < rows.size(); ++j) want += std::exp(s[j] - norm) * rows[j][static_cast<std::size_t>(d)];
            worst = std::max(worst, std::abs(got.out[o * 512 + static_cast<std::size_t>(d)] - want));
          }
        }
      }
    }
    INFO("r = " << r);
    CHECK(worst < 1e-9);
  }
}
