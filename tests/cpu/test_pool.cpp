// PoolPlan's counting pass and BufferPool's checked views, on host-memory backing (no GPU).
#include <cstdint>
#include <limits>
#include <string>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/memory/buffer_pool.hpp"
#include "spgraph/memory/pool_plan.hpp"

using spg::memory::BufferPool;
using spg::memory::MemoryKind;
using spg::memory::PoolBacking;
using spg::memory::PoolPlan;
using spg::memory::SlotSpec;

namespace {
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return {};
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("pool plan places awkward slot sizes at their alignment", "[pool]") {
  PoolPlan plan;
  const auto& a = plan.add(SlotSpec{"a", 1, 1});
  CHECK(a.offset == 0);
  const auto& b = plan.add(SlotSpec{"b", 13, 16});
  CHECK(b.offset == 16);
  const auto& c = plan.add(SlotSpec{"c", 4097, 256});
  CHECK(c.offset == 256);
  const auto& d = plan.add(SlotSpec{"d", 3, 4096});
  CHECK(d.offset == 8192);  // 256 + 4097 = 4353 -> next 4096 boundary
  const auto& e = plan.add(SlotSpec{"e", 7, 8, MemoryKind::pinned_host});
  CHECK(e.offset == 0);  // each kind counts on its own
  const auto& f = plan.add(SlotSpec{"f", 5, 64, MemoryKind::pinned_host});
  CHECK(f.offset == 64);
  CHECK(plan.device_bytes() == 12288);  // 8195 rounded to 4096
  CHECK(plan.pinned_bytes() == 4096);
  for (const auto& s : plan.slots()) {
    CHECK(s.offset % s.spec.alignment == 0);
  }
  const std::string table = plan.table();
  CHECK(contains(table, "slot"));
  CHECK(contains(table, "4097"));
  CHECK(contains(table, "total device: 12288 B"));
}

TEST_CASE("pool plan rejects bad slots with the argument named", "[pool]") {
  PoolPlan plan;
  plan.add(SlotSpec{"q", 64});
  CHECK(contains(message_of<spg::InvalidArgument>([&] { plan.add(SlotSpec{"q", 8}); }), "slot 'q' is already in the plan"));
  CHECK(contains(message_of<spg::InvalidArgument>([&] { plan.add(SlotSpec{"z", 0}); }), "slot 'z': bytes = 0"));
  CHECK(contains(message_of<spg::InvalidArgument>([&] { plan.add(SlotSpec{"x", 8, 24}); }),
                 "alignment = 24 must be a power of two in [1, 4096]"));
  CHECK(contains(message_of<spg::InvalidArgument>([&] { plan.add(SlotSpec{"", 8}); }), "name must not be empty"));
  CHECK(contains(message_of<spg::InvalidArgument>([&] { (void)plan.slot("nope"); }), "no slot named 'nope'"));
  CHECK(plan.slots().size() == 1);  // nothing half-added
}

TEST_CASE("buffer pool views are checked against their slot", "[pool]") {
  PoolPlan plan;
  plan.add(SlotSpec{"rows", 10 * 6 * sizeof(float), 256, MemoryKind::device, "[10, 6] f32"});
  plan.add(SlotSpec{"meta", 64, 256, MemoryKind::pinned_host});
  BufferPool pool(plan, 0, PoolBacking::host_memory);
  CHECK(pool.allocation_calls() == 2);

  auto whole = pool.span<float>("rows");
  CHECK(whole.size() == 60);
  auto first = pool.view<float, 2>("rows", {4, 6});  // workspace slicing: the first 4 rows
  CHECK(first.extent(0) == 4);
  CHECK(first.extent(1) == 6);
  CHECK(first.data_handle() == whole.data());
  CHECK(reinterpret_cast<std::uintptr_t>(whole.data()) % 256 == 0);
  CHECK(pool.span<std::int32_t>("meta").data() != nullptr);

  const std::string msg = message_of<spg::CapacityError>([&] { (void)pool.view<float, 2>("rows", {11, 6}); });
  CHECK(contains(msg, "slot 'rows'"));
  CHECK(contains(msg, "requested 66 elements (264 B)"));
  CHECK(contains(msg, "reserved 240 B"));
  CHECK(contains(msg, "[10, 6] f32"));
  CHECK_THROWS_AS(pool.bytes("rows", 241), spg::CapacityError);
  CHECK_THROWS_AS(pool.span<float>("missing"), spg::InvalidArgument);
  // A slot aligned to 256 cannot be viewed as a type that needs more.
  struct alignas(512) Wide {
    char c[512];
  };
  CHECK_THROWS_AS(pool.span<Wide>("rows", 0), spg::InvalidArgument);
}

TEST_CASE("buffer pool carves warm-up slots from its headroom until sealed", "[pool]") {
  PoolPlan plan;
  plan.add(SlotSpec{"a", 1000});
  BufferPool pool(plan, 8192, PoolBacking::host_memory);
  const auto& ws = pool.carve(SlotSpec{"attention_workspace", 5000});
  CHECK(ws.offset >= 1000);  // after the planned slots
  CHECK(pool.span<std::uint8_t>("attention_workspace").size() == 5000);
  const std::string too_big = message_of<spg::CapacityError>([&] { pool.carve(SlotSpec{"big", 9000}); });
  CHECK(contains(too_big, "slot 'big' needs 9000 B"));
  CHECK(pool.plan().find("big") == nullptr);  // a refused carve leaves no trace

  pool.seal();
  CHECK(pool.sealed());
  const std::string sealed = message_of<spg::StateError>([&] { pool.carve(SlotSpec{"late", 16}); });
  CHECK(contains(sealed, "sealed"));
  CHECK(contains(sealed, "'late'"));
  CHECK(pool.allocation_calls() == 1);  // no pinned slots: one allocation in all, ever
}

TEST_CASE("buffer pools move without double frees", "[pool]") {
  PoolPlan plan;
  plan.add(SlotSpec{"a", 128});
  BufferPool first(plan, 0, PoolBacking::host_memory);
  std::byte* base = first.device_base();
  BufferPool second(std::move(first));
  CHECK(second.device_base() == base);
  BufferPool third(plan, 0, PoolBacking::host_memory);
  third = std::move(second);
  CHECK(third.device_base() == base);
  CHECK(third.span<std::uint8_t>("a").size() == 128);
}

TEST_CASE("sizes that would wrap are refused, never placed at a small offset", "[pool]") {
  constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max();
  PoolPlan plan;
  plan.add(SlotSpec{"a", 1000});
  // Issue 17: add() computed offset + bytes in size_t and wrapped to a small end.
  CHECK(contains(message_of<spg::CapacityError>([&] { plan.add(SlotSpec{"wraps", kHuge - 100}); }),
                 "slot 'wraps': bytes = "));
  CHECK(contains(message_of<spg::CapacityError>([&] { plan.add(SlotSpec{"half", kHuge / 2}); }), "does not fit a pool"));
  CHECK(plan.slots().size() == 1);
  CHECK(plan.device_bytes() == 4096);
  // Slots that fit one at a time but not together.
  plan.add(SlotSpec{"big", kHuge / 4});
  CHECK_THROWS_AS(plan.add(SlotSpec{"bigger", kHuge / 4 + 4096}), spg::CapacityError);
  CHECK(plan.device_bytes() >= kHuge / 4);

  PoolPlan small;
  small.add(SlotSpec{"a", 1000});
  CHECK_THROWS_AS(BufferPool(small, kHuge - 10, PoolBacking::host_memory), spg::CapacityError);
  BufferPool pool(small, 8192, PoolBacking::host_memory);
  // carve(): the capacity check wrapped (offset + bytes) and accepted the slot.
  CHECK(contains(message_of<spg::CapacityError>([&] { pool.carve(SlotSpec{"ws", kHuge - 2000}); }),
                 "slot 'ws' needs"));
  CHECK(pool.plan().find("ws") == nullptr);
  CHECK(pool.headroom_left() == 8192);
  // view(): the product of the extents wrapped to a small count and passed the slot's check.
  const std::string msg = message_of<spg::CapacityError>(
      [&] { (void)pool.view<std::uint8_t, 2>("a", {std::size_t{1} << 33, std::size_t{1} << 31}); });
  CHECK(contains(msg, "slot 'a': the 2 extents requested hold more than 2^64 elements"));
  CHECK(contains(message_of<spg::CapacityError>([&] { (void)pool.span<float>("a", kHuge / 2); }),
                 "more than 2^64 B"));
  CHECK(pool.view<std::uint8_t, 2>("a", {10, 100}).size() == 1000);
}
