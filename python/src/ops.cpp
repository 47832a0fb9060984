// The ops of the Python package: see ops.hpp.
#include "ops.hpp"

#include <cuda_runtime_api.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "array_arg.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::python {

namespace {

using kernels::StepStatus;
using OptArray = std::optional<Array>;

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
/// int32 words of the StepStatus block a `status` array receives.
constexpr int kStatusWords = static_cast<int>(sizeof(StepStatus) / sizeof(std::int32_t));
/// Combined index rows are padded to this many entries (docs/pipeline.md, stage 3).
constexpr int kCombinedAlignment = 128;

cudaStream_t as_stream(std::uintptr_t handle) noexcept { return reinterpret_cast<cudaStream_t>(handle); }

void check_launch(cudaError_t e, const char* op) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    std::ostringstream os;
    os << op << ": the launch failed with " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
    throw CudaError(e, os.str());
  }
}

/// The optional `status` array: int32 [10], the op's StepStatus block (fault counts), or null.
StepStatus* status_arg(const OptArray& status, const ArrayArg& ref) {
  if (!status) return nullptr;
  const ArrayArg s("status", *status);
  s.expect_dtype(Dtype::int32)
      .expect_ndim({1}, "[10] int32 (the op's StepStatus block)")
      .expect_dim(0, kStatusWords, "int32 words of a StepStatus")
      .expect_contiguous()
      .expect_same_device(ref);
  return static_cast<StepStatus*>(s.data());
}

/// A cache in the V4 layout: uint8, blocks block_stride(block_size) bytes apart (docs/pipeline.md,
/// "FP8 paged KV cache"). Either flat bytes [num_blocks * stride] or [num_blocks, ...] with the
/// block's bytes contiguous and at least block_size * 584 of them.
kernels::CacheLayout cache_layout(const ArrayArg& cache, std::int64_t block_size_arg) {
  cache.expect_dtype(Dtype::uint8);
  const int block_size = checked_int("block_size", block_size_arg, 1, 1 << 16);
  const std::int64_t stride = kernels::CacheLayout::make(block_size, 1).block_stride;
  const std::int64_t used = std::int64_t{block_size} * (kernels::kKvRowBytes + kernels::kKvScaleBytes);
  std::int64_t blocks = 0;
  if (cache.ndim() == 1) {
    cache.expect_unit_last_stride();
    if (cache.shape(0) % stride != 0) {
      std::ostringstream os;
      os << cache.name() << ".shape = " << cache.shape_str() << " (flat bytes) must be a multiple of the block stride "
         << stride << " for block_size = " << block_size;
      throw nb::value_error(os.str().c_str());
    }
    blocks = cache.shape(0) / stride;
  } else if (cache.ndim() >= 2) {
    blocks = cache.shape(0);
    std::int64_t inner = 1;
    std::int64_t want = 1;
    for (int i = cache.ndim() - 1; i >= 1; --i) {
      if (cache.shape(i) != 1 && cache.stride(i) != want) {
        throw nb::value_error((std::string(cache.name()) + ": the bytes of one block must be contiguous; shape " +
                               cache.shape_str() + " has strides " + cache.strides_str())
                                  .c_str());
      }
      want *= cache.shape(i);
      inner *= cache.shape(i);
    }
    if (blocks > 1 && cache.stride(0) != stride) {
      std::ostringstream os;
      os << cache.name() << ".stride(0) = " << cache.stride(0) << " bytes must be the V4 block stride "
         << "round_up(block_size * 584, 576) = " << stride << " for block_size = " << block_size;
      throw nb::value_error(os.str().c_str());
    }
    if (inner < used || inner > stride) {
      std::ostringstream os;
      os << cache.name() << ": a block holds " << inner << " bytes (shape " << cache.shape_str()
         << ") but must hold block_size * 584 = " << used << " to " << stride << " (the block stride)";
      throw nb::value_error(os.str().c_str());
    }
  } else {
    throw nb::value_error((std::string(cache.name()) + ".shape = " + cache.shape_str() +
                           " must be [num_blocks, ...] or flat bytes [num_blocks * block_stride]")
                              .c_str());
  }
  const int num_blocks = checked_int("number of cache blocks", blocks, 1, kInt32Max);
  return kernels::CacheLayout{block_size, num_blocks, stride};
}

