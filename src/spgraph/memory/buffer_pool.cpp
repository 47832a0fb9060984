// BufferPool: see buffer_pool.hpp.
#include "spgraph/memory/buffer_pool.hpp"

#include <cuda_runtime_api.h>

#include <limits>
#include <string>

namespace spg::memory {

void* BufferPool::Region::data() const noexcept {
  if (cuda_device.data() != nullptr) return cuda_device.data();
  if (cuda_pinned.data() != nullptr) return cuda_pinned.data();
  return host.data();
}

std::size_t BufferPool::Region::size() const noexcept {
  return cuda_device.size() + cuda_pinned.size() + host.size();
}

BufferPool::BufferPool(PoolPlan plan, std::size_t device_headroom, PoolBacking backing)
    : plan_(std::move(plan)), backing_(backing) {
  const std::size_t planned = plan_.device_bytes();
  // The plan ends below SIZE_MAX / 2 (PoolPlan::add); so must the headroom on top of it.
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max() / 2;
  SPG_EXPECTS_AS(CapacityError, device_headroom <= kMax - planned,
                 "the buffer pool's headroom of " << device_headroom << " B on top of its " << planned
                                                  << " B plan does not fit a pool (at most " << kMax << " B)");
  device_capacity_ = planned + (device_headroom + PoolPlan::kBaseAlignment - 1) / PoolPlan::kBaseAlignment *
                                   PoolPlan::kBaseAlignment;
  device_used_ = planned;
  const std::size_t pinned = plan_.pinned_bytes();

  if (backing_ == PoolBacking::host_memory) {
    auto host_block = [](std::size_t n) {
      auto* p = static_cast<std::byte*>(::operator new[](n, std::align_val_t{PoolPlan::kBaseAlignment}));
      return HostBlock{std::unique_ptr<std::byte[], AlignedDelete>(p), n};
    };
    if (device_capacity_ > 0) {
      device_.host = host_block(device_capacity_);
      ++allocation_calls_;
    }
    if (pinned > 0) {
      pinned_.host = host_block(pinned);
      ++allocation_calls_;
    }
    return;
  }

  // Refuse before allocating: the user learns what the plan needs, not a bare cudaErrorMemoryAllocation.
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  SPG_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  SPG_EXPECTS_AS(CapacityError, device_capacity_ <= free_bytes,
                 "the buffer pool needs " << device_capacity_ << " B (" << format_bytes(device_capacity_)
                                          << ") of device memory but only " << free_bytes << " B ("
                                          << format_bytes(free_bytes) << ") of " << format_bytes(total_bytes)
                                          << " are free; reduce max_tokens, max_requests, max_model_len or "
                                             "the cache blocks");
  if (device_capacity_ > 0) {
    device_.cuda_device = core::DeviceBuffer(device_capacity_);
    ++allocation_calls_;
  }
  if (pinned > 0) {
    pinned_.cuda_pinned = core::PinnedBuffer(pinned);
    ++allocation_calls_;
  }
}

BufferPool::BufferPool(BufferPool&&) noexcept = default;
BufferPool& BufferPool::operator=(BufferPool&&) noexcept = default;
BufferPool::~BufferPool() = default;

const Slot& BufferPool::carve(SlotSpec spec) {
  SPG_EXPECTS_AS(StateError, !sealed_,
                 "the buffer pool is sealed: slot '" << spec.name << "' (" << spec.bytes
                                                     << " B) cannot be added after warm-up");
  SPG_EXPECTS_AS(StateError, spec.kind == MemoryKind::device,
                 "slot '" << spec.name << "': only device slots can be carved from the headroom");
  SPG_EXPECTS_AS(CapacityError, spec.bytes <= device_capacity_ - device_used_,
                 "slot '" << spec.name << "' needs " << spec.bytes << " B but the pool's headroom has "
                          << (device_capacity_ - device_used_) << " B left of " << (device_capacity_ - plan_.device_bytes())
                          << " reserved");
  PoolPlan trial = plan_;
  const Slot& placed = trial.add(spec);  // no wrap: add() keeps the plan below SIZE_MAX / 2
  const std::size_t end = placed.offset + placed.spec.bytes;
  SPG_EXPECTS_AS(CapacityError, end <= device_capacity_,
                 "slot '" << spec.name << "' needs " << spec.bytes << " B but the pool's headroom has "
                          << (device_capacity_ - device_used_) << " B left of " << (device_capacity_ - plan_.device_bytes())
                          << " reserved");
  plan_ = std::move(trial);
  device_used_ = end;
  return *plan_.find(spec.name);
}

std::byte* BufferPool::bytes(std::string_view name, std::size_t requested) const {
  const Slot& s = plan_.slot(name);
  SPG_EXPECTS_AS(CapacityError, requested <= s.spec.bytes,
                 "slot '" << name << "': requested " << requested << " B but it reserved " << s.spec.bytes
                          << " B (shape " << (s.spec.shape.empty() ? "?" : s.spec.shape) << ")");
  std::byte* base = s.spec.kind == MemoryKind::device ? device_base() : pinned_base();
  return base + s.offset;
}

std::byte* BufferPool::typed_bytes(std::string_view name, std::size_t count, std::size_t elem,
                                   std::size_t align) const {
  const Slot& s = plan_.slot(name);
  SPG_EXPECTS(s.spec.alignment % align == 0,
              "slot '" << name << "' is aligned to " << s.spec.alignment << " B, less than the element's " << align);
  SPG_EXPECTS_AS(CapacityError, count <= s.spec.bytes / elem,
                 "slot '" << name << "': requested " << count << " elements ("
                          << (count <= std::numeric_limits<std::size_t>::max() / elem ? std::to_string(count * elem)
                                                                                       : std::string("more than 2^64"))
                          << " B) but it reserved " << s.spec.bytes << " B (shape "
                          << (s.spec.shape.empty() ? "?" : s.spec.shape) << ")");
  return bytes(name, count * elem);
}

void BufferPool::throw_extents_overflow(std::string_view name, std::size_t rank) const {
  const Slot& s = plan_.slot(name);
  ::spg::detail::throw_expects<CapacityError>(
      "product of the extents <= SIZE_MAX",
      (::spg::detail::MessageBuilder{} << "slot '" << name << "': the " << rank
                                << " extents requested hold more than 2^64 elements; it reserved " << s.spec.bytes
                                << " B (shape " << (s.spec.shape.empty() ? "?" : s.spec.shape) << ")")
          .str(),
      __FILE__, __LINE__);
}

}  // namespace spg::memory
