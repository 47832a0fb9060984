// CUPTI-based allocation counting: see allocation_counter.hpp.
#include "spgraph/memory/allocation_counter.hpp"

#include <cupti.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "spgraph/core/error.hpp"

namespace spg::memory {

namespace {

std::atomic<std::uint64_t> g_count{0};
std::mutex g_names_mutex;
std::vector<std::string> g_names;

bool is_allocation_call(CUpti_CallbackDomain domain, const char* name) {
  if (name == nullptr) return false;
  auto starts = [&](const char* prefix) { return std::strncmp(name, prefix, std::strlen(prefix)) == 0; };
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    // Device, pinned, managed and async-pool memory; registering host memory (pins pages); pools;
    // graph memory nodes (allocations a graph makes when it runs).
    return starts("cudaMalloc") || starts("cudaFree") || starts("cudaHostAlloc") || starts("cudaHostRegister") ||
           starts("cudaHostUnregister") || starts("cudaMemPoolCreate") || starts("cudaMemPoolDestroy") ||
           starts("cudaGraphAddMemAllocNode") || starts("cudaGraphAddMemFreeNode");
  }
  // The driver beneath them, and virtual memory management (reserve, map).
  return starts("cuMemAlloc") || starts("cuMemFree") || starts("cuMemHostAlloc") || starts("cuMemCreate") ||
         starts("cuMemRelease") || starts("cuMemHostRegister") || starts("cuMemHostUnregister") ||
         starts("cuMemAddressReserve") || starts("cuMemAddressFree") || starts("cuMemMap") || starts("cuMemUnmap") ||
         starts("cuMemPoolCreate") || starts("cuMemPoolDestroy") || starts("cuGraphAddMemAllocNode") ||
         starts("cuGraphAddMemFreeNode");
}

void CUPTIAPI on_callback(void* /*user*/, CUpti_CallbackDomain /*domain*/, CUpti_CallbackId /*cbid*/,
                          const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER) return;
  g_count.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_names_mutex);
  if (g_names.size() < 16) {
    const std::string name = info->functionName != nullptr ? info->functionName : "?";
    for (const auto& n : g_names) {
      if (n == name) return;
    }
    g_names.push_back(name);
  }
}

void cupti_try(CUptiResult r, const char* call) {
  if (r != CUPTI_SUCCESS) {
    const char* text = nullptr;
    cuptiGetResultString(r, &text);
    throw Error(std::string("AllocationCounter: ") + call + " failed: " + (text != nullptr ? text : "?"));
  }
}

}  // namespace

AllocationCounter::AllocationCounter() { attach(); }

void AllocationCounter::detach() {
  if (subscriber_ == nullptr) return;
  cupti_try(cuptiUnsubscribe(static_cast<CUpti_SubscriberHandle>(subscriber_)), "cuptiUnsubscribe");
  subscriber_ = nullptr;
  cupti_try(cuptiFinalize(), "cuptiFinalize");
}

void AllocationCounter::attach() {
  if (subscriber_ != nullptr) return;
  CUpti_SubscriberHandle subscriber = nullptr;
  cupti_try(cuptiSubscribe(&subscriber, on_callback, nullptr), "cuptiSubscribe");
  subscriber_ = subscriber;
  watched_ = 0;
  watched_names_.clear();
  for (CUpti_CallbackDomain domain : {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API}) {
    const auto last = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? static_cast<CUpti_CallbackId>(CUPTI_RUNTIME_TRACE_CBID_SIZE)
                                                            : static_cast<CUpti_CallbackId>(CUPTI_DRIVER_TRACE_CBID_SIZE);
    for (CUpti_CallbackId cbid = 1; cbid < last; ++cbid) {
      const char* name = nullptr;
      if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS) continue;
      if (!is_allocation_call(domain, name)) continue;
      cupti_try(cuptiEnableCallback(1, subscriber, domain, cbid), "cuptiEnableCallback");
      ++watched_;
      watched_names_.emplace_back(name);
    }
  }
}

AllocationCounter& AllocationCounter::instance() {
  static AllocationCounter counter;
  return counter;
}

std::uint64_t AllocationCounter::count() const noexcept { return g_count.load(std::memory_order_relaxed); }

void AllocationCounter::reset() noexcept {
  g_count.store(0, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_names_mutex);
  g_names.clear();
}

std::vector<std::string> AllocationCounter::names() const {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  return g_names;
}

}  // namespace spg::memory