/// M or N of the combine: a Python int (by value), a one-element int32 CUDA array (read by the
/// kernel, so nothing is read on the host) or a one-element integer CPU array (read here).
kernels::ScalarArg scalar_arg(const char* name, nb::handle h, const ArrayArg& ref) {
  kernels::ScalarArg s{};
  if (is_array(h)) {
    const ArrayArg a(name, import_array<>(h, name));
    if (a.numel() != 1) {
      throw nb::value_error((std::string(name) + ".shape = " + a.shape_str() + " must hold one element").c_str());
    }
    if (is_host(a)) {
      const nb::dlpack::dtype d = a.dtype();
      if (d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) && d.bits == 32) {
        s.value = checked_int(name, *static_cast<const std::int32_t*>(a.data()), 0, kInt32Max);
      } else if (d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) && d.bits == 64) {
        s.value = checked_int(name, *static_cast<const std::int64_t*>(a.data()), 0, kInt32Max);
      } else {
        throw nb::type_error(
            (std::string(name) + ".dtype = " + dtype_name(d) + " must be int32 or int64 (a host scalar)").c_str());
      }
      return s;
    }
    a.expect_dtype(Dtype::int32).expect_same_device(ref);
    s.device = static_cast<const std::int32_t*>(a.data());
    return s;
  }
  if (PyIndex_Check(h.ptr()) != 0) {
    const Py_ssize_t v = PyNumber_AsSsize_t(h.ptr(), nullptr);
    if (v == -1 && PyErr_Occurred() != nullptr) throw nb::python_error();
    s.value = checked_int(name, v, 0, kInt32Max);
    return s;
  }
  throw nb::type_error((std::string(name) + " must be an int or a one-element int32 device tensor, not " +
                        nb::type_name(h.type()).c_str())
                           .c_str());
}

