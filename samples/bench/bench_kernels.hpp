// Table C of docs/benchmarks.md: the cache and index kernels alone (dequant-gather, insert,
// combine indices), plus the copy ceiling they are compared with.
#pragma once

#include <cuda_runtime_api.h>

#include "samples/bench/report.hpp"

namespace spg::bench {

/// @brief Measures table C and adds records of suite "kernels": dequant-gather GB/s at the large
///        workload (4 x 2048 new tokens, prefix 32768, C4A: compressed + window rows; bytes = FP8
///        rows read with their scale rows + bf16 rows written), insert GB/s, combine latency at the
///        tiny workload and GB/s at the large one. Adds the copy ceiling {suite "ceilings", name
///        "copy", metric "gbps"} first unless the reporter already holds one.
/// @throws CudaError when a CUDA call fails; InvalidArgument if an op refuses its arguments.
void run_kernel_benchmarks(Reporter& reporter, cudaStream_t stream);

}  // namespace spg::bench
