// See sparse_mla_reference.hpp. Inner loops are plain contiguous double loops so the compiler
// keeps them tight; kv is widened to double once, each token's q rows once per token.
#include "spgraph/kernels/reference/sparse_mla_reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "spgraph/core/error.hpp"
#include "spgraph/model/cache_format.hpp"

namespace spg::kernels::reference {

namespace {

constexpr int kDv = model::kHeadDim;

// Four independent partial sums: shorter dependency chains, same result for the same inputs.
double dot(const double* a, const double* b, int n) noexcept {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

void axpy(double* y, double a, const double* x, int n) noexcept {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

SparseMlaReferenceOutputs sparse_mla_reference(const SparseMlaReferenceInputs& in, std::span<const int> tokens,
                                               int threads) {
  const int d = in.d_qk;
  SPG_EXPECTS(d >= kDv, "d_qk = " << d << " must be at least " << kDv);
  SPG_EXPECTS(in.h_q >= 1 && in.s_q >= 0 && in.s_kv >= 0 && in.topk >= 0, "negative or empty shape");
  const std::size_t hq = static_cast<std::size_t>(in.h_q);
  const std::size_t q_rows = in.q_row_of_token.empty() ? static_cast<std::size_t>(in.s_q) : in.q.size() / (hq * d);
  SPG_EXPECTS(in.q.size() >= q_rows * hq * static_cast<std::size_t>(d), "q holds " << in.q.size() << " values");
  SPG_EXPECTS(in.kv.size() >= static_cast<std::size_t>(in.s_kv) * static_cast<std::size_t>(d),
              "kv holds " << in.kv.size() << " values, s_kv * d_qk = " << std::size_t(in.s_kv) * d << " needed");
  SPG_EXPECTS(in.indices.size() >= static_cast<std::size_t>(in.s_q) * static_cast<std::size_t>(in.topk),
              "indices holds " << in.indices.size() << " values");
  SPG_EXPECTS(in.topk_length.empty() || in.topk_length.size() >= static_cast<std::size_t>(in.s_q),
              "topk_length holds " << in.topk_length.size() << " values, s_q = " << in.s_q << " needed");
  SPG_EXPECTS(in.attn_sink.empty() || in.attn_sink.size() >= hq, "attn_sink holds " << in.attn_sink.size() << " values");
  SPG_EXPECTS(in.q_row_of_token.empty() || in.q_row_of_token.size() >= static_cast<std::size_t>(in.s_q),
              "q_row_of_token holds " << in.q_row_of_token.size() << " values");

  std::vector<int> all;
  if (tokens.empty()) {
    all.resize(static_cast<std::size_t>(in.s_q));
    for (int i = 0; i < in.s_q; ++i) all[static_cast<std::size_t>(i)] = i;
    tokens = all;
  }
  for (const int tkn : tokens) SPG_EXPECTS(tkn >= 0 && tkn < in.s_q, "token " << tkn << " outside [0, " << in.s_q << ")");

  std::vector<double> kvd(static_cast<std::size_t>(in.s_kv) * static_cast<std::size_t>(d));
  for (std::size_t i = 0; i < kvd.size(); ++i) kvd[i] = in.kv[i];

  const std::size_t n_tok = tokens.size();
  SparseMlaReferenceOutputs res;
  res.out.assign(n_tok * hq * kDv, 0.0);
  res.max_logits.assign(n_tok * hq, -std::numeric_limits<double>::infinity());
  res.lse.assign(n_tok * hq, std::numeric_limits<double>::infinity());

  std::atomic<std::size_t> next{0};
  auto worker = [&]() {
    std::vector<double> qd(hq * static_cast<std::size_t>(d));
    std::vector<const double*> rows;
    std::vector<double> scores;
    for (std::size_t pos = next.fetch_add(1); pos < n_tok; pos = next.fetch_add(1)) {
      const int tkn = tokens[pos];
      if (in.num_tokens >= 0 && tkn >= in.num_tokens) continue;  // stays an empty row
      int len = in.topk;
      if (!in.topk_length.empty()) len = std::clamp(in.topk_length[static_cast<std::size_t>(tkn)], 0, in.topk);
      rows.clear();
      const std::int32_t* idx = in.indices.data() + static_cast<std::size_t>(tkn) * static_cast<std::size_t>(in.topk);
      for (int j = 0; j < len; ++j) {
        if (idx[j] >= 0 && idx[j] < in.s_kv) rows.push_back(kvd.data() + static_cast<std::size_t>(idx[j]) * d);
      }
      if (rows.empty()) continue;
      const std::size_t q_row =
          in.q_row_of_token.empty() ? static_cast<std::size_t>(tkn) : static_cast<std::size_t>(in.q_row_of_token[tkn]);
      const float* qsrc = in.q.data() + q_row * hq * static_cast<std::size_t>(d);
      for (std::size_t i = 0; i < qd.size(); ++i) qd[i] = qsrc[i];

      const std::size_t n = rows.size();
      scores.resize(hq * n);
      for (std::size_t jj = 0; jj < n; ++jj)
        for (std::size_t h = 0; h < hq; ++h) scores[h * n + jj] = in.sm_scale * dot(qd.data() + h * d, rows[jj], d);

      for (std::size_t h = 0; h < hq; ++h) {
        const double* s = scores.data() + h * n;
        const double m = *std::max_element(s, s + n);
        double sum = 0.0;
        for (std::size_t jj = 0; jj < n; ++jj) sum += std::exp(s[jj] - m);
        const double lse = m + std::log(sum);
        // L = ln(exp(lse) + exp(sink)); +inf gives L = +inf (out 0), -inf gives L = lse.
        double norm = lse;
        if (!in.attn_sink.empty()) {
          const double sink = in.attn_sink[h];
          norm = std::max(lse, sink) + std::log1p(std::exp(-std::fabs(lse - sink)));
        }
        const std::size_t o = pos * hq + h;
        res.max_logits[o] = m;
        res.lse[o] = lse;
        double* out = res.out.data() + o * kDv;
        for (std::size_t jj = 0; jj < n; ++jj) axpy(out, std::exp(s[jj] - norm), rows[jj], kDv);
      }
    }
  };

  unsigned n_threads = threads > 0 ? static_cast<unsigned>(threads) : std::max(1u, std::thread::hardware_concurrency());
  n_threads = static_cast<unsigned>(std::min<std::size_t>(n_threads, std::max<std::size_t>(n_tok, 1)));
  std::vector<std::thread> pool;
  pool.reserve(n_threads);
  for (unsigned i = 0; i < n_threads; ++i) pool.emplace_back(worker);
  for (std::thread& th : pool) th.join();
  return res;
}

}  // namespace spg::kernels::reference
