// Accuracy scores: see accuracy.hpp.
#include "spgraph/kernels/reference/accuracy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "spgraph/kernels/reference/kv_cache_reference.hpp"

namespace spg::kernels::reference {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// How far past the looser of an absolute and a relative bar an error is (<= 1 passes).
double element_score(double g, double r, double abs_bar, double rel_bar) noexcept {
  const double err = std::fabs(g - r);
  const double score = std::min(err / abs_bar, r != 0.0 ? err / (std::fabs(r) * rel_bar) : kInf);
  return std::isnan(g) || std::isnan(score) ? kInf : score;
}
}  // namespace

AccuracyScore score_out(std::span<const std::uint16_t> got, std::span<const double> ref, double looser) noexcept {
  AccuracyScore s;
  if (got.size() != ref.size()) {
    s.worst = kInf;
    return s;
  }
  double dot = 0.0;
  double ng = 0.0;
  double nr = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_value(got[i]);
    const double score = element_score(g, ref[i], 8e-4 * looser, 2.4e-2 * looser);
    if (score > s.worst) {
      s.worst = score;
      s.worst_index = i;
    }
    dot += g * ref[i];
    ng += g * g;
    nr += ref[i] * ref[i];
  }
  const double cos_sim = (ng == 0.0 && nr == 0.0) ? 1.0 : dot / std::sqrt(ng * nr);
  s.cos_diff = std::isnan(cos_sim) ? kInf : 1.0 - cos_sim;
  return s;
}

AccuracyScore score_stat(std::span<const float> got, std::span<const double> ref) noexcept {
  AccuracyScore s;
  if (got.size() != ref.size()) {
    s.worst = kInf;
    return s;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const double r = ref[i];
    const double score = (std::isinf(r) || std::isinf(g)) ? (g == r ? 0.0 : kInf) : element_score(g, r, 1e-4, 3e-5);
    if (score > s.worst) {
      s.worst = score;
      s.worst_index = i;
    }
  }
  return s;
}

}  // namespace spg::kernels::reference
