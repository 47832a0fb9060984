// Engine-owned buffers: an executor over the caller's caches and tensors (separate allocations,
// padded token strides, caches at offsets inside a larger allocation and with padded blocks)
// gives outputs and cache bytes bit-identical to the pooled executor, eager and replayed, for
// every bucket, and writes nothing outside the buffers' spans; steps on alternating caller
// streams match eager results with no host sync per step; refusals that need the device
// (residency, allocation size) allocate nothing.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "executor_test_util.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/memory/allocation_counter.hpp"

using namespace spg;
using spg::test::ChunkData;
using spg::test::LayerOutputs;
using spg::test::World;

namespace {

constexpr std::uint8_t kGuard = 0xA5;
constexpr std::size_t kBand = 4096;  // guard bytes before and after every caller buffer

/// One caller allocation: a guard band, the buffer's span, a guard band; every byte starts as kGuard.
struct GuardedAllocation {
  core::DeviceBuffer memory;
  std::size_t span{0};
  explicit GuardedAllocation(std::size_t bytes) : memory(bytes + 2 * kBand), span(bytes) {
    SPG_CUDA_TRY(cudaMemset(memory.data(), kGuard, memory.size()));
  }
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(static_cast<std::uint8_t*>(memory.data()) + kBand);
  }
};

/// The caller's buffers for every layer: each tensor its own cudaMalloc, q and out with padded
/// token strides, all caches in one allocation at non-zero offsets, the first SWA cache with a
/// block stride one 576-byte row longer than needed.
class CallerBuffers {
 public:
  CallerBuffers(const model::PipelineConfig& c, bool insert) {
    const auto T = static_cast<std::size_t>(c.max_tokens);
    std::vector<kernels::CacheLayout> caches;
    std::size_t cache_bytes = 0;
    for (std::size_t i = 0; i < c.layers.size(); ++i) {
      for (const graphs::LayerBuffer cb : {graphs::LayerBuffer::swa_cache, graphs::LayerBuffer::compressed_cache}) {
        if (!graphs::layer_uses(c.layers[i], cb, insert)) continue;
        kernels::CacheLayout l = graphs::required_cache(c, c.layers[i], cb);
        if (i == 0 && cb == graphs::LayerBuffer::swa_cache) l.block_stride += 576;
        caches.push_back(l);
        cache_bytes += 4096 + l.bytes();
      }
    }
    cache_memory_ = std::make_unique<GuardedAllocation>(cache_bytes + 4096);
    std::size_t cache_at = 4096 + 576;  // a non-zero, non-4096 offset (16-byte aligned)
    std::size_t next_cache = 0;
    for (std::size_t i = 0; i < c.layers.size(); ++i) {
      const model::LayerConfig& l = c.layers[i];
      graphs::LayerBuffers b;
      const auto h = static_cast<std::size_t>(l.h_q);
      const std::size_t q_stride = h * 512 + 64;
      const std::size_t out_stride = h * 512 + 136;
      b.q = graphs::strided_view<__nv_bfloat16, 3>(take<__nv_bfloat16>((T - 1) * q_stride + h * 512), {T, h, 512},
                                                   {q_stride, 512, 1});
      if (l.compress_ratio > 1) {
        const auto k = static_cast<std::size_t>(l.top_k);
        b.topk_indices = graphs::contiguous_view<std::int32_t, 2>(take<std::int32_t>(T * k), {T, k});
      }
      for (const graphs::LayerBuffer kb : {graphs::LayerBuffer::k_rows, graphs::LayerBuffer::compressed_k_rows}) {
        if (!graphs::layer_uses(l, kb, insert)) continue;
        const std::size_t rows = graphs::required_rows(c, l, kb);
        (kb == graphs::LayerBuffer::k_rows ? b.k_rows : b.compressed_k_rows) =
            graphs::contiguous_view<__nv_bfloat16, 2>(take<__nv_bfloat16>(rows * 512), {rows, 512});
      }
      for (const graphs::LayerBuffer cb : {graphs::LayerBuffer::swa_cache, graphs::LayerBuffer::compressed_cache}) {
        if (!graphs::layer_uses(l, cb, insert)) continue;
        graphs::PagedCache& pc = cb == graphs::LayerBuffer::swa_cache ? b.swa_cache : b.compressed_cache;
        pc.layout = caches[next_cache++];
        pc.data = cache_memory_->data<std::uint8_t>() + cache_at;
        cache_at += pc.bytes() + 4096;
      }
      if (l.attn_sink) b.attn_sink = graphs::contiguous_view<float, 1>(take<float>(h), {h});
      b.out = graphs::strided_view<__nv_bfloat16, 3>(take<__nv_bfloat16>((T - 1) * out_stride + h * 512), {T, h, 512},
                                                     {out_stride, 512, 1});
      b.lse = graphs::contiguous_view<float, 2>(take<float>(T * h), {T, h});
      b.max_logits = graphs::contiguous_view<float, 2>(take<float>(T * h), {T, h});
      bindings_.push_back(b);
    }
  }

