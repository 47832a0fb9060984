// Fuzzes the executor's host side without a GPU: a random config and options (bucket lists,
// programs, bindings at made-up addresses, never dereferenced) through plan_executor, then what
// the constructor and warm-up do on the host: the views over the pool (host-backed when small
// enough), the chunk encoder and warm-up's empty chunk. Properties:
//  - a refusal is an InvalidArgument (never another exception, a crash or a hang);
//  - an accepted plan is consistent: buckets end at the maxima and every chunk size maps to the
//    smallest bucket that holds it; the pool's slots are aligned and disjoint inside its size;
//    every view the executor would hand out lies inside its slot or its binding; bound ranges do
//    not wrap the address space and no cache overlaps another bound buffer; the empty chunk is
//    accepted for every program (warm-up needs it) and its metadata block stays within the layout.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_check.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/memory/buffer_pool.hpp"

using namespace spg;

namespace {

__extension__ typedef unsigned __int128 WideSize;

int some_int(FuzzedDataProvider& in, int typical_lo, int typical_hi) {
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0: return in.ConsumeIntegral<int>();  // anything, INT_MIN and INT_MAX included
    case 1: return 0;
    default: return in.ConsumeIntegralInRange(typical_lo, typical_hi);
  }
}

model::LayerConfig make_layer(FuzzedDataProvider& in, int window) {
  model::LayerConfig l;
  l.h_q = in.ConsumeBool() ? 64 : (in.ConsumeBool() ? 128 : some_int(in, 1, 256));
  l.d_qk = in.ConsumeIntegralInRange(0, 15) == 0 ? 576 : 512;
  l.window = in.ConsumeIntegralInRange(0, 15) == 0 ? some_int(in, 1, 5000) : window;
  const int r = in.ConsumeIntegralInRange(0, 3);
  l.compress_ratio = r == 0 ? 1 : (r == 1 ? 4 : (r == 2 ? 128 : some_int(in, 1, 256)));
  l.top_k = l.compress_ratio == 1 ? 0 : (l.compress_ratio == 4 ? 512 : 64 * in.ConsumeIntegralInRange(1, 4));
  if (in.ConsumeIntegralInRange(0, 15) == 0) l.top_k = some_int(in, 0, 9000);
  l.attn_sink = in.ConsumeBool();
  return l;
}

/// A view at a made-up address: usually what the config asks for, sometimes not.
template <class T, std::size_t Rank>
graphs::DeviceView<T, Rank> fake_view(FuzzedDataProvider& in, std::uintptr_t& next, std::array<std::size_t, Rank> extents) {
  std::array<std::size_t, Rank> strides{};
  std::size_t s = 1;
  for (std::size_t i = Rank; i-- > 0;) {
    strides[i] = s;
    s *= extents[i];
  }
  if (in.ConsumeIntegralInRange(0, 7) == 0) extents[0] = in.ConsumeIntegral<std::uint32_t>();
  if (in.ConsumeIntegralInRange(0, 7) == 0) strides[0] = in.ConsumeIntegral<std::uint64_t>() >> in.ConsumeIntegralInRange(0, 63);
  std::uintptr_t at = next;
  if (in.ConsumeIntegralInRange(0, 15) == 0) at = in.ConsumeIntegral<std::uintptr_t>() & ~std::uintptr_t{15};
  next += (std::uintptr_t{1} << 32);
  return graphs::strided_view<T, Rank>(reinterpret_cast<T*>(at), extents, strides);
}

std::vector<graphs::LayerBuffers> make_bindings(FuzzedDataProvider& in, const model::PipelineConfig& c, bool insert) {
  std::vector<graphs::LayerBuffers> out;
  if (in.ConsumeBool()) return out;
  std::uintptr_t next = std::uintptr_t{1} << 44;
  const auto T = static_cast<std::size_t>(std::clamp(c.max_tokens, 0, 1 << 20));
  for (const model::LayerConfig& l : c.layers) {
    graphs::LayerBuffers b;
    const auto h = static_cast<std::size_t>(std::clamp(l.h_q, 0, 1024));
    const auto d = static_cast<std::size_t>(std::clamp(l.d_qk, 0, 1024));
    if (in.ConsumeBool()) b.q = fake_view<__nv_bfloat16, 3>(in, next, {T, h, d});
    if (in.ConsumeBool()) b.out = fake_view<__nv_bfloat16, 3>(in, next, {T, h, 512});
    if (in.ConsumeBool()) b.lse = fake_view<float, 2>(in, next, {T, h});
    if (in.ConsumeBool() && l.compress_ratio > 1) {
      b.topk_indices = fake_view<std::int32_t, 2>(in, next, {T, static_cast<std::size_t>(std::clamp(l.top_k, 0, 1 << 16))});
    }
    if (in.ConsumeBool() && insert) b.k_rows = fake_view<__nv_bfloat16, 2>(in, next, {T, 512});
    if (in.ConsumeBool()) {
      b.swa_cache.layout.block_size = c.cache.swa_block_size;
      b.swa_cache.layout.num_blocks = c.cache.swa_blocks;
      b.swa_cache.layout.block_stride = kernels::CacheLayout::min_block_stride(std::clamp(c.cache.swa_block_size, 0, 1 << 20));
      if (in.ConsumeIntegralInRange(0, 7) == 0) b.swa_cache.layout.block_stride = in.ConsumeIntegral<std::int64_t>();
      b.swa_cache.data = reinterpret_cast<std::uint8_t*>(in.ConsumeIntegralInRange(0, 15) == 0 ? next - 4096 : next);
      next += std::uintptr_t{1} << 40;
    }
    out.push_back(b);
  }
  if (in.ConsumeIntegralInRange(0, 15) == 0 && !out.empty()) out.pop_back();  // one entry short
  return out;
}

