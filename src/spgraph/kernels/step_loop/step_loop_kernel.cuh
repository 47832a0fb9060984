// Step loop device code: see step_loop.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "spgraph/kernels/stage_in/stage_in_kernel.cuh"
#include "spgraph/kernels/step_loop/step_loop.hpp"

namespace spg::kernels::detail {

using W = StepStateWords;

__global__ void step_head_kernel(const std::int32_t* __restrict__ staging, std::int32_t* __restrict__ state,
                                 StatusBlock* status, StepConditionals c) {
  // The host checked the count against max_chunks: staging holds what it wrote.
  const int count = staging[W::count];
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {
    state[W::buckets + i] = staging[W::buckets + i];
  }
  if (threadIdx.x == 0) {
    fold_step_faults(status);
    state[W::count] = count;
    state[W::next] = 0;
    state[W::current] = 0;
    if (c.set) cudaGraphSetConditional(c.loop, count > 0 ? 1U : 0U);
  }
}

__global__ void step_next_kernel(std::int32_t* __restrict__ state, StepConditionals c) {
  const int i = state[W::next];
  state[W::current] = i;
  state[W::next] = i + 1;
  if (c.set) {
    cudaGraphSetConditional(c.select, static_cast<unsigned>(state[W::buckets + i]));
    cudaGraphSetConditional(c.loop, i + 1 < state[W::count] ? 1U : 0U);
  }
}

__global__ void chunk_stage_in_kernel(const uint4* __restrict__ chunks, const std::int32_t* __restrict__ state,
                                      uint4* __restrict__ meta, int vectors) {
  const uint4* src = chunks + static_cast<std::int64_t>(state[W::current]) * vectors;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < vectors;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    meta[i] = src[i];
  }
}

/// After the loop: the whole step has run, so its staging block (and its graph) is free again.
__global__ void step_tail_kernel(StagingRelease release) { release_staging(release, staging_sequence(release), true); }

}  // namespace spg::kernels::detail