  [[nodiscard]] const std::vector<graphs::LayerBuffers>& bindings() const noexcept { return bindings_; }

  /// Counts the bytes that differ from kGuard outside every bound span, and inside the padding
  /// between tokens of q and out (nothing may write there).
  std::size_t guard_bytes_written() const {
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> spans;  // [begin, end) that may change
    auto add_rows = [&](const auto& v, std::size_t row_bytes) {
      const auto base = reinterpret_cast<std::uintptr_t>(v.data_handle());
      for (std::size_t t = 0; t < v.extent(0); ++t) {
        spans.emplace_back(base + t * v.stride(0) * 2, base + t * v.stride(0) * 2 + row_bytes);
      }
    };
    auto add = [&](const void* p, std::size_t bytes) {
      if (p != nullptr) spans.emplace_back(reinterpret_cast<std::uintptr_t>(p), reinterpret_cast<std::uintptr_t>(p) + bytes);
    };
    for (const graphs::LayerBuffers& b : bindings_) {
      add_rows(b.q, b.q.extent(1) * 1024);
      add_rows(b.out, b.out.extent(1) * 1024);
      add(b.topk_indices.data_handle(), graphs::span_bytes(b.topk_indices));
      add(b.k_rows.data_handle(), graphs::span_bytes(b.k_rows));
      add(b.compressed_k_rows.data_handle(), graphs::span_bytes(b.compressed_k_rows));
      add(b.swa_cache.data, b.swa_cache.bytes());
      add(b.compressed_cache.data, b.compressed_cache.bytes());
      add(b.attn_sink.data_handle(), graphs::span_bytes(b.attn_sink));
      add(b.lse.data_handle(), graphs::span_bytes(b.lse));
      add(b.max_logits.data_handle(), graphs::span_bytes(b.max_logits));
    }
    std::size_t written = 0;
    std::vector<const GuardedAllocation*> all{cache_memory_.get()};
    for (const auto& a : owned_) all.push_back(a.get());
    for (const GuardedAllocation* a : all) {
      std::vector<std::uint8_t> host(a->memory.size());
      SPG_CUDA_TRY(cudaMemcpy(host.data(), a->memory.data(), host.size(), cudaMemcpyDeviceToHost));
      const auto base = reinterpret_cast<std::uintptr_t>(a->memory.data());
      std::vector<bool> inside(host.size(), false);
      for (const auto& [b, e] : spans) {
        if (b < base || b >= base + host.size()) continue;
        for (std::uintptr_t p = b; p < e; ++p) inside[p - base] = true;
      }
      for (std::size_t i = 0; i < host.size(); ++i) written += !inside[i] && host[i] != kGuard;
    }
    return written;
  }

 private:
  template <class T>
  T* take(std::size_t elems) {
    owned_.push_back(std::make_unique<GuardedAllocation>(elems * sizeof(T)));
    return owned_.back()->data<T>();
  }

  std::unique_ptr<GuardedAllocation> cache_memory_;
  std::vector<std::unique_ptr<GuardedAllocation>> owned_;
  std::vector<graphs::LayerBuffers> bindings_;
};

graphs::ExecutorOptions options(bool insert, const CallerBuffers* caller = nullptr) {
  graphs::ExecutorOptions o;
  o.insert = insert;
  if (caller != nullptr) o.buffers = caller->bindings();
  return o;
}