void sparse_mla_fwd(Array q_in, Array kv_in, Array indices_in, double sm_scale,
                    std::int64_t d_v, OptArray attn_sink_in, OptArray topk_length_in, Array out_in,
                    Array max_logits_in, Array lse_in, nb::handle workspace_in, std::uintptr_t stream) {
  const ArrayArg q("q", q_in);
  q.expect_dtype(Dtype::bfloat16).expect_ndim({3}, "[s_q, h_q, d_qk]").expect_contiguous();
  const std::int64_t s_q = q.shape(0);
  const std::int64_t h_q = q.shape(1);
  const std::int64_t d_qk = q.shape(2);
  const ArrayArg kv("kv", kv_in);
  kv.expect_dtype(Dtype::bfloat16).expect_ndim({2, 3}, "[s_kv, 1, d_qk] (or [s_kv, d_qk])");
  if (kv.ndim() == 3) kv.expect_dim(1, 1, "one kv head (MQA)");
  kv.expect_dim(-1, d_qk, "d_qk, the last dim of q").expect_unit_last_stride().expect_same_device(q);
  const ArrayArg indices("indices", indices_in);
  indices.expect_dtype(Dtype::int32).expect_ndim({2, 3}, "[s_q, 1, topk] (or [s_q, topk])");
  indices.expect_dim(0, s_q, "s_q, the first dim of q");
  if (indices.ndim() == 3) indices.expect_dim(1, 1, "one kv head (MQA)");
  indices.expect_contiguous().expect_same_device(q);
  if (d_v != kernels::kSparseMlaDv) {
    throw nb::value_error(("d_v = " + std::to_string(d_v) + " must be 512").c_str());
  }
  const float* attn_sink = nullptr;
  if (attn_sink_in) {
    const ArrayArg sink("attn_sink", *attn_sink_in);
    sink.expect_dtype(Dtype::float32).expect_ndim({1}, "[h_q]").expect_dim(0, h_q, "h_q, q.shape[1]");
    sink.expect_contiguous().expect_same_device(q);
    attn_sink = static_cast<const float*>(sink.data());
  }
  const std::int32_t* topk_length = nullptr;
  if (topk_length_in) {
    const ArrayArg len("topk_length", *topk_length_in);
    len.expect_dtype(Dtype::int32).expect_ndim({1}, "[s_q]").expect_dim(0, s_q, "s_q, q.shape[0]");
    len.expect_contiguous().expect_same_device(q);
    topk_length = static_cast<const std::int32_t*>(len.data());
  }
  const ArrayArg out("out", out_in);
  out.expect_dtype(Dtype::bfloat16).expect_ndim({3}, "[s_q, h_q, 512]");
  out.expect_dim(0, s_q, "s_q").expect_dim(1, h_q, "h_q").expect_dim(2, d_v, "d_v");
  out.expect_contiguous().expect_same_device(q);
  const ArrayArg max_logits("max_logits", max_logits_in);
  max_logits.expect_dtype(Dtype::float32).expect_ndim({2}, "[s_q, h_q]");
  max_logits.expect_dim(0, s_q, "s_q").expect_dim(1, h_q, "h_q").expect_contiguous().expect_same_device(q);
  const ArrayArg lse("lse", lse_in);
  lse.expect_dtype(Dtype::float32).expect_ndim({2}, "[s_q, h_q]");
  lse.expect_dim(0, s_q, "s_q").expect_dim(1, h_q, "h_q").expect_contiguous().expect_same_device(q);
  // workspace: None, a uint8 array, or a callable nbytes -> array called only when the plan needs one.
  auto check_workspace = [&](const ArrayArg& w) {
    w.expect_dtype(Dtype::uint8).expect_ndim({1}, "[bytes] uint8").expect_contiguous().expect_same_device(q);
  };
  std::optional<ArrayArg> workspace;
  const bool allocator = !workspace_in.is_none() && !is_array(workspace_in) &&
                         PyCallable_Check(workspace_in.ptr()) != 0;
  if (!workspace_in.is_none() && !allocator) {
    if (!is_array(workspace_in)) {
      throw nb::type_error(("workspace must be a uint8 array, a callable nbytes -> array, or None, not " +
                            std::string(nb::type_name(workspace_in.type()).c_str()))
                               .c_str());
    }
    workspace.emplace("workspace", import_array<>(workspace_in, "workspace"));
    check_workspace(*workspace);
  }
  kernels::SparseMlaArgs a{};
  a.q = static_cast<const __nv_bfloat16*>(q.data());
  a.kv = static_cast<const __nv_bfloat16*>(kv.data());
  // A one-row kv may carry any stride in its first dim (DLPack leaves it free); no row follows.
  a.kv_row_stride = kv.shape(0) > 1 ? kv.stride(0) : (d_qk + 7) / 8 * 8;
  a.s_kv = checked_int("kv.shape[0] (s_kv)", kv.shape(0), 0, kInt32Max);
  a.indices = static_cast<const std::int32_t*>(indices.data());
  a.topk = checked_int("indices.shape[-1] (topk)", indices.shape(-1), 0, kInt32Max);
  a.topk_length = topk_length;
  a.attn_sink = attn_sink;
  a.s_q = checked_int("q.shape[0] (s_q)", s_q, 0, kInt32Max);
  a.h_q = checked_int("q.shape[1] (h_q)", h_q, 0, kInt32Max);
  a.d_qk = checked_int("q.shape[2] (d_qk)", d_qk, 0, kInt32Max);
  a.sm_scale = static_cast<float>(sm_scale);
  a.out = static_cast<__nv_bfloat16*>(out.data());
  a.max_logits = static_cast<float*>(max_logits.data());
  a.lse = static_cast<float*>(lse.data());
  kernels::SparseMla::can_implement(a);
  q.expect_cuda();
  // s_q = 0: checked as any call, then nothing to launch (FlashMLA asserts here). The outputs are
  // empty, so nothing is written.
  if (s_q == 0) return;

  const DeviceScope device(q.device_id());
  void* ws = nullptr;
  const std::size_t ws_bytes = kernels::SparseMla::workspace_bytes(a);
  nb::object allocated;  // keeps a workspace from the allocator alive until the launch is issued
  if (ws_bytes > 0 && allocator) {
    allocated = nb::borrow(workspace_in)(ws_bytes);
    if (!is_array(allocated)) {
      throw nb::type_error("workspace(nbytes) must return a uint8 array");
    }
    workspace.emplace("workspace", import_array<>(allocated, "workspace(nbytes)"));
    check_workspace(*workspace);
  }
  if (ws_bytes > 0) {
    if (workspace) {
      if (static_cast<std::size_t>(workspace->nbytes()) < ws_bytes ||
          reinterpret_cast<std::uintptr_t>(workspace->data()) % 256 != 0) {
        std::ostringstream os;
        os << "workspace holds " << workspace->nbytes() << " bytes at " << workspace->data() << "; this call needs "
           << ws_bytes << " bytes, 256-byte aligned (sparse_mla_workspace_bytes)";
        throw nb::value_error(os.str().c_str());
      }
      ws = workspace->data();
    } else {
      // No scratch given: the single pass needs none (the split top-k path is only faster).
      a.path = kernels::SparseMlaPath::single_pass;
    }
  }
  check_launch(kernels::SparseMla::run(a, ws, as_stream(stream)), "sparse_mla_fwd");
}

