// See probes.hpp.
#include "samples/bench/probes.hpp"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spgraph/core/device_info.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/graph.hpp"
#include "spgraph/kernels/spin/spin.hpp"
#include "spgraph/memory/allocation_counter.hpp"

namespace spg::bench {

namespace {

__global__ void empty_kernel(int* sink) {
  if (sink != nullptr && threadIdx.x == 1024) *sink = 0;  // never true: keeps the launch real
}

/// Pulls `words` int32 from pinned host memory (mapped) into device memory.
__global__ void pull_kernel(const std::int32_t* __restrict__ host, std::int32_t* __restrict__ device, int words) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < words;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    device[i] = host[i];
  }
}

__global__ void __launch_bounds__(512) copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                                   std::size_t n) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {  // four loads in flight per thread
    const uint4 a = src[i];
    const uint4 b = src[i + stride];
    const uint4 c = src[i + 2 * stride];
    const uint4 d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__global__ void set_switch_kernel(cudaGraphConditionalHandle handle, const int* value) {
  cudaGraphSetConditional(handle, static_cast<unsigned>(*value));
}

// ---- the property probe: one property of the real step graphs at a time ----

/// A by-value parameter block as large as the attention's (a few hundred bytes to 2 KiB).
struct LargeParams {
  int words[512];
};

__global__ void tensor_map_kernel(int* sink, const __grid_constant__ CUtensorMap map) {
  if (sink != nullptr && threadIdx.x == 1024) *sink = static_cast<int>(reinterpret_cast<const char*>(&map)[0]);
}

__global__ void large_params_kernel(int* sink, const LargeParams p) {
  if (sink != nullptr && threadIdx.x == 1024) *sink = p.words[threadIdx.x % 512];
}

/// A kernel that asks for dynamic shared memory (the attention kernels take ~210 KiB of it, 1 CTA an
/// SM), launched with as much as the probe gives it.
__global__ void dyn_smem_kernel(int* sink) {
  extern __shared__ int dyn_words[];
  if (sink != nullptr && threadIdx.x == 1024) *sink = dyn_words[0];
}

/// Distinct kernels: one function per N (the real graphs launch ~6 distinct kernels per layer).
template <int N>
__global__ void distinct_kernel(int* sink) {
  if (sink != nullptr && threadIdx.x == 1024) *sink = N;
}

template <int... N>
cudaError_t launch_distinct(int k, cudaStream_t stream, std::integer_sequence<int, N...>) {
  using Fn = void (*)(int*);
  static constexpr Fn fns[] = {&distinct_kernel<N>...};
  void* args[] = {nullptr};
  int* sink = nullptr;
  args[0] = &sink;
  return cudaLaunchKernel(reinterpret_cast<const void*>(fns[k % static_cast<int>(sizeof...(N))]), dim3(1), dim3(32),
                          args, 0, stream);
}

/// Tail-launches `exec` and writes the device-side launch's status to *status.
__global__ void tail_launch_checked_kernel(cudaGraphExec_t exec, int* status) {
  *status = static_cast<int>(cudaGraphLaunch(exec, cudaStreamGraphTailLaunch));
}

/// A graph of `kernels` empty kernels captured on `stream`.
graphs::Graph capture_empty_kernels(cudaStream_t stream, int kernels) {
  graphs::CaptureGuard guard(stream);
  for (int k = 0; k < kernels; ++k) empty_kernel<<<1, 32, 0, stream>>>(nullptr);
  SPG_CUDA_TRY(cudaGetLastError());
  return guard.finish();
}

/// [selector] -> SWITCH over `bodies` bodies of `kernels` empty kernels each (body 0 runs): a
/// conditional node as large as the step graph's.
graphs::Graph build_large_switch(cudaStream_t stream, const int* value, int bodies, int kernels) {
  cudaGraph_t raw = nullptr;
  SPG_CUDA_TRY(cudaGraphCreate(&raw, 0));
  graphs::Graph g(raw);
  cudaGraphConditionalHandle handle{};
  SPG_CUDA_TRY(cudaGraphConditionalHandleCreate(&handle, raw, 0, 0));
  void* args[] = {&handle, &value};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(&set_switch_kernel);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  kp.kernelParams = args;
  cudaGraphNode_t selector = nullptr;
  SPG_CUDA_TRY(cudaGraphAddKernelNode(&selector, raw, nullptr, 0, &kp));
  cudaGraphNodeParams cp{};
  cp.type = cudaGraphNodeTypeConditional;
  cp.conditional.handle = handle;
  cp.conditional.type = cudaGraphCondTypeSwitch;
  cp.conditional.size = static_cast<unsigned>(bodies);
  cudaGraphNode_t sw = nullptr;
  SPG_CUDA_TRY(cudaGraphAddNode(&sw, raw, &selector, nullptr, 1, &cp));
  for (int b = 0; b < bodies; ++b) {
    SPG_CUDA_TRY(cudaStreamBeginCaptureToGraph(stream, cp.conditional.phGraph_out[b], nullptr, nullptr, 0,
                                               cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < kernels; ++k) empty_kernel<<<1, 32, 0, stream>>>(nullptr);
    cudaGraph_t body = nullptr;
    SPG_CUDA_TRY(cudaStreamEndCapture(stream, &body));
  }
  return g;
}

/// Median host time of cudaGraphLaunch(exec) on an idle device, 200 launches after 20.
double median_launch_us(const graphs::GraphExec& exec, cudaStream_t stream) {
  std::vector<double> us;
  for (int i = 0; i < 220; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(exec.launch(stream));
    const auto t1 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
    if (i >= 20) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return median(us);
}

/// Host cost of the two ways to keep the host's launch independent of the graph's size: a
/// one-kernel graph that tail-launches a device graph of K kernels, and a graph of [selector
/// kernel -> switch node over `bodies` bodies of K kernels each] (CUDA 12.8+ conditional nodes).
void run_indirect_launch_probe(Reporter& rep, cudaStream_t stream) {
  core::DeviceBuffer value(4);
  core::DeviceBuffer status(sizeof(int));
  SPG_CUDA_TRY(cudaMemsetAsync(value.data(), 0, 4, stream));
  for (int kernels : {1, 40, 320}) {
    const graphs::GraphExec device_graph = graphs::GraphExec::instantiate(
        capture_empty_kernels(stream, kernels), stream, cudaGraphInstantiateFlagDeviceLaunch);
    const graphs::GraphExec launcher = make_tail_launcher(device_graph.get(), static_cast<int*>(status.data()), stream);
    SPG_CUDA_TRY(cudaMemsetAsync(status.data(), 0xFF, sizeof(int), stream));
    const double tail_us = median_launch_us(launcher, stream);
    int launched = -1;  // the last device-side launch's status
    SPG_CUDA_TRY(cudaMemcpy(&launched, status.data(), sizeof(int), cudaMemcpyDeviceToHost));
    SPG_EXPECTS_AS(StateError, launched == 0,
                   "bench: the device-side tail launch of " << kernels << " kernels returned " << launched);

    // [selector] -> switch over 3 bodies of `kernels` kernels; the selector picks body 0.
    const graphs::Graph g = build_large_switch(stream, static_cast<const int*>(value.data()), 3, kernels);
    const graphs::GraphExec switch_exec = graphs::GraphExec::instantiate(g, stream);
    const double switch_us = median_launch_us(switch_exec, stream);

    const std::string k = std::to_string(kernels) + " kernels";
    rep.add({"executor", "launch-probe/tail/" + k, "graph", "host_launch_us", tail_us});
    rep.add({"executor", "launch-probe/switch3/" + k, "graph", "host_launch_us", switch_us});
    std::printf("  launch-probe %-4d kernels: tail-launching 1-node graph %.2f us, switch node (3 bodies) %.2f us\n",
                kernels, tail_us, switch_us);
  }
}

enum class Property {
  plain,
  pdl,
  tensor_map,
  large_params,
  distinct,
  all,
  joins,
  dyn_smem,
  wide_grid,
  attention_shape,
  two_modules
};

/// What the launch-shape properties need of the device: the attention kernels' shape is 384
/// threads, ~210 KiB of dynamic shared memory and thousands of CTAs.
struct ProbeShape {
  unsigned wide_grid{1};    ///< 8 CTAs an SM, as the real graphs' larger grids
  int dyn_smem_bytes{0};    ///< 200 KiB, or the device's opt-in maximum if smaller
};

ProbeShape probe_shape() {
  core::DeviceInfo info;
  SPG_CUDA_TRY(core::current_device_info(info));
  int optin = 0;
  SPG_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, info.device));
  ProbeShape shape;
  shape.wide_grid = static_cast<unsigned>(8 * info.sms);
  shape.dyn_smem_bytes = std::min(200 * 1024, optin);
  static std::atomic<std::uint64_t> raised{0};
  SPG_CUDA_TRY(core::allow_dynamic_smem_once(reinterpret_cast<const void*>(&dyn_smem_kernel), shape.dyn_smem_bytes,
                                             info, raised));
  return shape;
}

const char* property_name(Property p) {
  switch (p) {
    case Property::plain: return "plain";
    case Property::pdl: return "pdl-edges";
    case Property::tensor_map: return "tensor-map-param";
    case Property::large_params: return "2KiB-params";
    case Property::distinct: return "40-distinct-kernels";
    case Property::joins: return "20-join-nodes";
    case Property::dyn_smem: return "200KiB-dyn-smem";
    case Property::wide_grid: return "wide-grid-384-threads";
    case Property::attention_shape: return "attention-shape";
    case Property::two_modules: return "2-modules";
    default: return "all-four";
  }
}

/// Launches kernel k of a chain with the properties `p` asks for (captured by the caller).
cudaError_t launch_with(Property p, int k, cudaStream_t stream, const ProbeShape& shape) {
  const bool pdl = p == Property::pdl || p == Property::all;
  const bool tmap = p == Property::tensor_map || p == Property::all;
  const bool large = p == Property::large_params || p == Property::all;
  const bool distinct = p == Property::distinct || p == Property::all;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = stream;
  cfg.attrs = pdl && k > 0 ? &attr : nullptr;
  cfg.numAttrs = pdl && k > 0 ? 1 : 0;
  int* sink = nullptr;
  // The launch shapes of the real graphs' attention kernels, one at a time and together.
  if (p == Property::wide_grid || p == Property::attention_shape) {
    cfg.gridDim = dim3(shape.wide_grid);
    cfg.blockDim = dim3(384);
  }
  if (p == Property::dyn_smem || p == Property::attention_shape) {
    cfg.dynamicSmemBytes = static_cast<std::size_t>(shape.dyn_smem_bytes);
    return cudaLaunchKernelEx(&cfg, dyn_smem_kernel, sink);
  }
  // Every other kernel from the library's spin module (0 ns: it returns at once): the real graphs
  // launch kernels of several translation units, each a module of its own.
  if (p == Property::two_modules && k % 2 == 0) return kernels::launch_spin(0, stream);
  // With several properties, kernels rotate over the property kernels and the distinct ones.
  if (distinct && (!(tmap || large) || k % 3 == 0)) {
    if (!pdl) return launch_distinct(k, stream, std::make_integer_sequence<int, 40>{});
    using Fn = void (*)(int*);
    static constexpr Fn fns[] = {&distinct_kernel<0>, &distinct_kernel<1>, &distinct_kernel<2>, &distinct_kernel<3>,
                                 &distinct_kernel<4>, &distinct_kernel<5>, &distinct_kernel<6>, &distinct_kernel<7>};
    return cudaLaunchKernelEx(&cfg, fns[k % 8], sink);
  }
  if (tmap && (!large || k % 3 == 1)) {
    CUtensorMap map{};
    return cudaLaunchKernelEx(&cfg, tensor_map_kernel, sink, map);
  }
  if (large) {
    LargeParams params{};
    return cudaLaunchKernelEx(&cfg, large_params_kernel, sink, params);
  }
  return cudaLaunchKernelEx(&cfg, empty_kernel, sink);
}

/// Captures 40 empty kernels as 20 forks and joins: kernel 2j on a side stream and 2j + 1 on
/// `stream`, both after the join before them, so every pair ends in a node of two dependencies
/// (a merge node).
void capture_joins(cudaStream_t stream, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join) {
  int* sink = nullptr;
  for (int j = 0; j < 20; ++j) {
    SPG_CUDA_TRY(cudaEventRecord(fork, stream));
    SPG_CUDA_TRY(cudaStreamWaitEvent(side, fork, 0));
    empty_kernel<<<1, 32, 0, side>>>(sink);
    SPG_CUDA_TRY(cudaGetLastError());
    empty_kernel<<<1, 32, 0, stream>>>(sink);
    SPG_CUDA_TRY(cudaGetLastError());
    SPG_CUDA_TRY(cudaEventRecord(join, side));
    SPG_CUDA_TRY(cudaStreamWaitEvent(stream, join, 0));
  }
}

/// cudaGraphLaunch host cost of a 40-kernel chain that adds one property of the real step graphs
/// at a time (then all four, then 20 join nodes: the graph is no chain; then the attention
/// kernels' launch shape: ~200 KiB of dynamic shared memory, 8 CTAs an SM of 384 threads, both;
/// then kernels of two modules): which of them makes a launch cost more than the plain chain.
void run_property_probe(Reporter& rep, cudaStream_t stream) {
  core::Stream side;
  core::Event fork(false);
  core::Event join(false);
  const ProbeShape shape = probe_shape();
  for (Property p : {Property::plain, Property::pdl, Property::tensor_map, Property::large_params, Property::distinct,
                     Property::all, Property::joins, Property::dyn_smem, Property::wide_grid,
                     Property::attention_shape, Property::two_modules}) {
    const graphs::GraphExec exec = [&] {
      graphs::CaptureGuard guard(stream);
      if (p == Property::joins) {
        capture_joins(stream, side.get(), fork.get(), join.get());
      } else {
        for (int k = 0; k < 40; ++k) SPG_CUDA_TRY(launch_with(p, k, stream, shape));
      }
      return graphs::GraphExec::instantiate(guard.finish(), stream);
    }();
    const double us = median_launch_us(exec, stream);
    rep.add({"executor", std::string("launch-probe/property/") + property_name(p), "graph", "host_launch_us", us});
    std::printf("  launch-probe 40 kernels, %-20s cudaGraphLaunch %.2f us\n", property_name(p), us);
  }
}

/// cudaGraphLaunch of a 40-kernel graph with no CUPTI subscriber, attached (the allocation
/// counter's subscriber), detached, and attached again; the last also checks that counting still
/// works after a detach.
void run_cupti_probe(Reporter& rep, cudaStream_t stream) {
  const graphs::GraphExec exec = graphs::GraphExec::instantiate(capture_empty_kernels(stream, 40), stream);
  memory::AllocationCounter* counter = nullptr;
  for (const char* state : {"no-subscriber", "cupti-attached", "cupti-detached", "cupti-reattached"}) {
    const std::string_view st(state);
    if (st == "no-subscriber") {
      counter = &memory::AllocationCounter::instance();  // subscribes on first use: detach first
      counter->detach();
    }
    if (st == "cupti-attached") counter->attach();
    if (st == "cupti-detached") counter->detach();
    if (st == "cupti-reattached") counter->attach();
    const double us = median_launch_us(exec, stream);
    rep.add({"executor", std::string("launch-probe/40 kernels/") + state, "graph", "host_launch_us", us});
    std::printf("  launch-probe 40 kernels, %-16s cudaGraphLaunch %.2f us\n", state, us);
  }
  counter->reset();
  { core::DeviceBuffer probe(256); }
  std::printf("  launch-probe: allocation calls counted after re-attaching: %llu (expect >= 2)\n",
              static_cast<unsigned long long>(counter->count()));
  rep.add({"executor", "launch-probe/reattached-counts", "graph", "alloc_calls", static_cast<double>(counter->count())});
  counter->detach();
}

}  // namespace