void check_plan(const graphs::ExecutorPlan& plan, const graphs::ExecutorOptions& options) {
  const model::PipelineConfig& c = plan.config;
  const graphs::BucketSet& b = plan.buckets;
  SPG_FUZZ_CHECK(b.r_buckets().back() == c.max_requests && b.t_buckets().back() == c.max_tokens, "bucket maxima");
  for (int r = 0; r <= c.max_requests; ++r) {
    for (int t = 0; t <= c.max_tokens; t += 1 + c.max_tokens / 97) {
      const int k = b.lookup(r, t);
      SPG_FUZZ_CHECK(k >= 0 && k < b.size() && b.r_of(k) >= r && b.t_of(k) >= t, "lookup(%d, %d) = %d", r, t, k);
    }
  }
  SPG_FUZZ_CHECK(b.lookup(c.max_requests + 1, 0) == -1 && b.lookup(0, c.max_tokens + 1) == -1, "lookup past the maxima");
  SPG_FUZZ_CHECK(plan.programs.size() == plan.program_ratios.size() && !plan.programs.empty(), "programs");
  // Slots: aligned, disjoint within their kind, inside the kind's size.
  const auto& slots = plan.pool.slots();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const memory::Slot& s = slots[i];
    SPG_FUZZ_CHECK(s.offset % s.spec.alignment == 0, "slot %s misaligned", s.spec.name.c_str());
    SPG_FUZZ_CHECK(s.offset + s.spec.bytes <= plan.pool.bytes(s.spec.kind) && s.offset + s.spec.bytes > s.offset,
                   "slot %s past its pool", s.spec.name.c_str());
    for (std::size_t j = i + 1; j < slots.size(); ++j) {
      const memory::Slot& o = slots[j];
      if (o.spec.kind != s.spec.kind) continue;
      SPG_FUZZ_CHECK(s.offset + s.spec.bytes <= o.offset || o.offset + o.spec.bytes <= s.offset, "slots %s and %s overlap",
                     s.spec.name.c_str(), o.spec.name.c_str());
    }
  }
  // Bound ranges neither wrap nor let a cache share memory with another bound buffer.
  struct Bound {
    std::uintptr_t begin, end;
    bool cache;
  };
  std::vector<Bound> bound;
  for (const graphs::LayerBuffers& lb : options.buffers) {
    auto add = [&](const auto& v) {
      if (!graphs::bound(v)) return;
      const auto begin = reinterpret_cast<std::uintptr_t>(v.data_handle());
      // The exact span, in 128 bits: what the binding checks computed must not have wrapped.
      WideSize span = 1;
      for (std::size_t i = 0; i < v.rank(); ++i) {
        span += static_cast<WideSize>(v.extent(i) - 1) * v.stride(i);
      }
      span *= sizeof(typename std::remove_cvref_t<decltype(v)>::element_type);
      const std::size_t bytes = graphs::span_bytes(v);
      SPG_FUZZ_CHECK(span == bytes, "a bound view's span wrapped: %zu B computed", bytes);
      SPG_FUZZ_CHECK(span + begin <= (static_cast<WideSize>(1) << 64), "a bound view of %zu B at %#zx wraps", bytes,
                     static_cast<std::size_t>(begin));
      bound.push_back({begin, begin + bytes, false});
    };
    add(lb.q);
    add(lb.out);
    add(lb.lse);
    add(lb.topk_indices);
    add(lb.k_rows);
    if (graphs::bound(lb.swa_cache)) {
      const auto begin = reinterpret_cast<std::uintptr_t>(lb.swa_cache.data);
      const std::size_t bytes = lb.swa_cache.bytes();
      const WideSize exact =
          static_cast<WideSize>(lb.swa_cache.layout.num_blocks) * static_cast<std::uint64_t>(lb.swa_cache.layout.block_stride);
      SPG_FUZZ_CHECK(exact == bytes, "a bound cache's size wrapped: %zu B computed", bytes);
      SPG_FUZZ_CHECK(exact + begin <= (static_cast<WideSize>(1) << 64), "a bound cache wraps");
      bound.push_back({begin, begin + bytes, true});
    }
  }
  for (std::size_t i = 0; i < bound.size(); ++i) {
    for (std::size_t j = i + 1; j < bound.size(); ++j) {
      const bool overlap = bound[i].begin < bound[j].end && bound[j].begin < bound[i].end;
      SPG_FUZZ_CHECK(!(overlap && (bound[i].cache || bound[j].cache)), "a bound cache overlaps another bound buffer");
    }
  }
  SPG_FUZZ_CHECK(graphs::ChunkMetaLayout::make(c).bytes() <= (std::size_t{17} << 20), "metadata block of %zu B",
                 graphs::ChunkMetaLayout::make(c).bytes());
}

