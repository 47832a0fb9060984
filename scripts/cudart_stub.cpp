// A stand-in for libcudart.so.13 with no device behind it, for measuring spgraph's host-side cost
// (the Python binding, the executor's staging) on a machine without a GPU. Every call succeeds at
// once: device and pinned memory are host memory, kernels and graph launches do nothing, events
// are always complete. Nothing computed under it is meaningful; only host time is. Preloaded
// (LD_PRELOAD) so it takes the libcudart.so.13 symbols of the extension; see
// scripts/python_host_overhead.py (which builds it). Every entry point a host path calls counts its
// calls (spgraph_stub_call_counts), so a path's CUDA calls can be listed here, each of which costs
// the driver's time on a real host.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Allocation {
  const char* begin;
  std::size_t bytes;
  cudaMemoryType type;
};
std::mutex mutex;
std::vector<Allocation> allocations;
struct FakeGraph {
  std::size_t nodes{0};
  std::vector<std::vector<cudaGraph_t>> children;  // conditional nodes' bodies, owned here
  ~FakeGraph() {
    for (auto& bodies : children) {
      for (cudaGraph_t b : bodies) delete reinterpret_cast<FakeGraph*>(b);
    }
  }
};
int capturing = 0;           // streams in capture (one at a time in spgraph's warm-up)
FakeGraph* target = nullptr; // the graph the capture in progress records into
unsigned long long handles = 0;

void* allocate(std::size_t bytes, cudaMemoryType type) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
  const std::lock_guard<std::mutex> lock(mutex);
  allocations.push_back({static_cast<const char*>(p), bytes, type});
  return p;
}
void release(void* p) {
  if (p == nullptr) return;
  const std::lock_guard<std::mutex> lock(mutex);
  for (auto it = allocations.begin(); it != allocations.end(); ++it) {
    if (it->begin == p) {
      allocations.erase(it);
      break;
    }
  }
  std::free(p);
}
void launched() {
  if (capturing > 0 && target != nullptr) ++target->nodes;
}
CUresult encode_tensor_map(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                           const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                           CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_SUCCESS;
}
/// Calls per entry point (the SPG_STUB_COUNT() at the top of each): which CUDA calls a host path
/// makes, each of which costs the driver's time on a real host.
struct CallCounter {
  const char* name;
  std::atomic<unsigned long long> calls{0};
};
std::vector<CallCounter*>& counters() {
  static auto* all = new std::vector<CallCounter*>;  // never destroyed: entry points may run at exit
  return *all;
}
CallCounter& counter(const char* name) {
  const std::lock_guard<std::mutex> lock(mutex);
  auto* c = new CallCounter{name};
  counters().push_back(c);
  return *c;
}
#define SPG_STUB_COUNT()                                       \
  do {                                                         \
    static CallCounter& spg_counter = counter(__func__);       \
    spg_counter.calls.fetch_add(1, std::memory_order_relaxed); \
  } while (0)
}  // namespace

