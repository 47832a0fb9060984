// Sparse MLA arguments that carry shapes only, shared by the CPU tests of argument checking and
// the GPU tests of the launch plan.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"

namespace spg::test::mla {

/// Arguments whose pointers are aligned placeholders (never dereferenced), for the checks and plans
/// that look at shapes only; kv rows are 512 elements apart.
inline spg::kernels::SparseMlaArgs shape_only_args(int s_kv, int topk, int s_q, int h_q, int d_qk) {
  spg::kernels::SparseMlaArgs a{};
  a.q = reinterpret_cast<const __nv_bfloat16*>(std::uintptr_t{0x10000});
  a.kv = reinterpret_cast<const __nv_bfloat16*>(std::uintptr_t{0x20000});
  a.indices = reinterpret_cast<const std::int32_t*>(std::uintptr_t{0x30000});
  a.out = reinterpret_cast<__nv_bfloat16*>(std::uintptr_t{0x40000});
  a.max_logits = reinterpret_cast<float*>(std::uintptr_t{0x50000});
  a.lse = reinterpret_cast<float*>(std::uintptr_t{0x60000});
  a.kv_row_stride = 512;
  a.s_kv = s_kv;
  a.topk = topk;
  a.s_q = s_q;
  a.h_q = h_q;
  a.d_qk = d_qk;
  a.sm_scale = 0.04f;
  return a;
}

}  // namespace spg::test::mla