std::size_t sparse_mla_workspace_bytes(std::int64_t s_q, std::int64_t h_q, std::int64_t d_qk, std::int64_t topk,
                                       int device) {
  if (s_q == 0) return 0;
  kernels::SparseMlaArgs a{};
  a.s_q = checked_int("s_q", s_q, 0, kInt32Max);
  a.h_q = checked_int("h_q", h_q, 0, kInt32Max);
  a.d_qk = checked_int("d_qk", d_qk, 0, kInt32Max);
  a.topk = checked_int("topk", topk, 0, kInt32Max);
  a.s_kv = 1;
  a.kv_row_stride = a.d_qk;
  const DeviceScope scope(device);
  return kernels::SparseMla::workspace_bytes(a);
}

nb::dict sparse_mla_plan(std::int64_t s_q, std::int64_t h_q, std::int64_t d_qk, std::int64_t topk, int device) {
  kernels::SparseMlaArgs a{};
  a.s_q = checked_int("s_q", s_q, 1, kInt32Max);
  a.h_q = checked_int("h_q", h_q, 0, kInt32Max);
  a.d_qk = checked_int("d_qk", d_qk, 0, kInt32Max);
  a.topk = checked_int("topk", topk, 0, kInt32Max);
  if (a.h_q != 64 && a.h_q != 128) {
    throw nb::value_error(("h_q = " + std::to_string(a.h_q) + " must be 64 or 128").c_str());
  }
  if (a.d_qk != 512 && a.d_qk != 576) {
    throw nb::value_error(("d_qk = " + std::to_string(a.d_qk) + " must be 512 or 576").c_str());
  }
  if (a.topk < 64 || a.topk % 64 != 0) {
    throw nb::value_error(("topk = " + std::to_string(a.topk) + " must be a positive multiple of 64").c_str());
  }
  a.s_kv = 1;
  a.kv_row_stride = a.d_qk;
  const DeviceScope scope(device);
  const kernels::SparseMlaPlan plan = kernels::SparseMla::plan(a);
  nb::dict d;
  d["kernel"] = kernels::sparse_mla_kernel_name(plan.kernel);
  d["split"] = plan.split;
  d["num_splits"] = plan.num_splits;
  d["blocks_per_split"] = plan.blocks_per_split;
  d["dv_parts"] = plan.dv_parts;
  return d;
}

