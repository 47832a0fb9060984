// BlockAllocator: the free list of one paged cache's physical blocks.
//
// One allocator serves one cache kind (the SWA cache, or the compressed cache of one ratio); all
// layers of that kind share its block ids, each layer holding its own physical cache of the same
// geometry. Every operation is O(1) per block. Misuse (releasing a block twice, or an id the pool
// never had) is a set-up-tier error and throws; running out is an expected outcome that
// try_allocate reports without throwing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace spg::scheduler {

/// @brief A fixed pool of physical block ids [0, total()) with an O(1) free list.
///
/// Invariants: a block is never handed out twice before it is released, and
/// in_use() + free() == total() after every call, including one that throws.
class BlockAllocator {
 public:
  /// @throws InvalidArgument when num_blocks is negative.
  explicit BlockAllocator(int num_blocks);

  /// One block; fresh pools hand out 0, 1, 2, ... and released blocks are reused first.
  /// @throws CapacityError when no block is free.
  [[nodiscard]] std::int32_t allocate();

  /// All-or-nothing: appends `count` blocks to `out` and returns true, or returns false and
  /// changes nothing when fewer than `count` are free.
  /// @throws InvalidArgument when count is negative.
  [[nodiscard]] bool try_allocate(int count, std::vector<std::int32_t>& out);

  /// Returns a block to the pool.
  /// @throws InvalidArgument naming the id for an id outside [0, total()) or a block not in use.
  void release(std::int32_t block);

  /// Returns every block of `blocks`; checks them all first, so on a throw nothing is released.
  /// @throws InvalidArgument for a foreign id, a block not in use, or an id listed twice.
  void release(std::span<const std::int32_t> blocks);

  [[nodiscard]] int total() const noexcept { return static_cast<int>(in_use_flags_.size()); }
  [[nodiscard]] int free() const noexcept { return static_cast<int>(free_list_.size()); }
  [[nodiscard]] int in_use() const noexcept { return total() - free(); }
  /// Whether `block` is a valid id that is currently handed out.
  [[nodiscard]] bool is_in_use(std::int32_t block) const noexcept;

 private:
  void check_releasable(std::int32_t block) const;

  std::vector<std::int32_t> free_list_;     // a stack: the top is handed out next
  std::vector<std::uint8_t> in_use_flags_;  // per block: 1 while handed out
};

}  // namespace spg::scheduler
