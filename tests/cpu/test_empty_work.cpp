// Empty work (issue 17): an op call with no tokens (s_q = 0, tokens_bucket = 0, rows_bucket = 0,
// or a gather of requests_bucket = 0) is accepted with its row arrays null, every other argument
// still checked, and run() returns cudaSuccess without touching the device. These run without a
// GPU: a run() that reached a CUDA call would return an error here (there is no device), so the
// run() checks fail if an empty call launches or queries anything. The GPU side (an empty call
// captured into a graph adds no node and writes nothing) is tests/gpu/test_empty_work.cpp.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/catch.hpp"
#include "common/expect_rejected.hpp"
#include "common/sparse_mla_shape_args.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"

namespace {

namespace k = spg::kernels;

template <class T>
T* fake(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

using spg::test::expect_rejected;

k::SparseMlaArgs empty_attention() {
  k::SparseMlaArgs a = spg::test::mla::shape_only_args(0, 512, 0, 128, 512);
  a.q = nullptr;  // an empty torch tensor's data pointer
  a.kv = nullptr;
  a.indices = nullptr;
  a.out = nullptr;
  a.max_logits = nullptr;
  a.lse = nullptr;
  return a;
}

k::CombineIndicesArgs empty_combine() {
  k::CombineIndicesArgs a;
  a.top_k = 512;
  a.compress_ratio = 4;
  a.window = 128;
  a.chunk = k::ChunkArrays{nullptr, nullptr, nullptr, nullptr};
  a.tokens_bucket = 0;
  a.requests_bucket = 0;
  a.combined_width = 640;
  a.n_rows.value = 0;
  a.m_rows.value = 0;
  return a;
}

k::KvInsertArgs empty_insert() {
  k::KvInsertArgs a;
  a.rows_bucket = 0;
  a.cache = fake<std::uint8_t>(0x100000);
  a.layout = k::CacheLayout::make(64, 4);
  return a;
}

k::KvGatherArgs empty_gather() {
  k::KvGatherArgs a;
  a.cache = fake<const std::uint8_t>(0x100000);
  a.layout = k::CacheLayout::make(64, 4);
  a.part = k::GatherPart::window;
  a.compress_ratio = 1;
  a.requests_bucket = 0;
  a.max_rows_per_request = 0;
  a.block_table_stride = 0;
  return a;
}

}  // namespace

TEST_CASE("empty work: sparse_mla with s_q = 0 is accepted with null arrays and runs nothing",
          "[sparse_mla][empty]") {
  const k::SparseMlaArgs a = empty_attention();
  REQUIRE_NOTHROW(k::SparseMla::can_implement(a));
  CHECK(k::SparseMla::run(a, nullptr, nullptr) == cudaSuccess);
  k::SparseMlaArgs split = a;  // an explicit split path needs no workspace for no tokens
  split.path = k::SparseMlaPath::split_topk;
  REQUIRE_NOTHROW(k::SparseMla::can_implement(split));
  CHECK(k::SparseMla::run(split, nullptr, nullptr) == cudaSuccess);

  auto check = [](const k::SparseMlaArgs& b) { k::SparseMla::can_implement(b); };
  k::SparseMlaArgs b = spg::test::mla::shape_only_args(100, 512, -1, 128, 512);  // arrays given
  expect_rejected(b, check, "s_q = -1 must be at least 0");
  b = a;
  b.h_q = 96;  // every other bound still holds for an empty call
  expect_rejected(b, check, "h_q = 96 must be 64 or 128");
  b = a;
  b.topk = 100;
  expect_rejected(b, check, "topk = 100 must be a positive multiple of 64");
  b = a;
  b.s_kv = -1;
  expect_rejected(b, check, "s_kv = -1 must be at least 0");
  b = a;
  b.s_q = 1;  // one token: the arrays are needed again
  b.s_kv = 100;
  expect_rejected(b, check, "q is null");
}

TEST_CASE("empty work: combine with tokens_bucket = 0 is accepted with null arrays and runs nothing",
          "[combine][empty]") {
  const k::CombineIndicesArgs a = empty_combine();
  REQUIRE_NOTHROW(k::CombineIndices::can_implement(a));
  CHECK(k::CombineIndices::run(a, nullptr) == cudaSuccess);
  k::CombineIndicesArgs with_requests = a;  // no tokens of two requests
  with_requests.requests_bucket = 2;
  with_requests.m_rows.value = 1000;
  REQUIRE_NOTHROW(k::CombineIndices::can_implement(with_requests));
  CHECK(k::CombineIndices::run(with_requests, nullptr) == cudaSuccess);

  auto check = [](const k::CombineIndicesArgs& b) { k::CombineIndices::can_implement(b); };
  k::CombineIndicesArgs given = a;  // every array given: the bounds themselves are at fault
  given.topk_indices = fake<const std::int32_t>(0x10000);
  given.chunk = k::ChunkArrays{nullptr, fake<const std::int32_t>(0x20000), fake<const std::int32_t>(0x30000),
                               fake<const std::int32_t>(0x40000)};
  given.combined = fake<std::int32_t>(0x50000);
  given.lens = fake<std::int32_t>(0x60000);
  k::CombineIndicesArgs b = given;
  b.tokens_bucket = -1;
  expect_rejected(b, check, "tokens_bucket = -1 must be in [0, 2^24]");
  b = a;
  b.window = 0;
  expect_rejected(b, check, "window = 0 must be in [1, 65536]");
  b = a;
  b.combined_width = 600;
  expect_rejected(b, check, "combined_width = 600");
  b = a;
  b.n_rows.value = 5;  // N > M = 0
  expect_rejected(b, check, "N = 5 must be at most M = 0");
  b = given;
  b.tokens_bucket = 3;  // tokens with no request to belong to
  expect_rejected(b, check, "requests_bucket = 0 must be in [1, 128] (tokens_bucket > 0)");
}

TEST_CASE("empty work: the insert with rows_bucket = 0 is accepted with null rows and runs nothing",
          "[kv_cache][empty]") {
  const k::KvInsertArgs a = empty_insert();
  REQUIRE_NOTHROW(k::KvInsert::can_implement(a));
  CHECK(k::KvInsert::run(a, nullptr) == cudaSuccess);

  auto check = [](const k::KvInsertArgs& b) { k::KvInsert::can_implement(b); };
  k::KvInsertArgs b = a;
  b.rows = fake<const __nv_bfloat16>(0x10000);
  b.slot_mapping = fake<const std::int32_t>(0x20000);
  b.rows_bucket = -1;
  expect_rejected(b, check, "rows_bucket = -1 must be in [0, 2^24]");
  b = a;
  b.cache = nullptr;  // the cache is still checked
  expect_rejected(b, check, "cache is null");
  b = a;
  b.layout.block_stride += 16;
  expect_rejected(b, check, "block_stride");
  b = a;
  b.rows_bucket = 1;
  expect_rejected(b, check, "rows is null");
}

TEST_CASE("empty work: the gather of requests_bucket = 0 is accepted with null arrays and runs nothing",
          "[kv_cache][empty]") {
  const k::KvGatherArgs a = empty_gather();
  REQUIRE_NOTHROW(k::KvGather::can_implement(a));
  CHECK(k::KvGather::run(a, nullptr) == cudaSuccess);

  auto check = [](const k::KvGatherArgs& b) { k::KvGather::can_implement(b); };
  k::KvGatherArgs b = a;
  b.requests_bucket = -1;
  expect_rejected(b, check, "requests_bucket = -1 must be in [0, 128]");
  b = a;
  b.cache = nullptr;
  expect_rejected(b, check, "cache is null");
  b = a;
  b.window_offset = 1;  // past max_rows_per_request = 0
  expect_rejected(b, check, "window_offset = 1 must be in [0, max_rows_per_request = 0]");
  b = a;
  b.requests_bucket = 1;  // one request: the arrays are needed again
  expect_rejected(b, check, "max_rows_per_request = 0 must be in [1");
}
