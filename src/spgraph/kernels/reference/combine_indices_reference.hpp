// CPU reference of stage 3 (combine indices), written from docs/pipeline.md ("Stages of one
// chunk", stage 3) plus the fault rules of CombineIndicesArgs. The GPU kernel must match it
// exactly on every entry below lens[t].
#pragma once

#include <cstdint>

#include "spgraph/kernels/reference/kv_cache_reference.hpp"

namespace spg::kernels::reference {

/// @brief Stage 3: writes lens[t] for every t < tokens_bucket and combined[t, 0 : lens[t]].
///        `topk_indices` [tokens_bucket, top_k] may be null when compress_ratio = 1.
void combine_indices(const std::int32_t* topk_indices, int top_k, int compress_ratio, int window,
                     const HostChunk& chunk, int tokens_bucket, int requests_bucket, std::int32_t* combined,
                     int combined_width, std::int32_t* lens, FaultLog& log);

}  // namespace spg::kernels::reference
