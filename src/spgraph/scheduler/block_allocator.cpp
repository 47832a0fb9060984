// The free list of one paged cache: see block_allocator.hpp.
#include "spgraph/scheduler/block_allocator.hpp"

#include "spgraph/core/error.hpp"

namespace spg::scheduler {

BlockAllocator::BlockAllocator(int num_blocks) {
  SPG_EXPECTS(num_blocks >= 0, "num_blocks = " << num_blocks << " must be at least 0");
  in_use_flags_.assign(static_cast<std::size_t>(num_blocks), 0);
  free_list_.reserve(static_cast<std::size_t>(num_blocks));
  // Pushed in reverse so that a fresh pool hands out ascending ids, which keeps traces readable.
  for (int b = num_blocks - 1; b >= 0; --b) {
    free_list_.push_back(b);
  }
}

std::int32_t BlockAllocator::allocate() {
  SPG_EXPECTS_AS(CapacityError, !free_list_.empty(), "no free block: all " << total() << " blocks are in use");
  const std::int32_t block = free_list_.back();
  free_list_.pop_back();
  in_use_flags_[static_cast<std::size_t>(block)] = 1;
  return block;
}

bool BlockAllocator::try_allocate(int count, std::vector<std::int32_t>& out) {
  SPG_EXPECTS(count >= 0, "count = " << count << " must be at least 0");
  if (count > free()) {
    return false;
  }
  out.reserve(out.size() + static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    out.push_back(allocate());
  }
  return true;
}

bool BlockAllocator::is_in_use(std::int32_t block) const noexcept {
  return block >= 0 && block < total() && in_use_flags_[static_cast<std::size_t>(block)] != 0;
}

void BlockAllocator::check_releasable(std::int32_t block) const {
  SPG_EXPECTS(block >= 0 && block < total(),
              "block id " << block << " is not from this pool: ids are in [0, " << total() << ")");
  SPG_EXPECTS(in_use_flags_[static_cast<std::size_t>(block)] != 0,
              "block " << block << " is not in use: released twice or never allocated");
}

void BlockAllocator::release(std::int32_t block) {
  check_releasable(block);
  in_use_flags_[static_cast<std::size_t>(block)] = 0;
  free_list_.push_back(block);
}

void BlockAllocator::release(std::span<const std::int32_t> blocks) {
  // Validate everything before touching the pool; a flag of 2 marks "listed in this call" so a
  // duplicate inside `blocks` is caught as a double release.
  std::size_t checked = 0;
  try {
    for (; checked < blocks.size(); ++checked) {
      check_releasable(blocks[checked]);
      SPG_EXPECTS(in_use_flags_[static_cast<std::size_t>(blocks[checked])] == 1,
                  "block " << blocks[checked] << " is listed twice in one release");
      in_use_flags_[static_cast<std::size_t>(blocks[checked])] = 2;
    }
  } catch (...) {
    for (std::size_t i = 0; i < checked; ++i) {
      in_use_flags_[static_cast<std::size_t>(blocks[i])] = 1;
    }
    throw;
  }
  for (const std::int32_t block : blocks) {
    in_use_flags_[static_cast<std::size_t>(block)] = 0;
    free_list_.push_back(block);
  }
}

}  // namespace spg::scheduler
