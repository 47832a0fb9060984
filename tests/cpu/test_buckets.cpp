// Bucket sets and their O(1) lookup.
#include <string>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/buckets.hpp"

using spg::graphs::BucketSet;

TEST_CASE("default buckets step by powers of two and 1.5x and end at the maxima", "[buckets]") {
  const BucketSet b = BucketSet::make_default(4, 2048);
  CHECK(b.r_buckets() == std::vector<int>{1, 2, 4});
  CHECK(b.t_buckets() == std::vector<int>{16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048});
  CHECK(b.size() == 45);
  const BucketSet odd = BucketSet::make_default(3, 1000);
  CHECK(odd.r_buckets() == std::vector<int>{1, 2, 3});
  CHECK(odd.t_buckets().back() == 1000);
  CHECK(odd.t_buckets()[odd.t_buckets().size() - 2] == 768);
  const BucketSet tiny = BucketSet::make_default(1, 7);
  CHECK(tiny.t_buckets() == std::vector<int>{7});
}

TEST_CASE("lookup picks the smallest bucket that holds the chunk", "[buckets]") {
  const BucketSet b = BucketSet::make_default(4, 2048);
  auto shape = [&](int r, int t) {
    const int i = b.lookup(r, t);
    REQUIRE(i >= 0);
    return std::pair<int, int>(b.r_of(i), b.t_of(i));
  };
  CHECK(shape(1, 1) == std::pair<int, int>(1, 16));
  CHECK(shape(1, 16) == std::pair<int, int>(1, 16));
  CHECK(shape(1, 17) == std::pair<int, int>(1, 24));
  CHECK(shape(3, 100) == std::pair<int, int>(4, 128));
  CHECK(shape(2, 1537) == std::pair<int, int>(2, 2048));
  CHECK(shape(0, 0) == std::pair<int, int>(1, 16));
  CHECK(b.lookup(5, 10) == -1);
  CHECK(b.lookup(1, 2049) == -1);
  CHECK(b.lookup(-1, 3) == -1);
  // Every (r, t) maps to a bucket that holds it, and no smaller bucket does.
  for (int r = 0; r <= 4; ++r) {
    for (int t = 0; t <= 2048; t += 7) {
      const int i = b.lookup(r, t);
      REQUIRE(i >= 0);
      CHECK(b.r_of(i) >= r);
      CHECK(b.t_of(i) >= t);
    }
  }
}

TEST_CASE("explicit bucket lists are checked", "[buckets]") {
  CHECK_NOTHROW(BucketSet({1, 4}, {64, 128}, 4, 128));
  try {
    BucketSet({1, 2}, {64, 128}, 4, 128);
    FAIL("expected InvalidArgument");
  } catch (const spg::InvalidArgument& e) {
    CHECK(std::string(e.what()).find("r_buckets ends at 2 but must end at the maximum 4") != std::string::npos);
  }
  CHECK_THROWS_AS(BucketSet({1, 4}, {128, 64, 128}, 4, 128), spg::InvalidArgument);
  CHECK_THROWS_AS(BucketSet({0, 4}, {128}, 4, 128), spg::InvalidArgument);
  CHECK_THROWS_AS(BucketSet({4}, {}, 4, 128), spg::InvalidArgument);
}
