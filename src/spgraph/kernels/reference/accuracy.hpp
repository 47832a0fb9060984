// The accuracy bars of docs/pipeline.md as scores: one implementation shared by the attention
// tests, the executor tests and serve_loop's end-to-end verifier.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace spg::kernels::reference {

/// @brief How far an output is past its bars. `worst` <= 1 passes; NaN, and for statistics a
///        mismatched infinity, score +inf.
struct AccuracyScore {
  double worst{0.0};
  std::size_t worst_index{0};
  double cos_diff{0.0};  ///< 1 - cos(got, ref) over the whole tensor (out only)

  /// out passes when every element is inside its bar and 1 - cos <= 1e-5.
  [[nodiscard]] bool out_ok() const noexcept { return worst <= 1.0 && cos_diff <= 1e-5; }
  /// lse and max_logits pass when every element is inside its bar.
  [[nodiscard]] bool stat_ok() const noexcept { return worst <= 1.0; }
};

/// out (bf16 bits) against a double reference: every element |err| <= 8e-4 * looser or
/// |err| / |ref| <= 2.4e-2 * looser, and 1 - cos(out, ref) <= 1e-5.
[[nodiscard]] AccuracyScore score_out(std::span<const std::uint16_t> got, std::span<const double> ref,
                                      double looser = 1.0) noexcept;

/// lse or max_logits against a double reference: |err| <= 1e-4 or relative <= 3e-5; infinities
/// must match exactly.
[[nodiscard]] AccuracyScore score_stat(std::span<const float> got, std::span<const double> ref) noexcept;

}  // namespace spg::kernels::reference
