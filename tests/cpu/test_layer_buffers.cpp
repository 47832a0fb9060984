// Bindings of caller-owned buffers: every refusal names the layer, the buffer, what it got and what
// it needs, and comes before anything is allocated (the executor refuses on a machine with no GPU
// with the binding's message, not a CUDA error: no CUDA call was made). No device memory is
// touched: the addresses are never dereferenced.
#include <cstdint>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "common/small_configs.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"

using namespace spg;
using graphs::LayerBuffers;

namespace {

/// Fake, well-separated, 4096-aligned addresses: never dereferenced.
struct AddressSpace {
  std::uintptr_t next{std::uintptr_t{1} << 40};
  template <class T>
  T* take(std::size_t bytes) {
    T* p = reinterpret_cast<T*>(next);
    next += (bytes + (1 << 20) + 4095) / 4096 * 4096;  // a gap after every buffer
    return p;
  }
};

/// Every buffer of every layer bound, contiguous, at the config's sizes.
std::vector<LayerBuffers> full_binding(const model::PipelineConfig& c, AddressSpace& as) {
  std::vector<LayerBuffers> out;
  const auto T = static_cast<std::size_t>(c.max_tokens);
  for (const auto& l : c.layers) {
    LayerBuffers b;
    const auto h = static_cast<std::size_t>(l.h_q);
    b.q = graphs::contiguous_view<__nv_bfloat16, 3>(as.take<__nv_bfloat16>(T * h * 512 * 2), {T, h, 512});
    if (l.compress_ratio > 1) {
      const auto k = static_cast<std::size_t>(l.top_k);
      b.topk_indices = graphs::contiguous_view<std::int32_t, 2>(as.take<std::int32_t>(T * k * 4), {T, k});
      const std::size_t rows = graphs::required_rows(c, l, graphs::LayerBuffer::compressed_k_rows);
      b.compressed_k_rows = graphs::contiguous_view<__nv_bfloat16, 2>(as.take<__nv_bfloat16>(rows * 1024), {rows, 512});
      b.compressed_cache.layout = graphs::required_cache(c, l, graphs::LayerBuffer::compressed_cache);
      b.compressed_cache.data = as.take<std::uint8_t>(b.compressed_cache.bytes());
    }
    b.k_rows = graphs::contiguous_view<__nv_bfloat16, 2>(as.take<__nv_bfloat16>(T * 1024), {T, 512});
    b.swa_cache.layout = graphs::required_cache(c, l, graphs::LayerBuffer::swa_cache);
    b.swa_cache.data = as.take<std::uint8_t>(b.swa_cache.bytes());
    if (l.attn_sink) b.attn_sink = graphs::contiguous_view<float, 1>(as.take<float>(h * 4), {h});
    b.out = graphs::contiguous_view<__nv_bfloat16, 3>(as.take<__nv_bfloat16>(T * h * 1024), {T, h, 512});
    b.lse = graphs::contiguous_view<float, 2>(as.take<float>(T * h * 4), {T, h});
    b.max_logits = graphs::contiguous_view<float, 2>(as.take<float>(T * h * 4), {T, h});
    out.push_back(b);
  }
  return out;
}

std::string refusal(const model::PipelineConfig& c, const std::vector<LayerBuffers>& b,
                    std::vector<std::vector<int>> programs = {{0, 1}}, bool insert = true) {
  try {
    graphs::check_binding_shapes(c, b, programs, insert);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("a complete, well-formed binding passes the host checks", "[bindings]") {
  AddressSpace as;
  const auto c = test::two_layer_config(128);
  CHECK(refusal(c, full_binding(c, as)) == "accepted");
  CHECK(refusal(c, {}) == "accepted");  // nothing bound: everything pooled
  // Padded token strides for q and out, and more rows than the config needs, are fine.
  auto b = full_binding(c, as);
  b[1].q = graphs::strided_view<__nv_bfloat16, 3>(as.take<__nv_bfloat16>(1 << 24), {80, 128, 512}, {128 * 512 + 64, 512, 1});
  b[1].out = graphs::strided_view<__nv_bfloat16, 3>(as.take<__nv_bfloat16>(1 << 24), {64, 128, 512}, {128 * 520, 512, 1});
  CHECK(refusal(c, b) == "accepted");
  // A cache with a larger block stride (a multiple of 576) is fine too.
  b[0].swa_cache.layout.block_stride += 576;
  b[0].swa_cache.data = as.take<std::uint8_t>(b[0].swa_cache.bytes());
  CHECK(refusal(c, b) == "accepted");
}

TEST_CASE("every bound-buffer refusal names the layer, the buffer, the value and the bound", "[bindings]") {
  AddressSpace as;
  const auto c = test::two_layer_config(128);
  auto expect = [&](const std::vector<LayerBuffers>& b, const std::string& part, std::vector<std::vector<int>> programs = {{0, 1}},
                    bool insert = true) {
    const std::string msg = refusal(c, b, std::move(programs), insert);
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  SECTION("one entry per layer") {
    auto b = full_binding(c, as);
    b.pop_back();
    expect(b, "buffers holds 1 entries; it must be empty or hold one per layer (2)");
  }
  SECTION("null data with extents") {
    auto b = full_binding(c, as);
    b[0].q = graphs::contiguous_view<__nv_bfloat16, 3>(nullptr, {64, 64, 512});
    expect(b, "buffers[0].q has extents but its data pointer is null");
    b = full_binding(c, as);
    b[1].swa_cache.data = nullptr;
    expect(b, "buffers[1].swa_cache has extents but its data pointer is null");
  }
  SECTION("misaligned") {
    auto b = full_binding(c, as);
    b[0].lse = graphs::contiguous_view<float, 2>(b[0].lse.data_handle() + 1, {64, 64});
    expect(b, "buffers[0].lse = ");
    expect(b, "must be 16-byte aligned");
  }
  SECTION("too few rows") {
    auto b = full_binding(c, as);
    b[1].out = graphs::contiguous_view<__nv_bfloat16, 3>(b[1].out.data_handle(), {63, 128, 512});
    expect(b, "buffers[1].out: extents [63, 128, 512], strides [65536, 512, 1] has 63 rows; it needs at least 64");
    b = full_binding(c, as);
    b[0].compressed_k_rows = graphs::contiguous_view<__nv_bfloat16, 2>(b[0].compressed_k_rows.data_handle(), {19, 512});
    expect(b, "buffers[0].compressed_k_rows: extents [19, 512], strides [512, 1] has 19 rows; it needs at least 20");
  }
  SECTION("an extent that disagrees with the config") {
    auto b = full_binding(c, as);
    b[0].q = graphs::contiguous_view<__nv_bfloat16, 3>(b[0].q.data_handle(), {64, 128, 512});  // layer 0 has h_q 64
    expect(b, "buffers[0].q: extents [64, 128, 512], strides [65536, 512, 1]: extent 1 = 128 must be 64");
    b = full_binding(c, as);
    b[0].topk_indices = graphs::contiguous_view<std::int32_t, 2>(b[0].topk_indices.data_handle(), {64, 1024});
    expect(b, "buffers[0].topk_indices: extents [64, 1024], strides [1024, 1]: extent 1 = 1024 must be 512");
    b = full_binding(c, as);
    b[0].attn_sink = graphs::contiguous_view<float, 1>(b[0].attn_sink.data_handle(), {128});
    expect(b, "buffers[0].attn_sink: extents [128], strides [1] must be [64] contiguous");
    b = full_binding(c, as);
    b[1].swa_cache.layout.num_blocks = 104;
    expect(b, "buffers[1].swa_cache.layout.num_blocks = 104 must be 103");
    b = full_binding(c, as);
    b[0].compressed_cache.layout.block_size = 32;
    expect(b, "buffers[0].compressed_cache.layout.block_size = 32 must be 64");
  }
  SECTION("a wrong stride") {
    auto b = full_binding(c, as);
    b[0].q = graphs::strided_view<__nv_bfloat16, 3>(b[0].q.data_handle(), {64, 64, 512}, {64 * 512 + 4, 512, 1});
    expect(b, "buffers[0].q: extents [64, 64, 512], strides [32772, 512, 1]: token stride 32772 must be a multiple of 8");
    b = full_binding(c, as);
    b[0].q = graphs::strided_view<__nv_bfloat16, 3>(b[0].q.data_handle(), {64, 64, 512}, {64 * 512, 520, 1});
    expect(b, "stride 1 = 520 must be 512 (contiguous within a row)");
    b = full_binding(c, as);
    b[1].out = graphs::strided_view<__nv_bfloat16, 3>(b[1].out.data_handle(), {64, 128, 512}, {128 * 512 - 8, 512, 1});
    expect(b, "token stride 65528 must be a multiple of 8 elements (16 bytes) of at least 65536");
    b = full_binding(c, as);
    b[1].lse = graphs::strided_view<float, 2>(b[1].lse.data_handle(), {64, 128}, {256, 1});
    expect(b, "buffers[1].lse: extents [64, 128], strides [256, 1]: row stride 256 must be 128 (contiguous)");
    b = full_binding(c, as);
    b[1].swa_cache.layout.block_stride = 37440 + 16;
    expect(b, "buffers[1].swa_cache.layout.block_stride = 37456 must be a multiple of 576 of at least 37440");
    b = full_binding(c, as);
    b[1].swa_cache.layout.block_stride = 37440 - 576;
    expect(b, "buffers[1].swa_cache.layout.block_stride = 36864 must be a multiple of 576 of at least 37440");
  }
  SECTION("a buffer the layer does not use") {
    auto b = full_binding(c, as);
    b[1].topk_indices = b[0].topk_indices;  // layer 1 is SWA-only
    expect(b, "buffers[1].topk_indices is bound but layer 1 (SWA h128) does not use it");
    b = full_binding(c, as);
    b[1].attn_sink = graphs::contiguous_view<float, 1>(as.take<float>(512), {128});  // layer 1 has no sink
    expect(b, "buffers[1].attn_sink is bound but layer 1");
    b = full_binding(c, as);
    expect(b, "buffers[0].k_rows is bound but layer 0 (C4A top_k 512 h64) does not use it (the executor records no insert stage)",
           {{0, 1}}, false);
  }
  SECTION("a span that would wrap") {
    // Found by tests/fuzz/fuzz_executor_plan: a block stride (or extents times strides) large
    // enough that the 64-bit size wrapped to a small one passed, and escaped the overlap checks.
    auto b = full_binding(c, as);
    b[1].swa_cache.layout.block_stride = std::int64_t{576} << 41;
    expect(b, "buffers[1].swa_cache spans more than 2^48 B from");
    expect(b, "a bound buffer must span at most 2^48 bytes and not wrap the address space");
    b = full_binding(c, as);
    b[0].out = graphs::contiguous_view<__nv_bfloat16, 3>(b[0].out.data_handle(), {std::size_t{1} << 40, 64, 512});
    expect(b, "buffers[0].out spans more than 2^48 B");
    b = full_binding(c, as);
    b[0].lse = graphs::contiguous_view<float, 2>(reinterpret_cast<float*>(UINTPTR_MAX - 4095), {64, 64});
    expect(b, "buffers[0].lse spans 16384 B from");
  }
  SECTION("hazardous overlap") {
    auto b = full_binding(c, as);
    // out over q of the same layer: the attention writes what it reads.
    b[1].out = graphs::contiguous_view<__nv_bfloat16, 3>(b[1].q.data_handle(), {64, 128, 512});
    expect(b, "buffers[1].q [");
    expect(b, "overlaps buffers[1].out [");
    expect(b, "a buffer a step writes must not share memory with another buffer of a layer the same program runs");
    // Two layers' caches.
    b = full_binding(c, as);
    b[1].swa_cache.data = b[0].swa_cache.data + 576;
    expect(b, "overlaps buffers[1].swa_cache");
    expect(b, "a cache must not share memory with any other buffer");
    // A cache over another layer's q, even in different programs.
    b = full_binding(c, as);
    b[1].swa_cache.data = reinterpret_cast<std::uint8_t*>(b[0].q.data_handle());
    expect(b, "a cache must not share memory with any other buffer", {{0}, {1}});
  }
}

TEST_CASE("overlaps that are no hazard are accepted", "[bindings]") {
  AddressSpace as;
  const auto c = test::two_layer_config(128);
  auto b = full_binding(c, as);
  // Inputs may alias: one K row buffer for both layers.
  b[1].k_rows = b[0].k_rows;
  CHECK(refusal(c, b) == "accepted");
  // Outputs of layers that never run in the same step (one program each) may share memory.
  b = full_binding(c, as);
  b[1].lse = graphs::contiguous_view<float, 2>(b[0].lse.data_handle(), {64, 128});
  CHECK(refusal(c, b, {{0}, {1}}) == "accepted");
  CHECK(refusal(c, b, {{0, 1}}).find("overlaps") != std::string::npos);
}

TEST_CASE("the executor refuses a bad binding before any CUDA call", "[bindings]") {
  AddressSpace as;
  const auto c = test::two_layer_config(128);
  graphs::ExecutorOptions o;
  o.buffers = full_binding(c, as);
  o.buffers[1].max_logits = graphs::contiguous_view<float, 2>(o.buffers[1].max_logits.data_handle(), {64, 127});
  // On a machine without a GPU, any CUDA call before this check would fail first with a CudaError.
  try {
    graphs::Executor ex(c, o);
    FAIL("the executor accepted a max_logits of 127 heads for a 128-head layer");
  } catch (const CudaError& e) {
    FAIL("a CUDA call came before the binding was checked: " << e.what());
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("buffers[1].max_logits: extents [64, 127], strides [127, 1]: extent 1 = 127 must be 128") !=
          std::string::npos);
  }
}

TEST_CASE("Executor::check_options makes the constructor's host-only checks, in its order, without a device",
          "[bindings][executor]") {
  AddressSpace as;
  auto c = test::two_layer_config(128);
  graphs::ExecutorOptions o;
  o.buffers = full_binding(c, as);
  CHECK_NOTHROW(graphs::Executor::check_options(c, o));
  auto message = [&](const model::PipelineConfig& config, const graphs::ExecutorOptions& options) -> std::string {
    try {
      graphs::Executor::check_options(config, options);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "accepted";
  };
  // The config first, then the buckets, then the programs, then the bindings.
  auto bad = c;
  bad.max_requests = 0;
  o.t_buckets = {8, 7};
  o.programs = {{2}};
  o.buffers[1].max_logits = graphs::contiguous_view<float, 2>(o.buffers[1].max_logits.data_handle(), {64, 127});
  CHECK(message(bad, o).find("max_requests = 0") != std::string::npos);
  CHECK(message(c, o).find("t_buckets") != std::string::npos);
  o.t_buckets = {};
  CHECK(message(c, o).find("programs[0] names layer 2") != std::string::npos);
  o.programs = {};
  CHECK(message(c, o).find("buffers[1].max_logits") != std::string::npos);
}

TEST_CASE("the pool plans only what is not bound", "[bindings][pool]") {
  AddressSpace as;
  const auto c = test::two_layer_config(128);
  const memory::PoolPlan all = graphs::plan_pipeline_pool(c);
  auto b = std::vector<LayerBuffers>(2);
  b[0].swa_cache = full_binding(c, as)[0].swa_cache;
  b[1].out = full_binding(c, as)[1].out;
  const memory::PoolPlan some = graphs::plan_pipeline_pool(c, b);
  CHECK(some.find("layer0.swa_cache") == nullptr);
  CHECK(some.find("layer1.out") == nullptr);
  CHECK(some.find("layer1.swa_cache") != nullptr);
  CHECK(some.find("layer0.out") != nullptr);
  CHECK(all.device_bytes() - some.device_bytes() >= b[0].swa_cache.bytes() + graphs::span_bytes(b[1].out) - 2 * 4096);
  // Everything bound: the pool holds only spgraph's own slots.
  const memory::PoolPlan own = graphs::plan_pipeline_pool(c, full_binding(c, as));
  for (const auto& s : own.slots()) {
    INFO(s.spec.name);
    CHECK(s.spec.name.rfind("layer", 0) != 0);
  }
  // No insert stage: no K rows planned.
  const memory::PoolPlan no_insert = graphs::plan_pipeline_pool(c, std::vector<LayerBuffers>{}, false);
  CHECK(no_insert.find("layer0.k_rows") == nullptr);
  CHECK(no_insert.find("layer0.compressed_k_rows") == nullptr);
  CHECK(no_insert.find("layer0.q") != nullptr);
}
