// Empty work on the device (issue 17): an op call with no tokens (s_q = 0, tokens_bucket = 0,
// rows_bucket = 0, a gather of no requests) returns cudaSuccess eagerly, adds no node to a graph
// captured around it, and writes nothing: its arrays are real device memory filled with a known
// byte (and guarded), so a launch that wrote anything would show, and a launch queued in capture
// would count as a node. The argument layer (null arrays accepted, other bounds kept) is
// tests/cpu/test_empty_work.cpp.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "common/catch.hpp"
#include "gpu/kernels_test_util.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/graph.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"

using namespace spg;
using namespace spg::kernels;
using spg::test::GuardedArray;

namespace {

constexpr std::uint8_t kFill = 0x5C;

/// Device memory an empty call is pointed at: filled with kFill, guarded on both sides.
struct Arena {
  explicit Arena(std::size_t bytes) : a(bytes) { a.fill_bytes(kFill); }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return reinterpret_cast<T*>(a.get());
  }
  /// Bytes that no longer hold kFill, guard bytes included.
  [[nodiscard]] std::size_t changed() const {
    std::size_t n = a.damaged_guard_bytes();
    for (std::uint8_t b : a.download()) n += b != kFill;
    return n;
  }
  GuardedArray<std::uint8_t> a;
};

/// Runs `launch` eagerly, then captured between two memsets of `marker` (so the graph is never
/// empty): the graph must hold the two memset nodes only, and replay cleanly.
void expect_empty(const char* what, const std::function<cudaError_t(cudaStream_t)>& launch, const Arena& marker) {
  INFO(what);
  core::Stream stream;
  REQUIRE(launch(stream.get()) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream.get()) == cudaSuccess);
  REQUIRE(cudaGetLastError() == cudaSuccess);

  graphs::CaptureGuard guard(stream.get());
  SPG_CUDA_TRY(cudaMemsetAsync(marker.as<std::uint8_t>(), kFill, 16, stream.get()));
  REQUIRE(launch(stream.get()) == cudaSuccess);
  SPG_CUDA_TRY(cudaMemsetAsync(marker.as<std::uint8_t>(), kFill, 16, stream.get()));
  const graphs::Graph graph = guard.finish();
  CHECK(graph.node_count() == 2);
  const graphs::GraphExec exec = graphs::GraphExec::instantiate(graph, stream.get());
  for (int replay = 0; replay < 2; ++replay) REQUIRE(exec.launch(stream.get()) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream.get()) == cudaSuccess);
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

}  // namespace

TEST_CASE("empty work: every op with no tokens launches nothing, eager or captured, and writes nothing",
          "[gpu][empty]") {
  const Arena marker(64);
  // Real arrays for one token / request of each op, so a launch would have memory to write.
  const Arena q(128 * 576 * 2);
  const Arena kv(64 * 576 * 2);
  const Arena indices(512 * 4);
  const Arena out(128 * 512 * 2);
  const Arena max_logits(128 * 4);
  const Arena lse(128 * 4);
  const Arena workspace(1 << 20);
  const CacheLayout layout = CacheLayout::make(64, 2);
  const Arena cache(static_cast<std::size_t>(layout.block_stride) * 2);
  const Arena ints(4096);
  const Arena rows(64 * 512 * 2);

  for (const bool null_arrays : {false, true}) {
    DYNAMIC_SECTION((null_arrays ? "null arrays" : "real arrays")) {
      const auto ptr = [&](const Arena& a) { return null_arrays ? nullptr : a.as<std::uint8_t>(); };

      for (const SparseMlaPath path : {SparseMlaPath::automatic, SparseMlaPath::split_topk,
                                       SparseMlaPath::single_pass_mma}) {
        SparseMlaArgs a{};
        a.q = reinterpret_cast<const __nv_bfloat16*>(ptr(q));
        a.kv = reinterpret_cast<const __nv_bfloat16*>(ptr(kv));
        a.kv_row_stride = 576;
        a.s_kv = null_arrays ? 0 : 64;
        a.indices = reinterpret_cast<const std::int32_t*>(ptr(indices));
        a.topk = 512;
        a.s_q = 0;
        a.h_q = 128;
        a.d_qk = 576;
        a.sm_scale = 0.04f;
        a.out = reinterpret_cast<__nv_bfloat16*>(ptr(out));
        a.max_logits = reinterpret_cast<float*>(ptr(max_logits));
        a.lse = reinterpret_cast<float*>(ptr(lse));
        a.path = path;
        REQUIRE_NOTHROW(SparseMla::can_implement(a));
        CHECK(SparseMla::workspace_bytes(a) == 0);
        expect_empty("sparse_mla, s_q = 0",
                     [&](cudaStream_t s) { return SparseMla::run(a, null_arrays ? nullptr : ptr(workspace), s); },
                     marker);
      }

      CombineIndicesArgs c{};
      c.topk_indices = reinterpret_cast<const std::int32_t*>(ptr(indices));
      c.top_k = 512;
      c.compress_ratio = 4;
      c.window = 128;
      const auto* words = reinterpret_cast<const std::int32_t*>(ptr(ints));
      c.chunk = ChunkArrays{nullptr, words, words, words};
      c.tokens_bucket = 0;
      c.requests_bucket = null_arrays ? 0 : 2;
      c.combined = reinterpret_cast<std::int32_t*>(ptr(out));
      c.combined_width = 640;
      c.lens = reinterpret_cast<std::int32_t*>(ptr(lse));
      c.n_rows.value = 10;
      c.m_rows.value = 100;
      REQUIRE_NOTHROW(CombineIndices::can_implement(c));
      expect_empty("combine, tokens_bucket = 0", [&](cudaStream_t s) { return CombineIndices::run(c, s); },
                   marker);

      KvInsertArgs i{};
      i.rows = reinterpret_cast<const __nv_bfloat16*>(ptr(rows));
      i.slot_mapping = words;
      i.rows_bucket = 0;
      i.cache = cache.as<std::uint8_t>();
      i.layout = layout;
      REQUIRE_NOTHROW(KvInsert::can_implement(i));
      expect_empty("insert, rows_bucket = 0", [&](cudaStream_t s) { return KvInsert::run(i, s); }, marker);

      KvGatherArgs g{};
      g.cache = cache.as<std::uint8_t>();
      g.layout = layout;
      g.block_table = words;
      g.block_table_stride = null_arrays ? 0 : 4;
      g.chunk = ChunkArrays{nullptr, nullptr, words, words};
      g.part = GatherPart::window;
      g.compress_ratio = 1;
      g.requests_bucket = 0;
      g.max_rows_per_request = null_arrays ? 0 : 64;
      g.kv = reinterpret_cast<__nv_bfloat16*>(ptr(rows));
      REQUIRE_NOTHROW(KvGather::can_implement(g));
      expect_empty("gather, requests_bucket = 0", [&](cudaStream_t s) { return KvGather::run(g, s); },
                   marker);
    }
  }
  for (const Arena* a : {&marker, &q, &kv, &indices, &out, &max_logits, &lse, &workspace, &cache, &ints, &rows}) {
    CHECK(a->changed() == 0);
  }
}