void require_ok(const graphs::RunResult& r) {
  INFO("run status: " << graphs::run_status_name(r.status) << ", cuda: " << cudaGetErrorName(r.cuda));
  REQUIRE(r.ok());
}

/// The bytes of a cache that hold rows (each block's data and scale rows, not its padding).
std::vector<std::uint8_t> cache_rows(const graphs::PagedCache& c) {
  const auto stride = static_cast<std::size_t>(c.layout.block_stride);
  const std::size_t used = static_cast<std::size_t>(c.layout.block_size) * (576 + 8);
  std::vector<std::uint8_t> all(c.bytes());
  SPG_CUDA_TRY(cudaMemcpy(all.data(), c.data, all.size(), cudaMemcpyDeviceToHost));
  std::vector<std::uint8_t> rows;
  for (int b = 0; b < c.layout.num_blocks; ++b) {
    rows.insert(rows.end(), all.begin() + static_cast<std::ptrdiff_t>(b * stride),
                all.begin() + static_cast<std::ptrdiff_t>(b * stride + used));
  }
  return rows;
}

void poison_outputs(const graphs::Executor& ex) {
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    const graphs::LayerBuffers& v = ex.layer(l);
    // out row by row, so the padding between tokens keeps its guard bytes.
    SPG_CUDA_TRY(cudaMemset2D(v.out.data_handle(), v.out.stride(0) * 2, 0xFF, v.out.extent(1) * 1024, v.out.extent(0)));
    test::poison(v.lse);
    test::poison(v.max_logits);
  }
  SPG_CUDA_TRY(cudaDeviceSynchronize());
}

std::vector<LayerOutputs> outputs(graphs::Executor& ex, int t_bucket) {
  std::vector<LayerOutputs> o;
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) o.push_back(test::read_outputs(ex, l, t_bucket));
  return o;
}

}  // namespace

TEST_CASE("an executor over caller-owned buffers equals the pooled executor bit for bit, every bucket, eager and replayed",
          "[gpu][executor][bindings]") {
  const model::PipelineConfig cfg = test::small_program();
  CallerBuffers caller(cfg, true);
  graphs::Executor pooled(cfg, options(true));
  graphs::Executor bound(cfg, options(true, &caller));
  pooled.warmup();
  bound.warmup();
  // The bound executor's pool holds none of the layers' buffers.
  for (const auto& s : bound.pool().plan().slots()) {
    INFO(s.spec.name);
    CHECK(s.spec.name.rfind("layer", 0) != 0);
  }
  CHECK(bound.pool().device_bytes() < pooled.pool().device_bytes());
  CHECK(bound.layer(1).q.data_handle() == caller.bindings()[1].q.data_handle());
  CHECK(bound.layer(2).q.stride(0) == 128 * 512 + 64);

  // Same seed: both worlds draw the same caches, q, sinks, K rows, chunks and top-k indices.
  World wp(pooled, 20261201);
  World wb(bound, 20261201);
  const auto& buckets = pooled.buckets();
  for (int bucket = 0; bucket < buckets.size(); ++bucket) {
    const int ti = bucket % static_cast<int>(buckets.t_buckets().size());
    const int lo = ti == 0 ? 1 : buckets.t_buckets()[static_cast<std::size_t>(ti) - 1] + 1;
    const int tokens = lo + static_cast<int>(wp.rng()() % static_cast<std::uint64_t>(buckets.t_of(bucket) - lo + 1));
    (void)wb.rng()();
    const int n = buckets.r_of(bucket);
    const ChunkData cp = wp.random_chunk(n, tokens);
    const ChunkData cb = wb.random_chunk(n, tokens);
    wp.randomize_topk(cp);
    wb.randomize_topk(cb);
    INFO("bucket R" << n << " T" << buckets.t_of(bucket) << ", " << tokens << " tokens");
    for (const bool graph : {false, true}) {
      INFO((graph ? "replayed" : "eager"));
      poison_outputs(pooled);
      poison_outputs(bound);
      const graphs::RunResult rp = graph ? pooled.run(cp.input()) : pooled.run_eager(cp.input());
      const graphs::RunResult rb = graph ? bound.run(cb.input()) : bound.run_eager(cb.input());
      require_ok(rp);
      require_ok(rb);
      REQUIRE(rp.bucket == bucket);
      REQUIRE(rb.bucket == bucket);
      const auto op = outputs(pooled, buckets.t_of(bucket));
      const auto ob = outputs(bound, buckets.t_of(bucket));
      for (std::size_t l = 0; l < op.size(); ++l) {
        INFO("layer " << l);
        CHECK(op[l] == ob[l]);
      }
      for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
        INFO("layer " << l << " caches");
        const bool swa_same = cache_rows(pooled.layer(l).swa_cache) == cache_rows(bound.layer(l).swa_cache);
        CHECK(swa_same);
        if (cfg.layers[l].compress_ratio > 1) {
          const bool comp_same =
              cache_rows(pooled.layer(l).compressed_cache) == cache_rows(bound.layer(l).compressed_cache);
          CHECK(comp_same);
        }
      }
    }
    CHECK(bound.read_status().total() == 0);
    wp.apply_insert(cp, pooled.program_layers(0));
    wb.apply_insert(cb, bound.program_layers(0));
    if (bucket == buckets.size() - 1) {
      for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
        test::check_against_reference(test::read_outputs(bound, l, buckets.t_of(bucket)),
                                      wb.reference(cb, l, n, buckets.t_of(bucket)), "bound, layer " + std::to_string(l));
      }
    }
  }
  bound.synchronize();
  CHECK(caller.guard_bytes_written() == 0);
}

