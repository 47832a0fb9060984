// Argument checking of the standalone calls of the combine, insert and gather (chunk.scalars or
// num_rows null, as the Python package makes them), which needs no device: what they accept and
// every new bound, named in its InvalidArgument message. Pointers are fake aligned addresses.
#include <cstdint>
#include <limits>
#include <string>

#include "common/catch.hpp"
#include "common/expect_rejected.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"

namespace {

namespace k = spg::kernels;

template <class T>
T* fake(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

k::CombineIndicesArgs standalone_combine() {
  k::CombineIndicesArgs a;
  a.topk_indices = fake<const std::int32_t>(0x10000);
  a.top_k = 512;
  a.compress_ratio = 4;
  a.window = 128;
  a.chunk = k::ChunkArrays{nullptr, fake<const std::int32_t>(0x20000), fake<const std::int32_t>(0x30000),
                           fake<const std::int32_t>(0x40000)};
  a.tokens_bucket = 7;
  a.requests_bucket = 2;
  a.combined = fake<std::int32_t>(0x50000);
  a.combined_width = 640;
  a.lens = fake<std::int32_t>(0x60000);
  a.n_rows.value = 200;
  a.m_rows.value = 1000;
  return a;
}

using spg::test::expect_rejected;

}  // namespace

TEST_CASE("combine: a standalone call takes N and M by value or on the device, and no status",
          "[combine]") {
  const k::CombineIndicesArgs a = standalone_combine();
  REQUIRE_NOTHROW(k::CombineIndices::can_implement(a));
  auto check = [](const k::CombineIndicesArgs& b) { k::CombineIndices::can_implement(b); };

  k::CombineIndicesArgs b = a;
  b.n_rows.device = fake<const std::int32_t>(0x70000);  // N on the device: the host cannot compare it with M
  b.n_rows.value = 5000;
  CHECK_NOTHROW(check(b));
  b.m_rows.device = fake<const std::int32_t>(0x70004);
  b.m_rows.value = -1;
  CHECK_NOTHROW(check(b));
  b.m_rows.device = fake<const std::int32_t>(0x70002);
  expect_rejected(b, check, "M = 0x70002 (device scalar) must be 4-byte aligned");

  b = a;
  b.n_rows.value = -1;
  expect_rejected(b, check, "N = -1 must be at least 0");
  b = a;
  b.n_rows.value = 1001;
  expect_rejected(b, check, "N = 1001 must be at most M = 1000");
  b = a;
  b.m_rows.value = std::numeric_limits<std::int32_t>::max() / 2 + 1;
  expect_rejected(b, check, "(2^31 - 1) / requests = 1073741823");

  b = a;  // a top-k row stride: at least top_k; the vector path needs it a multiple of 4 too
  b.topk_row_stride = 1024;
  CHECK_NOTHROW(check(b));
  b.topk_row_stride = 511;
  expect_rejected(b, check, "topk_row_stride = 511 must be 0 (rows packed) or at least top_k = 512");
  b.topk_row_stride = 514;
  b.topk_indices = fake<const std::int32_t>(0x10004);  // 4-byte alignment is enough then
  CHECK_NOTHROW(check(b));
  b.topk_row_stride = 1024;
  expect_rejected(b, check, "topk_indices = 0x10004 must be 16-byte aligned");
}

TEST_CASE("kv cache ops: standalone calls need no num_rows, no chunk scalars, no status; the window "
          "offset is bounded by M", "[kv_cache]") {
  const k::CacheLayout layout = k::CacheLayout::make(64, 4);
  k::KvInsertArgs insert{};
  insert.rows = fake<const __nv_bfloat16>(0x10000);
  insert.slot_mapping = fake<const std::int32_t>(0x20000);
  insert.rows_bucket = 9;
  insert.cache = fake<std::uint8_t>(0x100000);
  insert.layout = layout;
  CHECK_NOTHROW(k::KvInsert::can_implement(insert));

  k::KvGatherArgs g{};
  g.cache = fake<const std::uint8_t>(0x100000);
  g.layout = layout;
  g.block_table = fake<const std::int32_t>(0x30000);
  g.block_table_stride = 5;
  g.chunk = k::ChunkArrays{nullptr, nullptr, fake<const std::int32_t>(0x40000), fake<const std::int32_t>(0x40000)};
  g.part = k::GatherPart::window;
  g.compress_ratio = 1;
  g.requests_bucket = 2;
  g.max_rows_per_request = 300;
  g.kv = fake<__nv_bfloat16>(0x200000);
  g.window_offset = 300;
  CHECK_NOTHROW(k::KvGather::can_implement(g));
  auto check = [](const k::KvGatherArgs& b) { k::KvGather::can_implement(b); };
  k::KvGatherArgs b = g;
  b.window_offset = 301;
  expect_rejected(b, check, "window_offset = 301 must be in [0, max_rows_per_request = 300]");
  b.window_offset = -1;
  expect_rejected(b, check, "window_offset = -1 must be in [0, max_rows_per_request = 300]");
  b = g;  // with chunk scalars the offset is the chunk's N, read on the device: window_offset is ignored
  b.chunk.scalars = fake<const k::ChunkScalars>(0x50000);
  b.window_offset = 301;
  CHECK_NOTHROW(check(b));
}
