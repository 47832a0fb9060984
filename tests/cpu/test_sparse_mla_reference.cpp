// The sparse MLA CPU reference on tiny hand-worked cases (docs/pipeline.md, "Sparse attention
// semantics"): scores come only from the dims past 512, so each row's weight is exp of a chosen
// number and every output is a small rational.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/kernels/reference/sparse_mla_reference.hpp"

namespace {

namespace ref = spg::kernels::reference;

constexpr int kD = 576;
constexpr int kDv = 512;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// kv row r: value part all (r + 1), score key k_r = ln(r + 1) at dim 512, zeros elsewhere.
/// Query of head h: (h + 1) at dim 512. So exp(score[h][r]) = (r + 1)^(h + 1) with sm_scale 1.
struct Tiny {
  int s_q{1};
  int s_kv{4};
  int h_q{2};
  int topk{4};
  std::vector<float> q;
  std::vector<float> kv;
  std::vector<std::int32_t> indices;
  std::vector<std::int32_t> topk_length;
  std::vector<float> sink;
  int num_tokens{-1};

  explicit Tiny(std::vector<std::int32_t> idx, int tokens = 1) : s_q(tokens), indices(std::move(idx)) {
    q.assign(static_cast<std::size_t>(s_q) * h_q * kD, 0.0f);
    for (int t = 0; t < s_q; ++t)
      for (int h = 0; h < h_q; ++h) q[(static_cast<std::size_t>(t) * h_q + h) * kD + kDv] = static_cast<float>(h + 1);
    kv.assign(static_cast<std::size_t>(s_kv) * kD, 0.0f);
    for (int r = 0; r < s_kv; ++r) {
      for (int c = 0; c < kDv; ++c) kv[static_cast<std::size_t>(r) * kD + c] = static_cast<float>(r + 1);
      kv[static_cast<std::size_t>(r) * kD + kDv] = static_cast<float>(std::log(r + 1.0));
    }
  }

  ref::SparseMlaReferenceOutputs run(std::span<const int> tokens = {}) const {
    ref::SparseMlaReferenceInputs in;
    in.q = q;
    in.kv = kv;
    in.indices = indices;
    in.topk_length = topk_length;
    in.attn_sink = sink;
    in.s_q = s_q;
    in.s_kv = s_kv;
    in.h_q = h_q;
    in.d_qk = kD;
    in.topk = topk;
    in.sm_scale = 1.0;
    in.num_tokens = num_tokens;
    return ref::sparse_mla_reference(in, tokens, 2);
  }
  /// The exact score of head h on row r, from the float key the reference sees.
  [[nodiscard]] double score(int h, int r) const {
    return (h + 1) * static_cast<double>(kv[static_cast<std::size_t>(r) * kD + kDv]);
  }
  /// sum_r exp(score) * (r + 1) / (sum_r exp(score) + extra): the weighted mean of the row values
  /// (the float keys make the weights (r + 1)^(h + 1) only to about 1e-7).
  [[nodiscard]] double mean(int h, std::initializer_list<int> rows, double extra = 0.0) const {
    double num = 0.0, den = extra;
    for (const int r : rows) {
      num += std::exp(score(h, r)) * (r + 1);
      den += std::exp(score(h, r));
    }
    return num / den;
  }
};

/// Relative closeness that works with both Catch2 major versions.
bool near(double got, double want, double rel = 1e-12) {
  return std::fabs(got - want) <= rel * std::max(std::fabs(want), 1e-300) + 1e-15;
}

void expect_row(const ref::SparseMlaReferenceOutputs& o, std::size_t token_pos, int h, double out, double max_logit,
                double lse, int h_q = 2) {
  const std::size_t row = token_pos * static_cast<std::size_t>(h_q) + static_cast<std::size_t>(h);
  INFO("token position " << token_pos << " head " << h);
  for (int c = 0; c < kDv; ++c) {
    INFO("col " << c << " got " << o.out[row * kDv + c] << " want " << out);
    REQUIRE(near(o.out[row * kDv + c], out));
  }
  if (std::isinf(max_logit)) {
    CHECK(o.max_logits[row] == max_logit);
  } else {
    CHECK(near(o.max_logits[row], max_logit));
  }
  if (std::isinf(lse)) {
    CHECK(o.lse[row] == lse);
  } else {
    CHECK(near(o.lse[row], lse));
  }
}

}  // namespace