// ---- the load probe: the same graphs launched on an idle device and with the device behind ----

graphs::GraphExec make_tail_launcher(cudaGraphExec_t device_exec, int* status, cudaStream_t stream) {
  graphs::CaptureGuard guard(stream);
  tail_launch_checked_kernel<<<1, 1, 0, stream>>>(device_exec, status);
  SPG_CUDA_TRY(cudaGetLastError());
  return graphs::GraphExec::instantiate(guard.finish(), stream);
}

LaunchLoad measure_launch_load(const std::function<cudaError_t(int)>& launch, cudaStream_t stream, int execs) {
  LaunchLoad out;
  std::vector<double> idle;
  std::vector<double> busy;
  for (int i = 0; i < 120; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(launch(i % execs));
    const auto t1 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
    if (i >= 20) idle.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  // Behind a 3 ms spin, 10 rounds of 16 launches back to back: every launch finds the device busy
  // and the launches before it still queued.
  for (int round = 0; round < 11; ++round) {
    SPG_CUDA_TRY(kernels::launch_spin(3'000'000ULL, stream));
    for (int i = 0; i < 16; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      SPG_CUDA_TRY(launch(i % execs));
      const auto t1 = std::chrono::steady_clock::now();
      if (round > 0) busy.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  std::vector<double> running;
  for (int i = 0; i < 45; ++i) {
    SPG_CUDA_TRY(launch(0));
    const auto t0 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(launch(execs > 1 ? 1 : 0));
    const auto t1 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
    if (i >= 5) running.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  out.idle_us = median(idle);
  out.busy_us = median(busy);
  out.running_us = median(running);
  return out;
}

namespace {

/// A graph of 40 empty kernels in `branches` parallel chains (1: a straight chain), forked from
/// and joined into the stream with events during the capture.
graphs::Graph capture_branches(cudaStream_t stream, int branches) {
  std::vector<core::Stream> side(static_cast<std::size_t>(branches > 1 ? branches - 1 : 0));
  std::vector<core::Event> fork;
  std::vector<core::Event> join;
  for (int b = 0; b < branches; ++b) {
    fork.emplace_back(false);
    join.emplace_back(false);
  }
  graphs::CaptureGuard guard(stream);
  SPG_CUDA_TRY(cudaEventRecord(fork[0].get(), stream));
  for (int b = 1; b < branches; ++b) {
    cudaStream_t s = side[static_cast<std::size_t>(b - 1)].get();
    SPG_CUDA_TRY(cudaStreamWaitEvent(s, fork[0].get(), 0));
    for (int k = 0; k < 40 / branches; ++k) empty_kernel<<<1, 32, 0, s>>>(nullptr);
    SPG_CUDA_TRY(cudaEventRecord(join[static_cast<std::size_t>(b)].get(), s));
  }
  for (int k = 0; k < 40 - (branches - 1) * (40 / branches); ++k) empty_kernel<<<1, 32, 0, stream>>>(nullptr);
  for (int b = 1; b < branches; ++b) SPG_CUDA_TRY(cudaStreamWaitEvent(stream, join[static_cast<std::size_t>(b)].get(), 0));
  SPG_CUDA_TRY(cudaGetLastError());
  return guard.finish();
}

/// 36 empty kernels with a 4 KiB memset node after every ninth.
graphs::Graph capture_with_memsets(cudaStream_t stream, void* buffer) {
  graphs::CaptureGuard guard(stream);
  for (int k = 0; k < 36; ++k) {
    empty_kernel<<<1, 32, 0, stream>>>(nullptr);
    if (k % 9 == 8) SPG_CUDA_TRY(cudaMemsetAsync(buffer, 0, 4096, stream));
  }
  SPG_CUDA_TRY(cudaGetLastError());
  return guard.finish();
}

/// cudaGraphLaunch host cost, idle against busy, of graphs that add one property at a time to
/// the plain 40-kernel chain: parallel branches, memset nodes, a large conditional node, and the
/// relaunch of an exec whose previous launch is still queued (one exec) against two alternating.
void run_load_probe(Reporter& rep, cudaStream_t stream) {
  core::DeviceBuffer scratch(4096);
  core::DeviceBuffer value(4);
  SPG_CUDA_TRY(cudaMemsetAsync(value.data(), 0, 4, stream));
  core::Event ev(false);
  struct Case {
    std::string name;
    std::vector<graphs::GraphExec> execs;
  };
  std::vector<Case> cases;
  auto add_case = [&](const std::string& name, const std::function<graphs::Graph()>& make, int copies) {
    Case c{name, {}};
    for (int i = 0; i < copies; ++i) c.execs.push_back(graphs::GraphExec::instantiate(make(), stream));
    cases.push_back(std::move(c));
  };
  add_case("plain-chain", [&] { return capture_branches(stream, 1); }, 1);
  add_case("plain-chain-2-execs", [&] { return capture_branches(stream, 1); }, 2);
  add_case("fork-join-4-branches", [&] { return capture_branches(stream, 4); }, 1);
  add_case("4-memset-nodes", [&] { return capture_with_memsets(stream, scratch.data()); }, 1);
  // Conditional bodies: does the launch grow with the bodies' nodes (the step graph holds ~1000)?
  for (const auto& [bodies, kernels] : {std::pair{3, 40}, std::pair{15, 40}, std::pair{45, 40}, std::pair{45, 8}}) {
    add_case("switch-" + std::to_string(bodies) + "x" + std::to_string(kernels), [&, bodies = bodies, kernels = kernels] {
      return build_large_switch(stream, static_cast<const int*>(value.data()), bodies, kernels);
    }, 1);
  }
  for (const Case& c : cases) {
    const LaunchLoad l = measure_launch_load(
        [&](int i) { return c.execs[static_cast<std::size_t>(i)].launch(stream); }, stream,
        static_cast<int>(c.execs.size()));
    rep.add({"executor", "launch-probe/load/" + c.name, "graph", "host_launch_us_idle", l.idle_us});
    rep.add({"executor", "launch-probe/load/" + c.name, "graph", "host_launch_us_busy", l.busy_us});
    rep.add({"executor", "launch-probe/load/" + c.name, "graph", "host_launch_us_after_launch", l.running_us});
    std::printf("  launch-probe load %-24s cudaGraphLaunch idle %.2f us, busy %.2f us, right after a launch %.2f us\n",
                c.name.c_str(), l.idle_us, l.busy_us, l.running_us);
  }
  // The per-launch event record the executor made before (after every launch): idle and busy.
  const graphs::GraphExec& plain = cases[0].execs[0];
  const LaunchLoad rec = measure_launch_load(
      [&](int) {
        const cudaError_t e = plain.launch(stream);
        return e == cudaSuccess ? cudaEventRecord(ev.get(), stream) : e;
      },
      stream, 1);
  rep.add({"executor", "launch-probe/load/plain-chain+event-record", "graph", "host_launch_us_idle", rec.idle_us});
  rep.add({"executor", "launch-probe/load/plain-chain+event-record", "graph", "host_launch_us_busy", rec.busy_us});
  std::printf("  launch-probe load %-24s launch + cudaEventRecord idle %.2f us, busy %.2f us\n", "plain-chain", rec.idle_us,
              rec.busy_us);
}

/// The gather's traffic without its indirection: each warp reads a 576-byte row and writes a
/// 1024-byte row (36% read, 64% written), four rows in flight, rows dealt round-robin.
__global__ void __launch_bounds__(256) stream_rows_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                                          int rows) {
  constexpr int kInFlight = 4;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  for (int base = warp; base < rows; base += kInFlight * warps) {
    uint4 a[kInFlight];
    uint4 b[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const int row = base + q * warps;
      a[q] = make_uint4(0, 0, 0, 0);
      b[q] = make_uint4(0, 0, 0, 0);
      if (row < rows) {
        a[q] = src[std::size_t{36} * row + lane];
        if (lane < 4) b[q] = src[std::size_t{36} * row + 32 + lane];
      }
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const int row = base + q * warps;
      if (row >= rows) continue;
      dst[std::size_t{64} * row + lane] = a[q];
      dst[std::size_t{64} * row + 32 + lane] = make_uint4(a[q].x ^ b[q].x, a[q].y, a[q].z, a[q].w);
    }
  }
}

enum class Lead { none, copy_node, pull_kernel };

const char* lead_name(Lead l) {
  switch (l) {
    case Lead::none: return "none";
    case Lead::copy_node: return "copy";
    default: return "pull";
  }
}

}  // namespace

cudaError_t launch_copy_kernel(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) noexcept {
  core::DeviceInfo info;
  const cudaError_t e = core::current_device_info(info);
  if (e != cudaSuccess) return e;
  copy_kernel<<<static_cast<unsigned>(info.sms * 4), 512, 0, stream>>>(static_cast<uint4*>(dst),
                                                                   static_cast<const uint4*>(src), bytes / 16);
  return cudaGetLastError();
}

cudaError_t launch_stream_rows_kernel(void* dst, const void* src, int rows, cudaStream_t stream) noexcept {
  core::DeviceInfo info;
  const cudaError_t e = core::current_device_info(info);
  if (e != cudaSuccess) return e;
  stream_rows_kernel<<<static_cast<unsigned>(info.sms * 4), 256, 0, stream>>>(static_cast<uint4*>(dst),
                                                                         static_cast<const uint4*>(src), rows);
  return cudaGetLastError();
}

// ---- the loop probe: which structure of a device-side chunk loop costs least per chunk ----

namespace {

constexpr unsigned kLoopNoBody = 1U << 20;  ///< a SWITCH value past every body
constexpr int kLoopMaxChunks = 16;
/// The loop state in device memory: [0] chunks, [1] next chunk, [2, 2 + kLoopMaxChunks) buckets.
constexpr int kLoopStateWords = 2 + kLoopMaxChunks;

/// A body kernel: one thread a CTA spins `cycles` SM clocks (~2 us), then CTA 0 counts the kernel
/// in `hits`.
__global__ void loop_work_kernel(unsigned long long* hits, long long cycles) {
  if (threadIdx.x != 0) return;
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (blockIdx.x == 0) atomicAdd(hits, 1ULL);  // every CTA spins; the first counts the kernel
}

/// The same with a by-value parameter block as large as the attention's (never read: the spin is
/// never negative), and with a __grid_constant__ tensor map, as the attention kernels take theirs.
__global__ void loop_work_params_kernel(unsigned long long* hits, long long cycles, const LargeParams p) {
  if (threadIdx.x != 0) return;
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (blockIdx.x == 0) atomicAdd(hits, cycles >= 0 ? 1ULL : static_cast<unsigned long long>(p.words[threadIdx.x]));
}

__global__ void loop_work_tmap_kernel(unsigned long long* hits, long long cycles, const __grid_constant__ CUtensorMap map) {
  if (threadIdx.x != 0) return;
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (blockIdx.x == 0) {
    atomicAdd(hits, cycles >= 0 ? 1ULL : static_cast<unsigned long long>(reinterpret_cast<const char*>(&map)[0]));
  }
}

/// The same with programmatic dependent launch, as the layers' kernels do: waits for the kernel
/// before it, then lets the next one launch (its CTA then waits in griddepcontrol.wait).
__global__ void loop_work_pdl_kernel(unsigned long long* hits, long long cycles) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x != 0) return;
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (blockIdx.x == 0) atomicAdd(hits, 1ULL);
}

struct LoopHandles {
  cudaGraphConditionalHandle loop{};
  cudaGraphConditionalHandle select{};
  int set_loop{0};
  int set_select{0};
};

__global__ void loop_head_kernel(int* state, LoopHandles h) {
  state[1] = 0;
  if (h.set_loop != 0) cudaGraphSetConditional(h.loop, state[0] > 0 ? 1U : 0U);
}

/// step_next_kernel's part that matters here: takes the next chunk, selects its bucket's body,
/// keeps the loop going while chunks are left. Past the last chunk it selects kLoopNoBody, out of
/// every SWITCH's range: "If the condition does not match a body index, no body is launched" (CUDA
/// 13.0 runtime API, cudaGraphCondTypeSwitch); the probe's hit count checks it.
__global__ void loop_next_kernel(int* state, LoopHandles h) {
  const int i = state[1];
  state[1] = i + 1;
  if (h.set_select != 0) {
    cudaGraphSetConditional(h.select, i < state[0] ? static_cast<unsigned>(state[2 + i]) : kLoopNoBody);
  }
  if (h.set_loop != 0) cudaGraphSetConditional(h.loop, i + 1 < state[0] ? 1U : 0U);
}

enum class Loop { while_switch, while_4switch, flat_16switch, while_body, flat_plain, eager };
constexpr Loop kLoops[] = {Loop::while_switch, Loop::while_4switch, Loop::flat_16switch,
                           Loop::while_body,   Loop::flat_plain,    Loop::eager};

const char* loop_name(Loop v) {
  static constexpr const char* kNames[] = {"while-switch", "while-4switch", "flat-16switch",
                                           "while-body",   "flat-plain",    "eager"};
  return kNames[static_cast<int>(v)];
}

struct LoopBuffers {
  int* state;
  unsigned long long* hits;
  long long cycles;
  int kernels;  ///< K, the body's dependent kernels
  bool pdl;     ///< kernels 1..K-1 of a body hang on programmatic edges (loop_work_pdl_kernel)
  /// 0: loop_work_kernel's two parameters; 1: and a 2 KiB block by value; 2: and a tensor map.
  int params;
  int buckets;    ///< the SWITCH's bodies (chunk c runs bucket c % buckets)
  unsigned grid;  ///< CTAs of each body kernel
};

/// Nodes appended to one graph as a chain.
struct Chain {
  cudaGraph_t graph;
  cudaGraphNode_t last{nullptr};
  void kernel(const void* fn, unsigned threads, void** args, bool programmatic = false, unsigned grid = 1) {
    cudaGraphNodeParams np{};
    np.type = cudaGraphNodeTypeKernel;
    np.kernel.func = const_cast<void*>(fn);
    np.kernel.gridDim = dim3(grid);
    np.kernel.blockDim = dim3(threads);
    np.kernel.kernelParams = args;
    cudaGraphEdgeData edge{};
    if (programmatic) {  // the edge PDL capture makes: the kernel may launch once its predecessor triggers
      edge.from_port = cudaGraphKernelNodePortProgrammatic;
      edge.type = cudaGraphDependencyTypeProgrammatic;
    }
    cudaGraphNode_t n = nullptr;
    SPG_CUDA_TRY(cudaGraphAddNode(&n, graph, last != nullptr ? &last : nullptr, last != nullptr ? &edge : nullptr,
                                  last != nullptr ? 1 : 0, &np));
    last = n;
  }
  std::vector<cudaGraph_t> conditional(cudaGraphConditionalHandle h, cudaGraphConditionalNodeType type, unsigned size) {
    const graphs::ConditionalNode n = graphs::add_conditional_node(graph, last != nullptr ? &last : nullptr, h, type, size);
    last = n.node;
    return {n.bodies, n.bodies + size};
  }
  void body(const LoopBuffers& b) {
    unsigned long long* hits = b.hits;
    long long cycles = b.cycles;
    LargeParams large{};
    CUtensorMap map{};
    void* args[] = {&hits, &cycles, b.params == 1 ? static_cast<void*>(&large) : static_cast<void*>(&map)};
    const void* fn = b.pdl             ? reinterpret_cast<const void*>(&loop_work_pdl_kernel)
                     : b.params == 1 ? reinterpret_cast<const void*>(&loop_work_params_kernel)
                     : b.params == 2 ? reinterpret_cast<const void*>(&loop_work_tmap_kernel)
                                     : reinterpret_cast<const void*>(&loop_work_kernel);
    for (int k = 0; k < b.kernels; ++k) kernel(fn, 32, args, b.pdl && k > 0, b.grid);
  }
};

/// head -> [WHILE{] segments of [next -> SWITCH{kLoopBuckets bodies} or body] [}]; `chunks` only
/// sizes flat-plain (the others read the chunk count from the state at run time).
graphs::Graph build_loop(Loop v, int chunks, const LoopBuffers& b) {
  cudaGraph_t top = nullptr;
  SPG_CUDA_TRY(cudaGraphCreate(&top, 0));
  graphs::Graph g(top);
  LoopHandles h;
  h.set_loop = v == Loop::while_switch || v == Loop::while_4switch || v == Loop::while_body ? 1 : 0;
  h.set_select = v == Loop::while_switch || v == Loop::while_4switch || v == Loop::flat_16switch ? 1 : 0;
  if (h.set_loop != 0) SPG_CUDA_TRY(cudaGraphConditionalHandleCreate(&h.loop, top, 0, 0));
  int* state = b.state;
  void* args[] = {&state, &h};
  Chain c{top};
  c.kernel(reinterpret_cast<const void*>(&loop_head_kernel), 1, args);
  if (h.set_loop != 0) c = Chain{c.conditional(h.loop, cudaGraphCondTypeWhile, 1)[0]};
  const int segments = v == Loop::while_4switch   ? 4
                       : v == Loop::flat_16switch ? kLoopMaxChunks
                       : v == Loop::flat_plain    ? chunks
                                                  : 1;
  for (int s = 0; s < segments; ++s) {
    // One handle a SWITCH node (the docs associate a handle with one conditional node).
    if (h.set_select != 0) SPG_CUDA_TRY(cudaGraphConditionalHandleCreate(&h.select, top, 0, 0));
    c.kernel(reinterpret_cast<const void*>(&loop_next_kernel), 1, args);
    if (h.set_select == 0) {
      c.body(b);
      continue;
    }
    for (cudaGraph_t body : c.conditional(h.select, cudaGraphCondTypeSwitch, static_cast<unsigned>(b.buckets))) {
      Chain{body}.body(b);
    }
  }
  return g;
}

cudaError_t launch_loop_eager(int chunks, const LoopBuffers& b, cudaStream_t stream) {
  const LoopHandles none{};
  loop_head_kernel<<<1, 1, 0, stream>>>(b.state, none);
  for (int c = 0; c < chunks; ++c) {
    loop_next_kernel<<<1, 1, 0, stream>>>(b.state, none);
    for (int k = 0; k < b.kernels; ++k) {
      if (b.params == 1) {
        loop_work_params_kernel<<<b.grid, 32, 0, stream>>>(b.hits, b.cycles, LargeParams{});
        continue;
      }
      if (b.params == 2) {
        loop_work_tmap_kernel<<<b.grid, 32, 0, stream>>>(b.hits, b.cycles, CUtensorMap{});
        continue;
      }
      if (!b.pdl) {
        loop_work_kernel<<<b.grid, 32, 0, stream>>>(b.hits, b.cycles);
        continue;
      }
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(b.grid);
      cfg.blockDim = dim3(32);
      cfg.stream = stream;
      cfg.attrs = k > 0 ? &attr : nullptr;
      cfg.numAttrs = k > 0 ? 1 : 0;
      const cudaError_t e = cudaLaunchKernelEx(&cfg, loop_work_pdl_kernel, b.hits, b.cycles);
      if (e != cudaSuccess) return e;
    }
  }
  return cudaGetLastError();
}

struct LoopTimes {
  double gpu_idle{0};
  double gpu_steady{0};
  double host_idle{0};
  double host_after{0};
  bool behind{true};  ///< the steady launches were all queued before the device reached them
};

/// Times `launch` (one step of `chunks` chunks) and checks after every synchronization that the
/// body kernels ran chunks * K times a launch.
LoopTimes time_loop(const std::function<cudaError_t()>& launch, Loop v, int chunks, const LoopBuffers& b,
                    cudaStream_t stream) {
  core::Event e0;
  core::Event e1;
  unsigned long long expected = 0;
  SPG_CUDA_TRY(cudaMemsetAsync(b.hits, 0, sizeof(unsigned long long), stream));
  auto check = [&](int launches) {
    expected += static_cast<unsigned long long>(launches) * static_cast<unsigned long long>(chunks * b.kernels);
    unsigned long long got = 0;
    SPG_CUDA_TRY(cudaMemcpyAsync(&got, b.hits, sizeof got, cudaMemcpyDeviceToHost, stream));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
    SPG_EXPECTS_AS(StateError, got == expected,
                   "launch-probe loop " << loop_name(v) << ", " << chunks << " chunks: body kernels ran " << got
                                        << " times, expected " << expected << " (" << chunks << " chunks x "
                                        << b.kernels << " kernels a launch)");
  };
  auto us = [](auto t0, auto t1) { return std::chrono::duration<double, std::micro>(t1 - t0).count(); };
  LoopTimes out;
  std::vector<double> gpu;
  std::vector<double> host;
  for (int i = 0; i < 60; ++i) {  // idle: each launch after a synchronization
    SPG_CUDA_TRY(cudaEventRecord(e0.get(), stream));
    const auto t0 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(launch());
    const auto t1 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(cudaEventRecord(e1.get(), stream));
    check(1);
    if (i < 5) continue;
    host.push_back(us(t0, t1));
    gpu.push_back(1000.0 * static_cast<double>(e1.elapsed_ms_since(e0)));
  }
  out.gpu_idle = median(gpu);
  out.host_idle = median(host);
  host.clear();
  for (int i = 0; i < 30; ++i) {  // the launch right after a launch of the same step, still running
    SPG_CUDA_TRY(launch());
    const auto t0 = std::chrono::steady_clock::now();
    SPG_CUDA_TRY(launch());
    const auto t1 = std::chrono::steady_clock::now();
    check(2);
    host.push_back(us(t0, t1));
  }
  out.host_after = median(host);
  // Steady: 20 launches queued behind a spin long enough for the host to queue them all.
  gpu.clear();
  const auto spin_ns = static_cast<unsigned long long>(2'000'000.0 + 40.0 * 1000.0 * out.host_idle);
  for (int r = 0; r < 3; ++r) {
    SPG_CUDA_TRY(kernels::launch_spin(spin_ns, stream));
    SPG_CUDA_TRY(cudaEventRecord(e0.get(), stream));
    for (int i = 0; i < 20; ++i) SPG_CUDA_TRY(launch());
    const cudaError_t q = cudaEventQuery(e0.get());
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
    } else {
      SPG_CUDA_TRY(q);
      out.behind = false;
    }
    SPG_CUDA_TRY(cudaEventRecord(e1.get(), stream));
    check(20);
    gpu.push_back(1000.0 * static_cast<double>(e1.elapsed_ms_since(e0)) / 20.0);
  }
  out.gpu_steady = median(gpu);
  return out;
}

/// One table of the loop probe: the bodies' kernels and the variants timed.
struct LoopCase {
  int kernels{6};
  bool pdl{false};
  int params{0};     ///< LoopBuffers::params
  int buckets{3};
  unsigned grid{1};  ///< CTAs a body kernel
  bool all{true};    ///< every variant; else while-switch, while-body, flat-plain and eager
};

/// Each loop structure for 1, 4 and 16 chunks of the case's bodies (the table under "Which loop
/// structure costs least per chunk" in docs/benchmarks.md): GPU time per step idle and steady,
/// and host launch time.
void run_loop_structures(Reporter& rep, cudaStream_t stream, const LoopCase& lc) {
  const int kernels = lc.kernels;
  const bool pdl = lc.pdl;
  const int params = lc.params;
  int device = 0;
  int khz = 0;
  SPG_CUDA_TRY(cudaGetDevice(&device));
  SPG_CUDA_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  SPG_EXPECTS_AS(StateError, khz > 0, "launch-probe loop: cudaDevAttrClockRate = " << khz << " kHz, expected > 0");
  core::DeviceBuffer state(kLoopStateWords * 4);
  core::DeviceBuffer hits(sizeof(unsigned long long));
  const LoopBuffers b{static_cast<int*>(state.data()), static_cast<unsigned long long*>(hits.data()),
                      2LL * khz / 1000, kernels, pdl, params, lc.buckets, lc.grid};  // ~2 us at the peak clock
  const auto runs = [&](Loop v) { return lc.all || (v != Loop::while_4switch && v != Loop::flat_16switch); };
  constexpr int kChunks[] = {1, 4, 16};
  std::vector<graphs::GraphExec> fixed;  // the conditional graphs: one exec for every chunk count
  for (Loop v : kLoops) {
    if (v != Loop::flat_plain && v != Loop::eager) {
      fixed.push_back(runs(v) ? graphs::GraphExec::instantiate(build_loop(v, 0, b), stream) : graphs::GraphExec{});
    }
  }
  LoopTimes t[6][3];
  for (int ki = 0; ki < 3; ++ki) {
    const int chunks = kChunks[ki];
    std::int32_t words[kLoopStateWords] = {chunks, 0};
    for (int c = 0; c < kLoopMaxChunks; ++c) words[2 + c] = c % lc.buckets;
    SPG_CUDA_TRY(cudaMemcpyAsync(state.data(), words, sizeof words, cudaMemcpyHostToDevice, stream));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
    const graphs::GraphExec plain = graphs::GraphExec::instantiate(build_loop(Loop::flat_plain, chunks, b), stream);
    for (int vi = 0; vi < 6; ++vi) {
      const Loop v = kLoops[vi];
      if (!runs(v)) continue;
      const graphs::GraphExec& exec = v == Loop::flat_plain ? plain : fixed[static_cast<std::size_t>(std::min(vi, 3))];
      const auto launch = [&]() -> cudaError_t {
        return v == Loop::eager ? launch_loop_eager(chunks, b, stream) : exec.launch(stream);
      };
      t[vi][ki] = time_loop(launch, v, chunks, b, stream);
    }
  }
  // launch-probe/loop[-K][-pdl|-2KiB-params|-tensor-map][-B buckets][-G ctas]/ (snprintf: g++ 12
  // warns on the string concatenation)
  char prefix_text[96];
  char buckets_text[24] = "";
  char grid_text[24] = "";
  if (lc.buckets != 3) std::snprintf(buckets_text, sizeof buckets_text, "-%d-buckets", lc.buckets);
  if (lc.grid != 1) std::snprintf(grid_text, sizeof grid_text, "-%u-ctas", lc.grid);
  static constexpr const char* kParams[] = {"", "-2KiB-params", "-tensor-map"};
  std::snprintf(prefix_text, sizeof prefix_text, "launch-probe/loop%s%.0d%s%s%s%s/", kernels != 6 ? "-" : "",
                kernels != 6 ? kernels : 0, pdl ? "-pdl" : "", kParams[params], buckets_text, grid_text);
  const std::string prefix = prefix_text;
  std::printf("  launch-probe loop, bodies of %d kernels of %u CTAs spinning %lld cycles (~2 us)%s%s, %d buckets; us, "
              "medians; +/chunk: "
              "steady GPU time over flat-plain's, a chunk\n"
              "  %-14s %6s %9s %10s %8s %10s %11s\n",
              kernels, lc.grid, b.cycles, pdl ? " on programmatic edges" : "",
              params == 1 ? " with 2 KiB by-value parameters" : params == 2 ? " with a tensor-map parameter" : "", lc.buckets, "variant", "chunks", "gpu idle", "gpu steady", "+/chunk", "host idle",
              "host after");
  for (int vi = 0; vi < 6; ++vi) {
    if (!runs(kLoops[vi])) continue;
    for (int ki = 0; ki < 3; ++ki) {
      const LoopTimes& x = t[vi][ki];
      const double over = (x.gpu_steady - t[4][ki].gpu_steady) / kChunks[ki];
      const std::string name = prefix + loop_name(kLoops[vi]) + "/" + std::to_string(kChunks[ki]) + " chunks";
      const char* mode = kLoops[vi] == Loop::eager ? "eager" : "graph";
      rep.add({"executor", name, mode, "gpu_us_idle", x.gpu_idle});
      rep.add({"executor", name, mode, "gpu_us_steady", x.gpu_steady});
      rep.add({"executor", name, mode, "host_launch_us", x.host_idle});
      rep.add({"executor", name, mode, "host_launch_us_after_launch", x.host_after});
      std::printf("  %-14s %6d %9.2f %9.2f%s %+8.2f %10.2f %11.2f\n", loop_name(kLoops[vi]), kChunks[ki], x.gpu_idle,
                  x.gpu_steady, x.behind ? " " : "*", over, x.host_idle, x.host_after);
    }
  }
  std::printf("  (* the device caught up with the host during the steady launches: host-bound)\n");
}

}  // namespace

