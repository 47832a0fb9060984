// PoolPlan: the counting pass that lays out spgraph's static buffer pool.
//
// A plan is a list of named slots, each with its bytes, alignment and memory kind, and the offset
// the counting pass gave it. Plans hold offsets, never pointers: BufferPool turns a plan into one
// device and one pinned-host allocation. Layout rules: docs/memory.md.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace spg::memory {

enum class MemoryKind { device, pinned_host };

/// @brief What a slot needs: a unique name, its bytes, its alignment and where it lives.
struct SlotSpec {
  std::string name;
  std::size_t bytes{0};
  std::size_t alignment{256};
  MemoryKind kind{MemoryKind::device};
  std::string shape;  ///< human-readable, e.g. "[4, 8320, 512] bf16"; printed in the plan table
};

/// @brief A slot placed by the counting pass.
struct Slot {
  SlotSpec spec;
  std::size_t offset{0};
};

/// @brief Lays slots out one after another per memory kind, each at its alignment.
class PoolPlan {
 public:
  /// Places a slot after the previous slot of the same kind.
  /// @throws InvalidArgument for an empty or duplicate name, zero bytes, or an alignment that is
  ///         not a power of two between 1 and 4096; CapacityError when the plan's end would pass
  ///         SIZE_MAX / 2 (a size that wrapped or that no machine holds).
  const Slot& add(SlotSpec spec);

  /// @throws InvalidArgument naming the slot when the plan has none of that name.
  [[nodiscard]] const Slot& slot(std::string_view name) const;
  [[nodiscard]] const Slot* find(std::string_view name) const noexcept;
  [[nodiscard]] const std::vector<Slot>& slots() const noexcept { return slots_; }

  /// Total bytes of each kind, the tail padded to the pool's base alignment.
  [[nodiscard]] std::size_t bytes(MemoryKind kind) const noexcept;
  [[nodiscard]] std::size_t device_bytes() const noexcept { return bytes(MemoryKind::device); }
  [[nodiscard]] std::size_t pinned_bytes() const noexcept { return bytes(MemoryKind::pinned_host); }

  /// The plan as an aligned text table: slot, kind, shape, bytes, offset; then the totals.
  [[nodiscard]] std::string table() const;

  /// Every slot's offset is a multiple of this; allocations are at least this aligned.
  static constexpr std::size_t kBaseAlignment = 4096;

 private:
  std::vector<Slot> slots_;
  std::size_t end_[2]{0, 0};  // per MemoryKind: first free byte
};

/// "1.50 GiB", "12.0 KiB", "512 B".
[[nodiscard]] std::string format_bytes(std::size_t bytes);

}  // namespace spg::memory