TEST_CASE("reference: softmax over the valid rows", "[sparse_mla]") {
  Tiny t({0, 1, 2, -1});
  const auto o = t.run();
  // head 0: weights 1, 2, 3 on values 1, 2, 3 -> 14 / 6; head 1: weights 1, 4, 9 -> 36 / 14
  const double e0 = std::exp(t.score(0, 0)) + std::exp(t.score(0, 1)) + std::exp(t.score(0, 2));
  const double e1 = std::exp(t.score(1, 0)) + std::exp(t.score(1, 1)) + std::exp(t.score(1, 2));
  CHECK(near(e0, 6.0, 1e-6));
  CHECK(near(t.mean(0, {0, 1, 2}), 14.0 / 6.0, 1e-6));
  CHECK(near(t.mean(1, {0, 1, 2}), 36.0 / 14.0, 1e-6));
  expect_row(o, 0, 0, t.mean(0, {0, 1, 2}), t.score(0, 2), std::log(e0));
  expect_row(o, 0, 1, t.mean(1, {0, 1, 2}), t.score(1, 2), std::log(e1));
}

TEST_CASE("reference: every masking rule", "[sparse_mla]") {
  // j = 0: row 2 (valid); j = 1: s_kv (masked); j = 2: INT_MIN (masked); j = 3: row 1, past topk_length 3
  Tiny t({2, 4, std::numeric_limits<std::int32_t>::min(), 1});
  t.topk_length = {3};
  const auto o = t.run();
  expect_row(o, 0, 0, 3.0, t.score(0, 2), t.score(0, 2));
  expect_row(o, 0, 1, 3.0, t.score(1, 2), t.score(1, 2));
  // topk_length past topk counts as topk; negative as 0
  t.topk_length = {9};
  const auto all = t.run();
  const double e = std::exp(t.score(0, 2)) + std::exp(t.score(0, 1));
  expect_row(all, 0, 0, t.mean(0, {2, 1}), t.score(0, 2), std::log(e));
  t.topk_length = {-5};
  expect_row(t.run(), 0, 0, 0.0, -kInf, kInf);
}

TEST_CASE("reference: the sink joins the normalizer only", "[sparse_mla]") {
  Tiny t({0, 1, 2, -1});
  const double e0 = std::exp(t.score(0, 0)) + std::exp(t.score(0, 1)) + std::exp(t.score(0, 2));
  const double e1 = std::exp(t.score(1, 0)) + std::exp(t.score(1, 1)) + std::exp(t.score(1, 2));
  // finite sink ln 6 on head 0: out = 14 / (6 + 6); -inf on head 1: no effect
  t.sink = {static_cast<float>(std::log(6.0)), -std::numeric_limits<float>::infinity()};
  auto o = t.run();
  const double sink0 = static_cast<double>(t.sink[0]);
  CHECK(near(t.mean(0, {0, 1, 2}, std::exp(sink0)), 14.0 / 12.0, 1e-6));
  expect_row(o, 0, 0, t.mean(0, {0, 1, 2}, std::exp(sink0)), t.score(0, 2), std::log(e0));
  expect_row(o, 0, 1, t.mean(1, {0, 1, 2}), t.score(1, 2), std::log(e1));
  // +inf: out 0, statistics unchanged
  t.sink = {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()};
  o = t.run();
  expect_row(o, 0, 0, 0.0, t.score(0, 2), std::log(e0));
  expect_row(o, 0, 1, 0.0, t.score(1, 2), std::log(e1));
}

TEST_CASE("reference: empty rows give out 0, max_logits -inf, lse +inf", "[sparse_mla]") {
  Tiny none({-1, 4, 5, -7});
  none.sink = {1.0f, std::numeric_limits<float>::infinity()};
  auto o = none.run();
  expect_row(o, 0, 0, 0.0, -kInf, kInf);
  expect_row(o, 0, 1, 0.0, -kInf, kInf);

  Tiny zero_len({0, 1, 2, 3});
  zero_len.topk_length = {0};
  expect_row(zero_len.run(), 0, 1, 0.0, -kInf, kInf);

  Tiny past({0, 1, 2, 3, 0, 1, 2, 3}, 2);  // token 1 is past num_tokens
  past.num_tokens = 1;
  o = past.run();
  CHECK(o.lse[0] != kInf);
  expect_row(o, 1, 0, 0.0, -kInf, kInf);
  expect_row(o, 1, 1, 0.0, -kInf, kInf);
}

TEST_CASE("reference: a token subset comes back in the order asked", "[sparse_mla]") {
  Tiny t({0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1}, 3);  // token i attends to row i only
  const std::vector<int> tokens = {2, 0};
  const auto o = t.run(tokens);
  REQUIRE(o.out.size() == 2u * 2u * kDv);
  expect_row(o, 0, 0, 3.0, t.score(0, 2), t.score(0, 2));
  expect_row(o, 1, 1, 1.0, t.score(1, 0), t.score(1, 0));
  const std::vector<int> bad = {3};
  CHECK_THROWS_AS(t.run(bad), spg::InvalidArgument);
}
