// The accuracy bars as scores: each bar's edge, NaN and infinities.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/kernels/reference/accuracy.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"

namespace ref = spg::kernels::reference;

TEST_CASE("out passes inside either element bar and fails past both, or on NaN", "[accuracy]") {
  // 0.5 is exact in bf16; 0.5 + 0.0117 is 2.3% off (inside the relative bar), 0.5 + 0.015 is 3%.
  const std::vector<double> want{0.5, 0.5, 1e-4};
  std::vector<std::uint16_t> got{ref::bf16_round(0.5F), ref::bf16_round(0.5117F), ref::bf16_round(7e-4F)};
  const ref::AccuracyScore ok = ref::score_out(got, want);
  CHECK(ok.worst <= 1.0);
  CHECK_FALSE(ok.out_ok());  // each element inside its bar, but 2.3% on one of three moves the cosine
  const std::vector<std::uint16_t> exact{ref::bf16_round(0.5F), ref::bf16_round(0.5F), ref::bf16_round(1e-4F)};
  CHECK(ref::score_out(exact, want).out_ok());
  got[1] = ref::bf16_round(0.53F);
  const ref::AccuracyScore bad = ref::score_out(got, want);
  CHECK(bad.worst > 1.0);
  CHECK(bad.worst_index == 1);
  CHECK_FALSE(bad.out_ok());
  got[1] = 0x7FC0;  // NaN
  CHECK(std::isinf(ref::score_out(got, want).worst));
  CHECK(ref::score_out(got, want).worst_index == 1);
}

TEST_CASE("out also needs the whole tensor's cosine within 1e-5", "[accuracy]") {
  // Every element inside the absolute bar, but a tiny tensor whose direction is off.
  const std::vector<double> want{1e-4, -1e-4};
  const std::vector<std::uint16_t> got{ref::bf16_round(-1e-4F), ref::bf16_round(1e-4F)};
  const ref::AccuracyScore s = ref::score_out(got, want);
  CHECK(s.worst <= 1.0);
  CHECK(s.cos_diff > 1.0);
  CHECK_FALSE(s.out_ok());
}

TEST_CASE("statistics need infinities to match exactly", "[accuracy]") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> want{3.0, inf, -inf};
  std::vector<float> got{3.00005F, INFINITY, -INFINITY};
  CHECK(ref::score_stat(got, want).stat_ok());
  got[1] = 1e30F;
  CHECK_FALSE(ref::score_stat(got, want).stat_ok());
  got[1] = INFINITY;
  got[0] = 3.001F;  // 1e-3 absolute, 3.3e-4 relative: past both
  const ref::AccuracyScore s = ref::score_stat(got, want);
  CHECK_FALSE(s.stat_ok());
  CHECK(s.worst_index == 0);
  CHECK_FALSE(ref::score_stat(std::vector<float>{1.0F}, want).stat_ok());  // sizes differ
}
