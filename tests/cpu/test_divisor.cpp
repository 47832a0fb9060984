// core::Divisor (src/spgraph/core/divisor.hpp): the multiply-and-shift quotient equals integer
// division for every divisor the encoder uses and beyond, at the numerators where a wrong
// multiplier would show first (multiples of d and their neighbours, the top of the range).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/divisor.hpp"

using spg::core::Divisor;

TEST_CASE("Divisor's quotient, remainder and rounded-up quotient equal integer division", "[cpu][divisor]") {
  std::vector<int> divisors;
  for (int d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (const int d : {2047, 2048, 2049, 4096, 8191, 8192, 65535, 65537, 1 << 20, (1 << 30) - 1, 1 << 30,
                      (1 << 30) + 1, 2147483647}) {
    divisors.push_back(d);
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + static_cast<int>(rng() % 2147483646U));
  constexpr int kTop = 2147483647;
  int mismatches = 0;
  std::string first;
  auto expect = [&](const Divisor& v, int n) {
    const int d = v.value();
    const bool ok = v.divide(n) == n / d && v.remainder(n) == n % d &&
                    (n > kTop - (d - 1) || v.divide_up(n) == static_cast<int>((std::int64_t{n} + d - 1) / d));
    if (!ok && mismatches++ == 0) first = std::to_string(n) + " / " + std::to_string(d);
  };
  for (const int d : divisors) {
    const Divisor v(d);
    for (const int n : {0, 1, 2, d - 1, d, kTop, kTop - 1, kTop - d + 1}) {
      if (n >= 0) expect(v, n);
    }
    for (int k = 0; k < 300; ++k) {
      const std::int64_t q = k < 150 ? k : static_cast<std::int64_t>(rng() % (static_cast<unsigned>(kTop / d) + 1U));
      for (const std::int64_t n : {q * d - 1, q * d, q * d + 1, q * d + d - 1}) {
        if (n >= 0 && n <= kTop) expect(v, static_cast<int>(n));
      }
    }
    for (int k = 0; k < 100; ++k) expect(v, static_cast<int>(rng() % 2147483648U));
  }
  INFO("first mismatch: " << first);
  CHECK(mismatches == 0);
  // Constant-evaluable, as the encoder's members are built.
  static_assert(Divisor(64).divide(4095) == 63 && Divisor(3).remainder(10) == 1 && Divisor(1).divide(kTop) == kTop);
}
