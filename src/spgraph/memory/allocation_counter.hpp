// AllocationCounter: counts every CUDA allocation and free call in the process, through CUPTI.
//
// This is how spgraph proves its central promise: after warm-up, a step makes no allocation.
// It subscribes to the runtime and driver API callbacks whose names allocate or free device,
// host-pinned, managed, async-pool or virtual memory, pin host memory, make memory pools or add
// graph memory nodes (cudaMalloc*, cudaHostAlloc, cudaFree*, cudaHostRegister/Unregister,
// cudaMemPoolCreate/Destroy, cudaGraphAddMemAlloc/FreeNode; cuMemAlloc*, cuMemHostAlloc, cuMemFree*,
// cuMemCreate, cuMemRelease, cuMemHostRegister/Unregister, cuMemAddressReserve/Free, cuMemMap,
// cuMemUnmap, cuMemPoolCreate/Destroy, cuGraphAddMemAlloc/FreeNode), and nothing else, so the
// other API calls stay cheap. A runtime call counts once for the runtime and again for the
// driver call beneath it: `count()` is the sum, and any non-zero count is a failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spg::memory {

class AllocationCounter {
 public:
  /// The process-wide counter (CUPTI allows one subscriber); subscribes on first use.
  /// @throws Error when CUPTI cannot subscribe (another tool already holds the subscription).
  static AllocationCounter& instance();

  /// Calls counted since the last reset().
  [[nodiscard]] std::uint64_t count() const noexcept;
  void reset() noexcept;
  /// Names of the API functions counted since the last reset (first 16 distinct).
  [[nodiscard]] std::vector<std::string> names() const;
  /// How many API callbacks the counter watches (for the report).
  [[nodiscard]] int watched_callbacks() const noexcept { return watched_; }
  /// Their API names, as CUPTI gives them (cuMemHostRegister_v2, cudaMallocAsync, ...).
  [[nodiscard]] const std::vector<std::string>& watched_names() const noexcept { return watched_names_; }

  /// Detaches CUPTI from the process (unsubscribe, then cuptiFinalize) and attaches it again.
  /// While a CUPTI subscriber exists the driver leaves its fast graph-launch path (cudaGraphLaunch
  /// then costs about 0.2 us a node instead of ~2 us a graph: docs/benchmarks.md), so host-time
  /// measurements detach first. Counts made while detached are lost; count() keeps its value.
  /// @throws Error when CUPTI refuses.
  void detach();
  void attach();
  [[nodiscard]] bool attached() const noexcept { return subscriber_ != nullptr; }

  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

 private:
  AllocationCounter();
  void* subscriber_{nullptr};  // CUpti_SubscriberHandle
  int watched_{0};
  std::vector<std::string> watched_names_;
};

}  // namespace spg::memory