void combine_topk_swa_indices(Array topk_indices_in, Array query_start_loc_in,
                              Array seq_lens_in, Array gather_lens_in, std::int64_t window_size,
                              std::int64_t compress_ratio, std::int64_t topk, nb::handle m, nb::handle n,
                              Array combined_in, Array lens_in, OptArray status_in,
                              std::uintptr_t stream) {
  const ArrayArg topk_indices("topk_indices", topk_indices_in);
  topk_indices.expect_dtype(Dtype::int32).expect_ndim({2, 3}, "[num_tokens, topk] (or [num_tokens, 1, topk])");
  if (topk_indices.ndim() == 3) topk_indices.expect_dim(1, 1, "one kv head");
  topk_indices.expect_unit_last_stride();
  const std::int64_t tokens = topk_indices.shape(0);
  const ArrayArg seq_lens("seq_lens", seq_lens_in);
  seq_lens.expect_dtype(Dtype::int32).expect_ndim({1}, "[num_reqs]").expect_contiguous();
  seq_lens.expect_same_device(topk_indices);
  const std::int64_t requests = seq_lens.shape(0);
  const ArrayArg qsl("query_start_loc", query_start_loc_in);
  qsl.expect_dtype(Dtype::int32).expect_ndim({1}, "[num_reqs + 1]");
  qsl.expect_dim(0, requests + 1, "num_reqs + 1, from seq_lens").expect_contiguous().expect_same_device(topk_indices);
  const ArrayArg gather_lens("gather_lens", gather_lens_in);
  gather_lens.expect_dtype(Dtype::int32).expect_ndim({1}, "[num_reqs]");
  gather_lens.expect_dim(0, requests, "num_reqs, from seq_lens").expect_contiguous().expect_same_device(topk_indices);
  const ArrayArg combined("combined_indices", combined_in);
  combined.expect_dtype(Dtype::int32).expect_ndim({2}, "[num_tokens, width]");
  combined.expect_dim(0, tokens, "num_tokens, from topk_indices").expect_contiguous().expect_same_device(topk_indices);
  const ArrayArg lens("combined_lens", lens_in);
  lens.expect_dtype(Dtype::int32).expect_ndim({1}, "[num_tokens]");
  lens.expect_dim(0, tokens, "num_tokens, from topk_indices").expect_contiguous().expect_same_device(topk_indices);
  StepStatus* status = status_arg(status_in, topk_indices);
  const kernels::ScalarArg m_rows = scalar_arg("M", m, topk_indices);
  const kernels::ScalarArg n_rows = scalar_arg("N", n, topk_indices);

  const int r = checked_int("compress_ratio", compress_ratio, 0, kInt32Max);
  const int top_k = checked_int("topk", topk, 0, kInt32Max);
  if (r > 1 && topk_indices.shape(-1) < top_k) {
    std::ostringstream os;
    os << "topk_indices.shape[-1] = " << topk_indices.shape(-1) << " must be at least topk = " << top_k;
    throw nb::value_error(os.str().c_str());
  }
  checked_int("topk_indices.shape[0] (num_tokens)", tokens, 0, 1 << 24);
  // No tokens may come with no requests (an empty batch); tokens need a request.
  checked_int("seq_lens.shape[0] (num_reqs)", requests, tokens == 0 ? 0 : 1, kernels::kMaxRequestsBucket);

  kernels::CombineIndicesArgs a{};
  a.topk_indices = r > 1 ? static_cast<const std::int32_t*>(topk_indices.data()) : nullptr;
  a.top_k = top_k;
  a.compress_ratio = r;
  a.window = checked_int("window_size", window_size, 0, kInt32Max);
  a.chunk = kernels::ChunkArrays{nullptr, static_cast<const std::int32_t*>(qsl.data()),
                                 static_cast<const std::int32_t*>(seq_lens.data()),
                                 static_cast<const std::int32_t*>(gather_lens.data())};
  a.tokens_bucket = static_cast<int>(tokens);
  a.requests_bucket = static_cast<int>(requests);
  a.combined = static_cast<std::int32_t*>(combined.data());
  a.combined_width = checked_int("combined_indices.shape[1] (width)", combined.shape(1), 0, kInt32Max);
  a.lens = static_cast<std::int32_t*>(lens.data());
  a.status = status;
  if (r > 1) {
    const std::int64_t stride = tokens > 1 ? topk_indices.stride(0) : topk_indices.shape(-1);
    a.topk_row_stride = checked_int("topk_indices.stride(0)", stride, 0, kInt32Max);
  }
  a.n_rows = n_rows;
  a.m_rows = m_rows;
  kernels::CombineIndices::can_implement(a);
  topk_indices.expect_cuda();
  if (tokens == 0) return;  // checked as any call; nothing to launch or write

  const DeviceScope device(topk_indices.device_id());
  check_launch(kernels::CombineIndices::run(a, as_stream(stream)), "combine_topk_swa_indices");
}

