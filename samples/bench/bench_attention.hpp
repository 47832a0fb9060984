// Table A of docs/benchmarks.md: the sparse MLA attention kernel alone, on the shapes of the
// public sparse prefill benchmark (s_q 4096, attn_sink on) and on small chunks.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "samples/bench/report.hpp"

namespace spg::bench {

/// @brief Times every row of table A (a subset when `quick`) and records, per row, suite
///        "attention", name "<label>/<s_kv>" (e.g. "V4-C2/32768"), variant "spgraph" (the
///        automatic path), "spgraph-single-pass-mma" (the mma.sync single pass) and, on small
///        chunks, "spgraph-single-pass" (wgmma) and "spgraph-split-topk"; metrics "tflops" and
///        "gpu_us" (medians) and "kernel", the kernels::SparseMlaKernel value of the plan that ran
///        (0 wgmma single pass, 1 mma.sync single pass, 2 mma.sync split top-k; the table prints
///        its name). FLOPs = 2 * (valid indices) * h_q * (d_qk + 512); inputs are seeded random
///        values, indices random valid rows.
/// @throws CudaError / InvalidArgument from the device or the op.
/// `only`, when not empty, keeps the rows whose record name (e.g. "V4-C2/32768",
/// "small-h128-k1152/8192/sq256") contains it.
void run_attention_benchmarks(Reporter& reporter, cudaStream_t stream, bool quick, const std::string& only = "",
                              bool burst = false);

}  // namespace spg::bench