TEST_CASE("steps alternating between two caller streams match eager results, with no host sync per step",
          "[gpu][executor][bindings]") {
  const model::PipelineConfig cfg = test::small_program();
  CallerBuffers caller(cfg, false);
  graphs::Executor ex(cfg, options(false, &caller));
  ex.warmup();
  World world(ex, 777);
  constexpr int kMinSeq = 1100;
  constexpr int kVariants = 4;
  // Per variant: a chunk, and its q and top-k rows kept aside in device memory; the caller copies
  // them into the bound buffers on the step's stream right before the step.
  struct Variant {
    ChunkData chunk;
    std::vector<core::DeviceBuffer> q;     // per layer, [T, h, 512] packed
    std::vector<core::DeviceBuffer> topk;  // per layer with r > 1, [T, top_k]
    std::vector<LayerOutputs> eager;
  };
  std::vector<Variant> variants(kVariants);
  const auto T = static_cast<std::size_t>(cfg.max_tokens);
  std::mt19937_64 rng(99);
  for (int v = 0; v < kVariants; ++v) {
    Variant& var = variants[static_cast<std::size_t>(v)];
    var.chunk = world.random_chunk(1 + v % 4, 9 + 13 * v, -1, kMinSeq);
    world.randomize_topk(var.chunk);
    for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
      const graphs::LayerBuffers& b = ex.layer(l);
      const std::size_t row = b.q.extent(1) * 512;
      std::vector<std::uint16_t> q(T * row);
      for (auto& x : q) x = test::random_bf16(rng, 1.0F);
      var.q.emplace_back(q.size() * 2);
      SPG_CUDA_TRY(cudaMemcpy(var.q.back().data(), q.data(), q.size() * 2, cudaMemcpyHostToDevice));
      if (graphs::bound(b.topk_indices)) {
        var.topk.emplace_back(graphs::span_bytes(b.topk_indices));
        SPG_CUDA_TRY(cudaMemcpy(var.topk.back().data(), b.topk_indices.data_handle(), var.topk.back().size(),
                                cudaMemcpyDeviceToDevice));
      } else {
        var.topk.emplace_back();
      }
    }
  }
  auto stage_inputs = [&](const Variant& var, cudaStream_t s) {
    for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
      const graphs::LayerBuffers& b = ex.layer(l);
      const std::size_t row = b.q.extent(1) * 1024;
      SPG_CUDA_TRY(cudaMemcpy2DAsync(b.q.data_handle(), b.q.stride(0) * 2, var.q[l].data(), row, row, T,
                                     cudaMemcpyDeviceToDevice, s));
      if (var.topk[l].size() > 0) {
        SPG_CUDA_TRY(cudaMemcpyAsync(b.topk_indices.data_handle(), var.topk[l].data(), var.topk[l].size(),
                                     cudaMemcpyDeviceToDevice, s));
      }
    }
  };
  // Eager baselines, one variant at a time with a sync between.
  for (Variant& var : variants) {
    stage_inputs(var, ex.stream());
    require_ok(ex.run_eager(var.chunk.input()));
    var.eager = outputs(ex, cfg.max_tokens);
  }
  // Replay: steps alternate between two caller streams. The caller orders its writes of q and
  // top-k after the previous step (which read them) with an event, and after its own writes in
  // stream order; the executor orders the steps among themselves.
  core::Stream streams[2];
  core::Event done[2] = {core::Event(false), core::Event(false)};
  constexpr int kSteps = 48;
  const std::size_t l0_rows = T * ex.layer(0).out.extent(1);
  core::DeviceBuffer aside(kSteps * l0_rows * 1024);
  std::vector<int> order;
  for (int i = 0; i < kSteps; ++i) order.push_back(static_cast<int>(rng() % kVariants));
  for (int i = 0; i < kSteps; ++i) {
    cudaStream_t s = streams[i & 1].get();
    if (i > 0) SPG_CUDA_TRY(cudaStreamWaitEvent(s, done[(i - 1) & 1].get(), 0));
    const Variant& var = variants[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
    stage_inputs(var, s);
    require_ok(ex.run(var.chunk.input(), 0, s));
    const graphs::LayerBuffers& b = ex.layer(0);
    SPG_CUDA_TRY(cudaMemcpy2DAsync(static_cast<std::uint8_t*>(aside.data()) + static_cast<std::size_t>(i) * l0_rows * 1024,
                                   b.out.extent(1) * 1024, b.out.data_handle(), b.out.stride(0) * 2, b.out.extent(1) * 1024,
                                   T, cudaMemcpyDeviceToDevice, s));
    done[i & 1].record(s);
  }
  ex.synchronize();
  for (auto& s : streams) s.synchronize();
  std::vector<std::uint16_t> got(kSteps * l0_rows * 512);
  SPG_CUDA_TRY(cudaMemcpy(got.data(), aside.data(), got.size() * 2, cudaMemcpyDeviceToHost));
  int mismatches = 0;
  int first = -1;
  for (int i = 0; i < kSteps; ++i) {
    const Variant& var = variants[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
    // Rows past the chunk's bucket belong to other steps: compare the bucket's rows only.
    const int bucket = ex.buckets().lookup(static_cast<int>(var.chunk.requests.size()), var.chunk.tokens());
    const std::size_t elems = static_cast<std::size_t>(ex.buckets().t_of(bucket)) * ex.layer(0).out.extent(1) * 512;
    if (std::memcmp(var.eager[0].out.data(), got.data() + static_cast<std::size_t>(i) * l0_rows * 512, elems * 2) != 0) {
      ++mismatches;
      if (first < 0) first = i;
    }
  }
  INFO("first mismatching step " << first);
  CHECK(mismatches == 0);
  CHECK(ex.read_status().total() == 0);
}

TEST_CASE("bindings the device refuses (host memory, a too-small allocation) allocate nothing", "[gpu][executor][bindings]") {
  const model::PipelineConfig cfg = test::small_program();
  auto& counter = memory::AllocationCounter::instance();
  std::vector<float> host(4096);
  core::DeviceBuffer small(4096);
  auto refuse = [&](graphs::ExecutorOptions o, const std::string& part) {
    counter.reset();
    try {
      graphs::Executor ex(cfg, o);
      FAIL("the binding was accepted");
    } catch (const InvalidArgument& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
    CHECK(counter.count() == 0);
  };
  graphs::ExecutorOptions o;
  o.buffers.resize(cfg.layers.size());
  o.buffers[0].attn_sink = graphs::contiguous_view<float, 1>(host.data() + (16 - reinterpret_cast<std::uintptr_t>(host.data()) % 16) / 4, {64});
  refuse(o, "buffers[0].attn_sink: byte 0 of its 256 B");
  o.buffers[0].attn_sink = {};
  // [64, 128, 512] bf16 = 8 MiB claimed over a 4 KiB allocation.
  o.buffers[2].q = graphs::contiguous_view<__nv_bfloat16, 3>(static_cast<__nv_bfloat16*>(small.data()), {64, 128, 512});
  refuse(o, "buffers[2].q");
}