void quantize_and_insert_k_cache(Array k_in, Array k_cache_in, Array slot_mapping_in,
                                 std::int64_t block_size, OptArray status_in, std::uintptr_t stream) {
  const ArrayArg k("k", k_in);
  k.expect_dtype(Dtype::bfloat16).expect_ndim({2}, "[num_tokens, 512]");
  k.expect_dim(1, kernels::kKvDim, "values of a K row").expect_contiguous();
  const ArrayArg cache("k_cache", k_cache_in);
  cache.expect_same_device(k);
  const kernels::CacheLayout layout = cache_layout(cache, block_size);
  const ArrayArg slots("slot_mapping", slot_mapping_in);
  slots.expect_dtype(Dtype::int32).expect_ndim({1}, "[num_tokens]");
  slots.expect_dim(0, k.shape(0), "num_tokens, k.shape[0]").expect_contiguous().expect_same_device(k);
  StepStatus* status = status_arg(status_in, k);
  const int rows = checked_int("k.shape[0] (num_tokens)", k.shape(0), 0, 1 << 24);

  kernels::KvInsertArgs a{};
  a.rows = static_cast<const __nv_bfloat16*>(k.data());
  a.slot_mapping = static_cast<const std::int32_t*>(slots.data());
  a.rows_bucket = rows;
  a.cache = static_cast<std::uint8_t*>(cache.data());
  a.layout = layout;
  a.status = status;
  kernels::KvInsert::can_implement(a);
  k.expect_cuda();
  if (rows == 0) return;  // checked as any call; nothing to launch or write

  const DeviceScope device(k.device_id());
  check_launch(kernels::KvInsert::run(a, as_stream(stream)), "quantize_and_insert_k_cache");
}

