// BlockAllocator: the free list never hands a block out twice, never leaks, and rejects misuse.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/scheduler/block_allocator.hpp"

using spg::scheduler::BlockAllocator;

TEST_CASE("a fresh pool hands out every id once, then reports empty", "[block_allocator]") {
  BlockAllocator pool(7);
  CHECK(pool.total() == 7);
  CHECK(pool.free() == 7);
  CHECK(pool.in_use() == 0);
  std::set<std::int32_t> seen;
  for (int i = 0; i < 7; ++i) {
    const std::int32_t b = pool.allocate();
    CHECK(b == i);  // ascending on a fresh pool
    CHECK(seen.insert(b).second);
    CHECK(pool.is_in_use(b));
    CHECK(pool.in_use() + pool.free() == pool.total());
  }
  CHECK_THROWS_AS(pool.allocate(), spg::CapacityError);
  std::vector<std::int32_t> out{42};
  CHECK_FALSE(pool.try_allocate(1, out));
  CHECK(out == std::vector<std::int32_t>{42});
  CHECK(pool.try_allocate(0, out));
  CHECK(out.size() == 1);

  pool.release(3);
  CHECK(pool.allocate() == 3);  // released blocks are reused
}

TEST_CASE("try_allocate is all-or-nothing", "[block_allocator]") {
  BlockAllocator pool(5);
  std::vector<std::int32_t> table;
  REQUIRE(pool.try_allocate(3, table));
  CHECK(table.size() == 3);
  CHECK_FALSE(pool.try_allocate(3, table));
  CHECK(table.size() == 3);
  CHECK(pool.free() == 2);
  REQUIRE(pool.try_allocate(2, table));
  CHECK(table.size() == 5);
  CHECK(pool.free() == 0);
  CHECK_THROWS_AS(pool.try_allocate(-1, table), spg::InvalidArgument);
}

TEST_CASE("misuse throws InvalidArgument and changes nothing", "[block_allocator]") {
  CHECK_THROWS_AS(BlockAllocator(-1), spg::InvalidArgument);
  BlockAllocator empty(0);
  CHECK(empty.total() == 0);
  CHECK_THROWS_AS(empty.allocate(), spg::CapacityError);

  BlockAllocator pool(4);
  const std::int32_t a = pool.allocate();
  const std::int32_t b = pool.allocate();
  CHECK_THROWS_AS(pool.release(-1), spg::InvalidArgument);
  CHECK_THROWS_AS(pool.release(4), spg::InvalidArgument);
  CHECK_THROWS_AS(pool.release(2), spg::InvalidArgument);  // never allocated
  pool.release(a);
  CHECK_THROWS_AS(pool.release(a), spg::InvalidArgument);  // double release
  try {
    pool.release(a);
  } catch (const spg::InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("not in use"));
  }

  // A batch with a bad entry is rejected whole: b stays in use.
  const std::vector<std::int32_t> duplicate{b, b};
  CHECK_THROWS_AS(pool.release(duplicate), spg::InvalidArgument);
  const std::vector<std::int32_t> foreign{b, 9};
  CHECK_THROWS_AS(pool.release(foreign), spg::InvalidArgument);
  CHECK(pool.is_in_use(b));
  CHECK(pool.in_use() == 1);
  CHECK(pool.in_use() + pool.free() == pool.total());
  const std::vector<std::int32_t> good{b};
  pool.release(good);
  CHECK(pool.in_use() == 0);
}

TEST_CASE("random allocate/release sequences match a set model", "[block_allocator]") {
  for (std::uint32_t seed = 1; seed <= 50; ++seed) {
    std::mt19937 rng(seed);
    const int total = static_cast<int>(rng() % 40);
    BlockAllocator pool(total);
    std::set<std::int32_t> held;
    for (int op = 0; op < 400; ++op) {
      const unsigned kind = rng() % 3;
      if (kind == 0) {
        const int n = static_cast<int>(rng() % 6);
        std::vector<std::int32_t> got;
        const bool ok = pool.try_allocate(n, got);
        REQUIRE(ok == (n <= total - static_cast<int>(held.size())));
        REQUIRE(got.size() == static_cast<std::size_t>(ok ? n : 0));
        for (const std::int32_t b : got) {
          REQUIRE(b >= 0);
          REQUIRE(b < total);
          REQUIRE(held.insert(b).second);  // never given twice
        }
      } else if (!held.empty()) {
        // Release a random subset, as one batch or one by one.
        std::vector<std::int32_t> batch;
        for (const std::int32_t b : held) {
          if (rng() % 2 == 0) {
            batch.push_back(b);
          }
        }
        if (kind == 1) {
          pool.release(batch);
        } else {
          for (const std::int32_t b : batch) {
            pool.release(b);
          }
        }
        for (const std::int32_t b : batch) {
          held.erase(b);
        }
      }
      REQUIRE(pool.in_use() == static_cast<int>(held.size()));
      REQUIRE(pool.in_use() + pool.free() == pool.total());
    }
    for (std::int32_t b = 0; b < total; ++b) {
      REQUIRE(pool.is_in_use(b) == held.contains(b));
    }
  }
}