extern "C" {

/// The calls counted so far as "name count" lines into `buf` (at most `size` bytes, NUL-ended);
/// returns the length the whole text needs. Entry points never called are not listed.
int spgraph_stub_call_counts(char* buf, int size) {
  std::string text;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (const CallCounter* c : counters()) {
      text += std::string(c->name) + " " + std::to_string(c->calls.load(std::memory_order_relaxed)) + "\n";
    }
  }
  if (buf != nullptr && size > 0) {
    const std::size_t n = std::min(text.size(), static_cast<std::size_t>(size - 1));
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return static_cast<int>(text.size()) + 1;
}
/// Zeroes every count.
void spgraph_stub_reset_call_counts() {
  const std::lock_guard<std::mutex> lock(mutex);
  for (CallCounter* c : counters()) c->calls.store(0, std::memory_order_relaxed);
}

void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*, dim3*, int*) {}
void __cudaRegisterVar(void**, char*, char*, const char*, int, std::size_t, int, int) {}
unsigned __cudaPushCallConfiguration(dim3, dim3, std::size_t, void*) {
  SPG_STUB_COUNT();
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3*, dim3*, std::size_t*, void*) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* k, const void* f) {
  SPG_STUB_COUNT();
  *k = reinterpret_cast<cudaKernel_t>(const_cast<void*>(f));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, std::size_t, cudaStream_t) {
  SPG_STUB_COUNT();
  launched();
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void*, void**) {
  SPG_STUB_COUNT();
  launched();
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  SPG_STUB_COUNT();
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 232448; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrL2CacheSize: *v = 50 * 1024 * 1024; break;
    default: *v = 1; break;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  SPG_STUB_COUNT();
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  SPG_STUB_COUNT();
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t) {
  SPG_STUB_COUNT();
  return "cudaErrorStub";
}
const char* cudaGetErrorString(cudaError_t) {
  SPG_STUB_COUNT();
  return "the host stub runtime";
}
cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** fn, unsigned, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  SPG_STUB_COUNT();
  *fn = reinterpret_cast<void*>(&encode_tensor_map);
  if (status != nullptr) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, std::size_t n) {
  SPG_STUB_COUNT();
  *p = allocate(n, cudaMemoryTypeDevice);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, std::size_t n, unsigned) {
  SPG_STUB_COUNT();
  *p = allocate(n, cudaMemoryTypeHost);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  SPG_STUB_COUNT();
  release(p);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  SPG_STUB_COUNT();
  release(p);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total) {
  SPG_STUB_COUNT();
  *free_bytes = std::size_t{64} << 30;
  *total = std::size_t{80} << 30;
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind) {
  SPG_STUB_COUNT();
  std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t) {
  SPG_STUB_COUNT();
  std::memmove(dst, src, n);
  launched();
  return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                         std::size_t height, cudaMemcpyKind) {
  SPG_STUB_COUNT();
  for (std::size_t r = 0; r < height; ++r) {
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, std::size_t n) {
  SPG_STUB_COUNT();
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t) {
  SPG_STUB_COUNT();
  std::memset(p, v, n);
  launched();
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  SPG_STUB_COUNT();
  std::memset(a, 0, sizeof *a);
  const auto* c = static_cast<const char*>(p);
  const std::lock_guard<std::mutex> lock(mutex);
  for (const Allocation& x : allocations) {
    if (c >= x.begin && c < x.begin + x.bytes + 1) {
      a->type = x.type;
      a->devicePointer = const_cast<void*>(p);
      a->hostPointer = x.type == cudaMemoryTypeHost ? const_cast<void*>(p) : nullptr;
      return cudaSuccess;
    }
  }
  a->type = cudaMemoryTypeUnregistered;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  SPG_STUB_COUNT();
  *s = reinterpret_cast<cudaStream_t>(new char[64]);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  SPG_STUB_COUNT();
  delete[] reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  SPG_STUB_COUNT();
  ++capturing;
  target = new FakeGraph;
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t, cudaGraph_t g, const cudaGraphNode_t*, const cudaGraphEdgeData*,
                                          std::size_t, cudaStreamCaptureMode) {
  SPG_STUB_COUNT();
  ++capturing;
  target = reinterpret_cast<FakeGraph*>(g);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
  SPG_STUB_COUNT();
  --capturing;
  *g = reinterpret_cast<cudaGraph_t>(target);
  target = nullptr;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  SPG_STUB_COUNT();
  *status = capturing > 0 ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  SPG_STUB_COUNT();
  *e = reinterpret_cast<cudaEvent_t>(new char[64]);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  SPG_STUB_COUNT();
  delete[] reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  SPG_STUB_COUNT();
  *ms = 0.001f;
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, std::size_t* count) {
  SPG_STUB_COUNT();
  const std::size_t n = reinterpret_cast<FakeGraph*>(g)->nodes;
  if (nodes != nullptr) {
    for (std::size_t i = 0; i < *count && i < n; ++i) nodes[i] = nullptr;
  }
  *count = n;
  return cudaSuccess;
}
cudaError_t cudaGraphCreate(cudaGraph_t* g, unsigned) {
  SPG_STUB_COUNT();
  *g = reinterpret_cast<cudaGraph_t>(new FakeGraph);
  return cudaSuccess;
}
cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle* h, cudaGraph_t, unsigned, unsigned) {
  SPG_STUB_COUNT();
  *h = ++handles;
  return cudaSuccess;
}
/// Kernel and conditional nodes (the step graph's): a conditional node gets `size` empty bodies,
/// which the graph owns, as the runtime's phGraph_out array does.
cudaError_t cudaGraphAddNode(cudaGraphNode_t* node, cudaGraph_t g, const cudaGraphNode_t*, const cudaGraphEdgeData*,
                             std::size_t, cudaGraphNodeParams* params) {
  SPG_STUB_COUNT();
  auto* graph = reinterpret_cast<FakeGraph*>(g);
  ++graph->nodes;
  *node = reinterpret_cast<cudaGraphNode_t>(graph->nodes);
  if (params->type == cudaGraphNodeTypeConditional) {
    std::vector<cudaGraph_t> bodies;
    for (unsigned i = 0; i < params->conditional.size; ++i) bodies.push_back(reinterpret_cast<cudaGraph_t>(new FakeGraph));
    graph->children.push_back(std::move(bodies));
    params->conditional.phGraph_out = graph->children.back().data();
  }
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  SPG_STUB_COUNT();
  delete reinterpret_cast<FakeGraph*>(g);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t, unsigned long long) {
  SPG_STUB_COUNT();
  *e = reinterpret_cast<cudaGraphExec_t>(new char[64]);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  SPG_STUB_COUNT();
  delete[] reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaGraphUpload(cudaGraphExec_t, cudaStream_t) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) {
  SPG_STUB_COUNT();
  return cudaSuccess;
}

}  // extern "C"