void dequantize_and_gather_k_cache(Array out_in, Array k_cache_in, Array seq_lens_in,
                                   OptArray gather_lens_in, Array block_table_in, std::int64_t block_size,
                                   std::int64_t offset, OptArray status_in, std::uintptr_t stream) {
  const ArrayArg out("out", out_in);
  out.expect_dtype(Dtype::bfloat16).expect_ndim({3}, "[num_reqs, max_rows, 512]");
  out.expect_dim(2, kernels::kKvDim, "values of a kv row").expect_contiguous();
  const ArrayArg cache("k_cache", k_cache_in);
  cache.expect_same_device(out);
  const kernels::CacheLayout layout = cache_layout(cache, block_size);
  const ArrayArg seq_lens("seq_lens", seq_lens_in);
  seq_lens.expect_dtype(Dtype::int32).expect_ndim({1}, "[num_reqs]").expect_contiguous().expect_same_device(out);
  const std::int64_t requests = seq_lens.shape(0);
  const std::int32_t* gather_lens = static_cast<const std::int32_t*>(seq_lens.data());  // None: every position
  if (gather_lens_in) {
    const ArrayArg g("gather_lens", *gather_lens_in);
    g.expect_dtype(Dtype::int32).expect_ndim({1}, "[num_reqs]").expect_dim(0, requests, "num_reqs, from seq_lens");
    g.expect_contiguous().expect_same_device(out);
    gather_lens = static_cast<const std::int32_t*>(g.data());
  }
  const ArrayArg table("block_table", block_table_in);
  table.expect_dtype(Dtype::int32).expect_ndim({2}, "[num_reqs, max_blocks]");
  table.expect_dim(0, requests, "num_reqs, from seq_lens").expect_contiguous().expect_same_device(out);
  StepStatus* status = status_arg(status_in, out);
  checked_int("seq_lens.shape[0] (num_reqs)", requests, 0, kernels::kMaxRequestsBucket);
  if (out.shape(0) < requests) {
    std::ostringstream os;
    os << "out.shape[0] = " << out.shape(0) << " must be at least num_reqs = " << requests;
    throw nb::value_error(os.str().c_str());
  }
  // No requests: a call with no work, checked as any other; out and the tables may be empty.
  const std::int64_t least = requests == 0 ? 0 : 1;
  const int max_rows =
      checked_int("out.shape[1] (rows per request)", out.shape(1), least, kInt32Max / std::max<std::int64_t>(requests, 1));
  const int window_offset = checked_int("offset", offset, 0, max_rows);
  const int width = checked_int("block_table.shape[1]", table.shape(1), least, kInt32Max);

  kernels::KvGatherArgs a{};
  a.cache = static_cast<const std::uint8_t*>(cache.data());
  a.layout = layout;
  a.block_table = static_cast<const std::int32_t*>(table.data());
  a.block_table_stride = width;
  a.chunk = kernels::ChunkArrays{nullptr, nullptr, static_cast<const std::int32_t*>(seq_lens.data()), gather_lens};
  a.part = kernels::GatherPart::window;
  a.compress_ratio = 1;
  a.requests_bucket = static_cast<int>(requests);
  a.max_rows_per_request = max_rows;
  a.kv = static_cast<__nv_bfloat16*>(out.data());
  a.status = status;
  a.window_offset = window_offset;
  kernels::KvGather::can_implement(a);
  out.expect_cuda();
  if (requests == 0) return;  // nothing to launch or write

  const DeviceScope device(out.device_id());
  check_launch(kernels::KvGather::run(a, as_stream(stream)), "dequantize_and_gather_k_cache");
}

/// How an array argument is read (a test hook): (data pointer, shape, strides in elements, dtype
/// name, DLPack device type, device id).
nb::tuple array_view(const nb::ndarray<>& a) {
  nb::list shape;
  nb::list strides;
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    shape.append(a.shape(i));
    strides.append(a.stride(i));
  }
  return nb::make_tuple(reinterpret_cast<std::uintptr_t>(a.data()), nb::steal(PyList_AsTuple(shape.ptr())),
                        nb::steal(PyList_AsTuple(strides.ptr())), nb::str(dtype_name(a.dtype()).c_str()), a.device_type(),
                        a.device_id());
}

}  // namespace

