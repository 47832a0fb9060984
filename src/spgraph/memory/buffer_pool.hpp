// BufferPool: spgraph's one static allocation, and typed views of its slots.
//
// The pool turns a PoolPlan into exactly one device allocation and one pinned-host allocation,
// then hands out views (cuda::std::span / mdspan) of named slots. A view of a sub-shape ("the
// first T rows of a [T_max, width] slot") is checked against the slot. Warm-up may carve late
// slots out of a headroom reserved up front; after seal() the pool refuses every new slot. It
// never reallocates and never frees before it is destroyed. See docs/memory.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cuda/std/array>
#include <cuda/std/mdspan>
#include <cuda/std/span>
#include <memory>
#include <new>
#include <string_view>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/memory/pool_plan.hpp"

namespace spg::memory {

/// Where a pool's bytes come from. `host_memory` backs both kinds with ordinary host memory; it
/// exists for CPU-only tests and planning tools and is never chosen implicitly.
enum class PoolBacking { cuda, host_memory };

template <class T, std::size_t Rank>
using View = cuda::std::mdspan<T, cuda::std::dextents<std::size_t, Rank>>;

/// @brief One device and one pinned-host allocation laid out by a PoolPlan.
class BufferPool {
 public:
  /// Allocates the plan plus `device_headroom` bytes for slots carved during warm-up.
  /// @throws CapacityError before allocating anything when the device has less free memory than
  ///         the plan needs; CudaError when an allocation fails.
  explicit BufferPool(PoolPlan plan, std::size_t device_headroom = 0, PoolBacking backing = PoolBacking::cuda);

  BufferPool(BufferPool&&) noexcept;
  BufferPool& operator=(BufferPool&&) noexcept;
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  ~BufferPool();

  [[nodiscard]] const PoolPlan& plan() const noexcept { return plan_; }

  /// Adds a device slot in the headroom (warm-up only).
  /// @throws StateError once sealed; CapacityError when the headroom cannot hold it (sizes that
  ///         would wrap included).
  const Slot& carve(SlotSpec spec);

  /// After this, carve() throws: nothing may grow once the graphs are captured.
  void seal() noexcept { sealed_ = true; }
  [[nodiscard]] bool sealed() const noexcept { return sealed_; }

  /// Raw bytes of a slot, checked: `bytes` may not exceed what the slot reserved.
  /// @throws InvalidArgument for an unknown slot; CapacityError naming the slot, requested and reserved bytes.
  [[nodiscard]] std::byte* bytes(std::string_view name, std::size_t bytes) const;

  /// The first `count` elements of a slot as a span (the whole slot when count is omitted).
  template <class T>
  [[nodiscard]] cuda::std::span<T> span(std::string_view name, std::size_t count) const {
    return {reinterpret_cast<T*>(typed_bytes(name, count, sizeof(T), alignof(T))), count};
  }
  template <class T>
  [[nodiscard]] cuda::std::span<T> span(std::string_view name) const {
    return span<T>(name, slot_bytes(name) / sizeof(T));
  }

  /// A row-major view of a leading sub-shape of a slot: view<bf16, 2>("q", {T, width}).
  /// @throws CapacityError when the extents hold more elements than the slot (or than SIZE_MAX).
  template <class T, std::size_t Rank>
  [[nodiscard]] View<T, Rank> view(std::string_view name, const std::array<std::size_t, Rank>& extents) const {
    std::size_t count = 1;
    bool overflow = false;
    cuda::std::array<std::size_t, Rank> dims{};
    for (std::size_t i = 0; i < Rank; ++i) {
      dims[i] = extents[i];
      overflow = __builtin_mul_overflow(count, extents[i], &count) || overflow;
    }
    // A product past SIZE_MAX would wrap to a small count and pass the slot's check.
    if (overflow) throw_extents_overflow(name, Rank);
    T* p = reinterpret_cast<T*>(typed_bytes(name, count, sizeof(T), alignof(T)));
    return View<T, Rank>(p, dims);
  }

  [[nodiscard]] std::size_t slot_bytes(std::string_view name) const { return plan_.slot(name).spec.bytes; }
  [[nodiscard]] std::size_t device_bytes() const noexcept { return device_.size(); }
  [[nodiscard]] std::size_t pinned_bytes() const noexcept { return pinned_.size(); }
  [[nodiscard]] std::size_t headroom_left() const noexcept { return device_capacity_ - device_used_; }
  /// CUDA allocation calls this pool made: 1 per non-empty memory kind, so at most 2, ever.
  [[nodiscard]] int allocation_calls() const noexcept { return allocation_calls_; }
  [[nodiscard]] PoolBacking backing() const noexcept { return backing_; }
  [[nodiscard]] std::byte* device_base() const noexcept { return static_cast<std::byte*>(device_.data()); }
  [[nodiscard]] std::byte* pinned_base() const noexcept { return static_cast<std::byte*>(pinned_.data()); }

 private:
  // Host-memory stand-in with the same shape as the CUDA owners.
  struct AlignedDelete {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{PoolPlan::kBaseAlignment}); }
  };
  struct HostBlock {
    std::unique_ptr<std::byte[], AlignedDelete> storage;
    std::size_t bytes{0};
    void* data() const noexcept { return storage.get(); }
    std::size_t size() const noexcept { return bytes; }
  };
  struct Region {
    core::DeviceBuffer cuda_device;
    core::PinnedBuffer cuda_pinned;
    HostBlock host;
    void* data() const noexcept;
    std::size_t size() const noexcept;
  };

  std::byte* typed_bytes(std::string_view name, std::size_t count, std::size_t elem, std::size_t align) const;
  [[noreturn]] void throw_extents_overflow(std::string_view name, std::size_t rank) const;

  PoolPlan plan_;
  PoolBacking backing_;
  Region device_;
  Region pinned_;
  std::size_t device_capacity_{0};
  std::size_t device_used_{0};
  int allocation_calls_{0};
  bool sealed_{false};
};

}  // namespace spg::memory
