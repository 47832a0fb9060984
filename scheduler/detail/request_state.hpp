// What the scheduler keeps per admitted request: progress and the blocks it holds per cache kind.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/request.hpp"

namespace spg::scheduler::detail {

struct RequestState {
  Request request;
  int prefilled{0};                               // tokens prefilled so far (the prefix)
  std::vector<std::vector<std::int32_t>> blocks;  // per cache kind: the block table, covers `prefilled`
  std::vector<int> footprint;                     // per cache kind: blocks of the whole prompt
};

}  // namespace spg::scheduler::detail
