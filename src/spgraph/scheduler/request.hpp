// A prefill request as the scheduler sees it: an id, a prompt length and the step it arrives at.
#pragma once

#include <cstdint>

namespace spg::scheduler {

/// @brief One prompt to prefill. Ids are unique among the requests a scheduler holds.
struct Request {
  std::int64_t id{0};
  int prompt_len{0};            ///< tokens to prefill, 1 .. max_model_len
  std::int64_t arrival_step{0};  ///< first step that may schedule it
};

}  // namespace spg::scheduler
