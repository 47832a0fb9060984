// Table A of docs/benchmarks.md: the sparse MLA attention kernel alone, on the shapes of the
// public sparse prefill benchmark (s_q 4096, attn_sink on) and on small chunks.
#pragma once

#include <cuda_runtime_api.h>

#include "samples/bench/report.hpp"

namespace spg::bench {

/// @brief Times every row of table A (a subset when `quick`) and records, per row, suite
///        "attention", name "<label>/<s_kv>" (e.g. "V4-C2/32768"), variant "spgraph", metrics
///        "tflops" and "gpu_us" (medians). FLOPs = 2 * (valid indices) * h_q * (d_qk + 512);
///        inputs are seeded random values, indices random valid rows.
/// @throws CudaError / InvalidArgument from the device or the op.
void run_attention_benchmarks(Reporter& reporter, cudaStream_t stream, bool quick);

}  // namespace spg::bench