void run_launch_probe(Reporter& rep) {
  constexpr int kWords = 9 * 1024;  // 36 KiB, about the default program's staging block
  core::Stream stream;
  core::PinnedBuffer staging(kWords * 4);
  core::DeviceBuffer meta(kWords * 4);
  core::Event done;
  for (int w = 0; w < kWords; ++w) static_cast<std::int32_t*>(staging.data())[w] = w;
  for (Lead lead : {Lead::none, Lead::copy_node, Lead::pull_kernel}) {
    for (int kernels : {1, 8, 40}) {
      graphs::GraphExec exec = [&] {
        graphs::CaptureGuard guard(stream.get());
        if (lead == Lead::copy_node) {
          SPG_CUDA_TRY(cudaMemcpyAsync(meta.data(), staging.data(), kWords * 4, cudaMemcpyHostToDevice, stream.get()));
        } else if (lead == Lead::pull_kernel) {
          pull_kernel<<<8, 256, 0, stream.get()>>>(static_cast<const std::int32_t*>(staging.data()),
                                                   static_cast<std::int32_t*>(meta.data()), kWords);
        }
        for (int k = 0; k < kernels; ++k) empty_kernel<<<1, 32, 0, stream.get()>>>(nullptr);
        SPG_CUDA_TRY(cudaGetLastError());
        return graphs::GraphExec::instantiate(guard.finish(), stream.get());
      }();
      std::vector<double> launch_us;
      std::vector<double> record_us;
      for (int i = 0; i < 220; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        SPG_CUDA_TRY(exec.launch(stream.get()));
        const auto t1 = std::chrono::steady_clock::now();
        SPG_CUDA_TRY(cudaEventRecord(done.get(), stream.get()));
        const auto t2 = std::chrono::steady_clock::now();
        SPG_CUDA_TRY(cudaStreamSynchronize(stream.get()));
        if (i < 20) continue;
        launch_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        record_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
      const std::string name = std::string("launch-probe/") + lead_name(lead) + "/" + std::to_string(kernels) + " kernels";
      rep.add({"executor", name, "graph", "host_launch_us", median(launch_us)});
      rep.add({"executor", name, "graph", "host_record_us", median(record_us)});
      std::printf("  %-34s cudaGraphLaunch %.2f us, event record %.2f us\n", name.c_str(), median(launch_us),
                  median(record_us));
    }
  }
  run_indirect_launch_probe(rep, stream.get());
  run_property_probe(rep, stream.get());
  run_load_probe(rep, stream.get());
  run_cupti_probe(rep, stream.get());
  run_loop_probe(rep);
}

void run_property_probes(Reporter& rep) {
  core::Stream stream;
  run_property_probe(rep, stream.get());
}

void run_loop_probe(Reporter& rep) {
  core::Stream stream;
  // Plain bodies, then one property of the real bodies at a time: programmatic edges, a 2 KiB
  // parameter block, a tensor-map parameter.
  for (const auto& [pdl, params] : {std::pair{false, 0}, std::pair{true, 0}, std::pair{false, 1}, std::pair{false, 2}}) {
    run_loop_structures(rep, stream.get(), LoopCase{6, pdl, params});
    run_loop_structures(rep, stream.get(), LoopCase{48, pdl, params});
  }
  // The real step graph's other differences: 27 bucket bodies, and grids of many CTAs (8 a SM).
  int sms = 0;
  int device = 0;
  SPG_CUDA_TRY(cudaGetDevice(&device));
  SPG_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto wide = static_cast<unsigned>(8 * sms);
  run_loop_structures(rep, stream.get(), LoopCase{48, false, 0, 27, 1, false});
  run_loop_structures(rep, stream.get(), LoopCase{6, false, 0, 3, wide, false});
  run_loop_structures(rep, stream.get(), LoopCase{48, false, 0, 3, wide, false});
  run_loop_structures(rep, stream.get(), LoopCase{48, true, 0, 27, wide, false});
}

}  // namespace spg::bench
