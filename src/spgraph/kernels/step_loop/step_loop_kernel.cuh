// Step loop device code: see step_loop.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "spgraph/kernels/stage_in/stage_in_kernel.cuh"
#include "spgraph/kernels/step_loop/step_loop.hpp"

namespace spg::kernels::detail {

using W = StepStateWords;

inline constexpr int kStepCopyThreads = 256;
inline constexpr int kStepCopyUnroll = 4;  // vectors a thread loads before it stores any

/// Copies `vectors` 16-byte vectors with the whole grid, kStepCopyUnroll loads in flight a thread.
__device__ __forceinline__ void grid_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, std::int64_t vectors) {
  const std::int64_t threads = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t base = 0; base < vectors; base += threads * kStepCopyUnroll) {
    uint4 v[kStepCopyUnroll];
#pragma unroll
    for (int k = 0; k < kStepCopyUnroll; ++k) {
      const std::int64_t i = base + k * threads + tid;
      if (i < vectors) v[k] = src[i];
    }
#pragma unroll
    for (int k = 0; k < kStepCopyUnroll; ++k) {
      const std::int64_t i = base + k * threads + tid;
      if (i < vectors) dst[i] = v[k];
    }
  }
}

/// The start of a step's loops, by one thread, over the header in `state` (count chunks, the
/// first `fast` of them in the first loop): the previous step's faults folded, the loop's position
/// reset, and each loop opened when it has chunks to run.
__device__ __forceinline__ void open_step_loops(std::int32_t* state, StatusBlock* status, int count, int fast,
                                                const StepConditionals& c) {
  fold_step_faults(status);
  state[W::next] = 0;
  state[W::current] = 0;
  state[W::arrived] = 0;
  if (c.set) {
    cudaGraphSetConditional(c.fast_loop, fast > 0 ? 1U : 0U);
    cudaGraphSetConditional(c.loop, count > fast ? 1U : 0U);
  }
}

__global__ void __launch_bounds__(kStepCopyThreads)
    step_head_kernel(const std::int32_t* __restrict__ staging, std::int32_t* __restrict__ state, StatusBlock* status,
                     const uint4* __restrict__ chunks, uint4* __restrict__ step_meta, int vectors,
                     StepConditionals c) {
  if (staging == nullptr) {
    // A staged step run again (Executor::run_staged): the state and the step blocks still hold it,
    // from the launch that loaded it. Only the loop's position is reset. One thread.
    if (blockIdx.x == 0 && threadIdx.x == 0) open_step_loops(state, status, state[W::count], state[W::fast], c);
    return;
  }
  // The host checked the count against max_chunks: staging holds what it wrote. One read over the
  // bus a CTA.
  __shared__ int s_count;
  if (threadIdx.x == 0) s_count = staging[W::count];
  __syncthreads();
  const int count = s_count;
  if (blockIdx.x == 0) {
    for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {
      state[W::buckets + i] = staging[W::buckets + i];
    }
    if (threadIdx.x == 0) {
      const int fast = staging[W::fast];
      state[W::count] = count;
      state[W::fast] = fast;
      open_step_loops(state, status, count, fast, c);
    }
  }
  grid_copy(chunks, step_meta, static_cast<std::int64_t>(count) * vectors);
}

/// kFast: the first loop's next (its chunks all run the largest bucket's body: no select).
template <bool kFast>
__global__ void __launch_bounds__(kStepCopyThreads)
    step_next_kernel(const uint4* __restrict__ step_meta, std::int32_t* state, uint4* __restrict__ meta, int vectors,
                     StepConditionals c) {
  // Every CTA reads the index before it arrives; the last CTA to arrive advances it, so no CTA can
  // read an advanced index.
  const int i = state[W::next];
  grid_copy(step_meta + static_cast<std::int64_t>(i) * vectors, meta, vectors);
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&state[W::arrived], 1) != static_cast<int>(gridDim.x) - 1) return;
  state[W::arrived] = 0;
  state[W::current] = i;
  state[W::next] = i + 1;
  if (c.set) {
    if constexpr (kFast) {
      cudaGraphSetConditional(c.fast_loop, i + 1 < state[W::fast] ? 1U : 0U);
    } else {
      cudaGraphSetConditional(c.select, static_cast<unsigned>(state[W::buckets + i]));
      cudaGraphSetConditional(c.loop, i + 1 < state[W::count] ? 1U : 0U);
    }
  }
}

/// After the loop: the whole step has run, so its staging block (and its graph) is free again.
__global__ void step_tail_kernel(StagingRelease release) { release_staging(release, staging_sequence(release), true); }

}  // namespace spg::kernels::detail