/// What the constructor and warm-up do on the host, over a host-backed pool.
void warm_up_on_host(const graphs::ExecutorPlan& plan, const graphs::ExecutorOptions& options) {
  const model::PipelineConfig& c = plan.config;
  graphs::ChunkEncoder enc(c, options.insert);
  std::vector<std::int32_t> words(static_cast<std::size_t>(enc.layout().words));
  for (const int mask : plan.program_ratios) {
    const graphs::ChunkCheck ck = enc.check(graphs::ChunkInput{}, mask);
    SPG_FUZZ_CHECK(ck.status == graphs::RunStatus::ok, "warm-up's empty chunk refused for ratios %d", mask);
    enc.write(graphs::ChunkInput{}, ck, mask, words.data());
  }
  // The pool itself only when it is small (a planned pool may hold many GiB).
  if (plan.pool.device_bytes() + plan.pool.pinned_bytes() > (std::size_t{64} << 20)) return;
  const memory::BufferPool pool(plan.pool, 0, memory::PoolBacking::host_memory);
  const graphs::ExecutorViews views = graphs::executor_views(c, options, pool);
  SPG_FUZZ_CHECK(views.layers.size() == c.layers.size(), "views of %zu layers", views.layers.size());
  const auto* base = pool.device_base();
  const std::size_t size = pool.device_bytes();
  auto inside = [&](const void* p, std::size_t bytes) {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= base && b + bytes <= base + size;
  };
  for (std::size_t i = 0; i < c.layers.size(); ++i) {
    const graphs::LayerBuffers& v = views.layers[i];
    const bool q_bound = !options.buffers.empty() && graphs::bound(options.buffers[i].q);
    SPG_FUZZ_CHECK(graphs::bound(v.q), "layer %zu has no q", i);
    if (!q_bound) SPG_FUZZ_CHECK(inside(v.q.data_handle(), graphs::span_bytes(v.q)), "layer %zu q outside the pool", i);
    SPG_FUZZ_CHECK(v.q.extent(0) >= static_cast<std::size_t>(c.max_tokens), "layer %zu q rows", i);
    const bool cache_bound = !options.buffers.empty() && graphs::bound(options.buffers[i].swa_cache);
    if (!cache_bound) SPG_FUZZ_CHECK(inside(v.swa_cache.data, v.swa_cache.bytes()), "layer %zu swa cache outside the pool", i);
  }
  SPG_FUZZ_CHECK(inside(views.workspace.kv.data_handle(), views.workspace.kv.size() * 2), "kv workspace outside the pool");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  model::PipelineConfig c;
  c.max_requests = some_int(in, 1, 8);
  c.max_tokens = some_int(in, 1, 300);
  c.max_model_len = some_int(in, 1, 5000);
  const int window = some_int(in, 1, 300);
  const int layers = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < layers; ++i) c.layers.push_back(make_layer(in, window));
  c.cache.swa_block_size = some_int(in, 1, 128);
  c.cache.block_tokens = in.ConsumeBool() ? 256 : some_int(in, 1, 1024);
  c.cache.swa_blocks = some_int(in, 1, 500);
  c.cache.compressed_blocks = some_int(in, 1, 500);

  graphs::ExecutorOptions o;
  o.insert = in.ConsumeBool();
  const int lists = in.ConsumeIntegralInRange(0, 3);
  if (lists & 1) {
    for (int i = in.ConsumeIntegralInRange(0, 5); i > 0; --i) o.r_buckets.push_back(some_int(in, 1, 8));
  }
  if (lists & 2) {
    for (int i = in.ConsumeIntegralInRange(0, 8); i > 0; --i) o.t_buckets.push_back(some_int(in, 1, 300));
  }
  for (int p = in.ConsumeIntegralInRange(0, 3); p > 0; --p) {
    std::vector<int> program;
    for (int i = in.ConsumeIntegralInRange(0, 4); i > 0; --i) program.push_back(some_int(in, 0, layers));
    o.programs.push_back(program);
  }
  o.buffers = make_bindings(in, c, o.insert);

  graphs::ExecutorPlan plan{model::PipelineConfig{}, graphs::BucketSet::make_default(1, 1), {}, {}, {}};
  try {
    plan = graphs::plan_executor(c, o);
  } catch (const InvalidArgument&) {
    return 0;  // refused, with a message: the only refusal there is
  }
  check_plan(plan, o);
  warm_up_on_host(plan, o);
  return 0;
}
