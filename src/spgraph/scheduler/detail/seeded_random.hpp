// Seeded random numbers that are the same on every standard library: mt19937_64's output is fixed
// by the C++ standard, while std::*_distribution are not, so the mappings are written here.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace spg::scheduler::detail {

class SeededRandom {
 public:
  explicit SeededRandom(std::uint64_t seed) : engine_(seed) {}

  /// Uniform in [lo, hi] without modulo bias.
  std::int64_t uniform_int(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t range = static_cast<std::uint64_t>(hi - lo) + 1;
    if (range == 0) {  // the whole 64-bit range
      return static_cast<std::int64_t>(engine_());
    }
    const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() -
                                std::numeric_limits<std::uint64_t>::max() % range;
    std::uint64_t x = engine_();
    while (x >= limit) {
      x = engine_();
    }
    return lo + static_cast<std::int64_t>(x % range);
  }

  /// Uniform in the open interval (0, 1): 53 random bits, centred in their cell.
  double uniform_open() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1.0p-53; }

  /// Standard normal (Box-Muller, one value per call so the stream has no hidden state).
  double normal() {
    const double u1 = uniform_open();
    const double u2 = uniform_open();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }

  /// Exponential with the given rate (mean 1 / rate).
  double exponential(double rate) { return -std::log(uniform_open()) / rate; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace spg::scheduler::detail
