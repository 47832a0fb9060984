// Division of non-negative ints by a divisor fixed once (a block size, rows per block): one
// 64-bit multiply and a shift in place of an integer division, for host loops that divide by
// the same few values per request (the chunk encoder). Exact for every numerator in [0, 2^31).
#pragma once

#include <cstdint>

namespace spg::core {

/// @brief A divisor d in [1, 2^31) with its multiplier: with s = ceil(log2 d) and
///        m = floor(2^(31 + s) / d) + 1 (which fits 32 bits), n / d = (n * m) >> (31 + s) for
///        every n in [0, 2^31): m * d = 2^(31 + s) + e with 0 < e <= d, so the product
///        overshoots n / d by n * e / (d * 2^(31 + s)) < 2^-s <= 1 / d, less than the room
///        the fraction of n / d leaves below the next integer.
class Divisor {
 public:
  constexpr Divisor() noexcept : Divisor(1) {}
  /// `d` must lie in [1, 2^31): the callers pass validated config values (below 1, every quotient is 0).
  constexpr explicit Divisor(int d) noexcept : d_(d) {
    int s = 0;
    while ((std::int64_t{1} << s) < d) ++s;
    shift_ = 31 + s;
    multiplier_ = d > 0 ? (std::uint64_t{1} << shift_) / static_cast<std::uint64_t>(d) + 1 : 0;
  }
  [[nodiscard]] constexpr int value() const noexcept { return d_; }
  /// n / d for n in [0, 2^31).
  [[nodiscard]] constexpr int divide(int n) const noexcept {
    return static_cast<int>((static_cast<std::uint64_t>(n) * multiplier_) >> shift_);
  }
  /// ceil(n / d) for n in [0, 2^31 - d].
  [[nodiscard]] constexpr int divide_up(int n) const noexcept { return divide(n + (d_ - 1)); }
  /// n % d for n in [0, 2^31).
  [[nodiscard]] constexpr int remainder(int n) const noexcept { return n - divide(n) * d_; }

 private:
  int d_{1};
  int shift_{31};
  std::uint64_t multiplier_{0};
};

}  // namespace spg::core