void bind_ops(nb::module_& m) {
  using namespace nb::literals;
  m.def("_array_view", [](const Array& a) { return array_view(a.array); }, "obj"_a,
        "Test hook: (data_ptr, shape, strides, dtype, DLPack device type, device id) of an array argument as the "
        "ops read it (torch tensors without __dlpack__).");
  m.def("_array_view_dlpack", [](const nb::ndarray<>& a) { return array_view(a); }, "obj"_a,
        "Test hook: the same, read by nanobind's DLPack import alone.");
  m.attr("STATUS_WORDS") = kStatusWords;
  m.attr("COMBINED_ALIGNMENT") = kCombinedAlignment;
  m.attr("KV_ROW_BYTES") = kernels::kKvRowBytes;
  m.attr("KV_SCALE_BYTES") = kernels::kKvScaleBytes;
  m.attr("KV_DIM") = kernels::kKvDim;
  m.attr("MAX_REQUESTS") = kernels::kMaxRequestsBucket;
  nb::list faults;
  for (int f = 0; f < kernels::kFaultKinds; ++f) faults.append(kernels::fault_name(static_cast<kernels::Fault>(f)));
  m.attr("FAULT_KINDS") = nb::tuple(faults);

  m.def("sparse_mla_fwd", &sparse_mla_fwd, "q"_a, "kv"_a, "indices"_a, "sm_scale"_a, "d_v"_a,
        "attn_sink"_a.none(), "topk_length"_a.none(), "out"_a, "max_logits"_a, "lse"_a, "workspace"_a.none(),
        "stream"_a,
        "Sparse MLA attention into caller-given out/max_logits/lse on `stream` (see spgraph.sparse_mla_fwd).");
  m.def("sparse_mla_workspace_bytes", &sparse_mla_workspace_bytes, "s_q"_a, "h_q"_a, "d_qk"_a, "topk"_a,
        "device"_a, "Bytes of scratch the split top-k path needs for this shape on `device` (0: none).");
  m.def("sparse_mla_plan", &sparse_mla_plan, "s_q"_a, "h_q"_a, "d_qk"_a, "topk"_a, "device"_a,
        "The launch plan sparse_mla_fwd (and the executor's attention) takes for this shape on `device`: "
        "{'kernel', 'split', 'num_splits', 'blocks_per_split'}.");
  m.def("combine_topk_swa_indices", &combine_topk_swa_indices, "topk_indices"_a, "query_start_loc"_a,
        "seq_lens"_a, "gather_lens"_a, "window_size"_a, "compress_ratio"_a, "topk"_a, "M"_a, "N"_a,
        "combined_indices"_a, "combined_lens"_a, "status"_a.none(), "stream"_a,
        "Stage 3 (top-k + window index rows) into caller-given arrays (see spgraph.combine_topk_swa_indices).");
  m.def("quantize_and_insert_k_cache", &quantize_and_insert_k_cache, "k"_a, "k_cache"_a, "slot_mapping"_a,
        "block_size"_a, "status"_a.none(), "stream"_a,
        "Stage 0: quantize K rows into a V4 FP8 cache (see spgraph.quantize_and_insert_k_cache).");
  m.def("dequantize_and_gather_k_cache", &dequantize_and_gather_k_cache, "out"_a, "k_cache"_a, "seq_lens"_a,
        "gather_lens"_a.none(), "block_table"_a, "block_size"_a, "offset"_a, "status"_a.none(), "stream"_a,
        "Stages 1-2: dequantize cache rows into out (see spgraph.dequantize_and_gather_k_cache).");
  m.def(
      "cache_block_stride", [](std::int64_t block_size) { return kernels::CacheLayout::make(checked_int("block_size", block_size, 1, 1 << 16), 1).block_stride; },
      "block_size"_a, "Bytes of one V4 cache block of `block_size` rows: round_up(block_size * 584, 576).");
  m.def(
      "combined_width",
      [](std::int64_t topk, std::int64_t window) {
        const std::int64_t w = (topk + window + kCombinedAlignment - 1) / kCombinedAlignment * kCombinedAlignment;
        return checked_int("round_up(topk + window_size, 128)", w, 0, kInt32Max);
      },
      "topk"_a, "window_size"_a, "Width of a combined index row: round_up(topk + window_size, 128).");
}

}  // namespace spg::python
