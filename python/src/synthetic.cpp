// serve_loop's synthetic model front and output checksum over DLPack arrays, for samples and tests
// (spgraph.synthetic): the same kernels with the same arguments, so a Python loop that owns its
// tensors writes the bytes serve_loop writes and sums its outputs the same way.
#include "synthetic.hpp"

#include <cuda_runtime_api.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "array_arg.hpp"
#include "chunk_input.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/kernels/checksum/checksum.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"

namespace spg::python {

namespace {

cudaStream_t as_stream(std::uintptr_t h) noexcept { return reinterpret_cast<cudaStream_t>(h); }

void check_launch(cudaError_t e, const char* op) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(e, std::string(op) + ": the launch failed with " + cudaGetErrorName(e));
  }
}

/// A row buffer the front writes: [rows, width] contiguous CUDA array of `dtype`; its row count.
std::int64_t rows_arg(const ArrayArg& a, Dtype dtype, std::int64_t width) {
  a.expect_dtype(dtype).expect_ndim({2}, "[rows, width]").expect_dim(1, width, "values per row").expect_contiguous();
  a.expect_cuda();
  return a.shape(0);
}

/// The front over a model's per-layer arrays, resolved once; run() fills one chunk's inputs.
class Front {
 public:
  explicit Front(nb::handle layers) {
    if (PyObject_HasAttrString(layers.ptr(), "__iter__") == 0) {
      throw nb::type_error("SyntheticFront takes a list of layers (dicts with k_rows, compressed_k_rows, topk_indices, "
                           "compress_ratio, top_k)");
    }
    for (nb::handle layer : layers) {
      const int l = args_.num_layers;
      if (l >= kernels::kFrontMaxLayers) {
        throw nb::value_error(("the front takes at most " + std::to_string(kernels::kFrontMaxLayers) + " layers").c_str());
      }
      const std::string where = "layers[" + std::to_string(l) + "]";
      auto get = [&](const char* name) {
        return PyDict_Check(layer.ptr()) ? nb::borrow(PyDict_GetItemString(layer.ptr(), name))
                                         : nb::steal(PyObject_GetAttrString(layer.ptr(), name));
      };
      kernels::FrontLayer& f = args_.layers[l];
      const nb::object ratio = get("compress_ratio");
      PyErr_Clear();
      f.compress_ratio = ratio.is_valid() ? int_value(ratio, where + ".compress_ratio", 1, 128) : 1;
      const nb::object k = get("k_rows");
      PyErr_Clear();
      if (!k.is_valid() || k.is_none()) throw nb::value_error((where + ".k_rows is missing").c_str());
      const std::string kname = where + ".k_rows";
      const ArrayArg ka(kname.c_str(), import_array<>(k, kname));
      k_rows_[l] = rows_arg(ka, Dtype::bfloat16, 512);
      f.k_rows = static_cast<__nv_bfloat16*>(ka.data());
      keep_.push_back(k);
      if (f.compress_ratio > 1) {
        const nb::object top_k = get("top_k");
        PyErr_Clear();
        f.top_k = top_k.is_valid() ? int_value(top_k, where + ".top_k", 8, 1 << 16) : 0;
        const nb::object c = get("compressed_k_rows");
        const nb::object t = get("topk_indices");
        PyErr_Clear();
        if (!c.is_valid() || c.is_none() || !t.is_valid() || t.is_none()) {
          throw nb::value_error((where + ": compressed_k_rows and topk_indices are needed when compress_ratio > 1").c_str());
        }
        const std::string cname = where + ".compressed_k_rows";
        const std::string tname = where + ".topk_indices";
        const ArrayArg ca(cname.c_str(), import_array<>(c, cname));
        const ArrayArg ta(tname.c_str(), import_array<>(t, tname));
        compressed_rows_[l] = rows_arg(ca, Dtype::bfloat16, 512);
        topk_rows_[l] = rows_arg(ta, Dtype::int32, f.top_k);
        f.compressed_k_rows = static_cast<__nv_bfloat16*>(ca.data());
        f.topk_indices = static_cast<std::int32_t*>(ta.data());
        keep_.push_back(c);
        keep_.push_back(t);
      }
      ++args_.num_layers;
    }
    if (args_.num_layers == 0) throw nb::value_error("SyntheticFront needs at least one layer");
  }

  /// Fills one chunk's K rows, compressed K rows and top-k indices (serve_loop's make_front_args),
  /// or with a StepPlan the whole step's rows at once (serve_loop --one-launch's make_step_front_args:
  /// one span of every chunk's tokens and completed compressed rows, in chunk order, its top-k
  /// bounded by the step's shortest sequence).
  void run(nb::handle chunk, std::uint64_t seed, std::uint64_t step, std::uintptr_t stream) {
    kernels::SyntheticFrontArgs a = args_;
    a.seed = seed;
    a.step = step;
    if (nb::isinstance<PlannedStep>(chunk)) {
      const PlannedStep& st = *nb::inst_ptr<PlannedStep>(chunk);
      if (st.chunks.size() == 0) throw nb::value_error("SyntheticFront.run: the step has no chunks");
      a.num_requests = 1;
      a.num_tokens = 0;
      a.seq_lens[0] = std::numeric_limits<std::int32_t>::max();
      for (nb::handle h : st.chunks) {
        const scheduler::ChunkPlan& p = nb::inst_ptr<PlannedChunk>(h)->plan;
        a.num_tokens += p.num_tokens;
        for (const std::int32_t sl : p.seq_lens) a.seq_lens[0] = std::min(a.seq_lens[0], sl);
        for (const scheduler::ChunkCachePlan& c : p.caches) {
          if (c.ratio > 1) a.new_compressed_rows[graphs::ratio_index(c.ratio)] += c.num_new_rows();
        }
      }
      a.query_start_loc[0] = 0;
      a.query_start_loc[1] = a.num_tokens;
      launch(a, stream);
      return;
    }
    if (!nb::isinstance<PlannedChunk>(chunk)) {
      throw nb::type_error(("SyntheticFront.run takes a ChunkPlan or a StepPlan (from PrefillScheduler.schedule()), "
                            "not " +
                            py_type_name(chunk))
                               .c_str());
    }
    const scheduler::ChunkPlan& p = nb::inst_ptr<PlannedChunk>(chunk)->plan;
    if (p.num_requests > kernels::kFrontMaxRequests) {
      throw nb::value_error(("the chunk has " + std::to_string(p.num_requests) + " requests; the front takes at most " +
                             std::to_string(kernels::kFrontMaxRequests))
                                .c_str());
    }
    a.num_requests = p.num_requests;
    a.num_tokens = p.num_tokens;
    for (int b = 0; b <= p.num_requests; ++b) a.query_start_loc[b] = p.query_start_loc[static_cast<std::size_t>(b)];
    for (int b = 0; b < p.num_requests; ++b) a.seq_lens[b] = p.seq_lens[static_cast<std::size_t>(b)];
    for (const scheduler::ChunkCachePlan& c : p.caches) {
      if (c.ratio > 1) a.new_compressed_rows[graphs::ratio_index(c.ratio)] = c.num_new_rows();
    }
    launch(a, stream);
  }

 private:
  void launch(const kernels::SyntheticFrontArgs& a, std::uintptr_t stream) {
    for (int l = 0; l < a.num_layers; ++l) {
      const kernels::FrontLayer& f = a.layers[l];
      const int ri = graphs::ratio_index(f.compress_ratio);
      const bool fits = a.num_tokens <= k_rows_[l] &&
                        (f.compress_ratio == 1 ||
                         (a.new_compressed_rows[ri] <= compressed_rows_[l] && a.num_tokens <= topk_rows_[l]));
      if (!fits) {
        throw nb::value_error(("layers[" + std::to_string(l) + "]: a chunk of " + std::to_string(a.num_tokens) +
                               " tokens does not fit the layer's row buffers")
                                  .c_str());
      }
    }
    kernels::SyntheticFront::can_implement(a);
    check_launch(kernels::SyntheticFront::run(a, as_stream(stream)), "SyntheticFront.run");
  }

  kernels::SyntheticFrontArgs args_{};
  std::int64_t k_rows_[kernels::kFrontMaxLayers]{};
  std::int64_t compressed_rows_[kernels::kFrontMaxLayers]{};
  std::int64_t topk_rows_[kernels::kFrontMaxLayers]{};
  std::vector<nb::object> keep_;
};

}  // namespace

void bind_synthetic(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<Front>(m, "SyntheticFront", "serve_loop's synthetic model front over a model's own arrays.")
      .def(nb::init<nb::handle>(), "layers"_a)
      .def("run", &Front::run, "chunk"_a, "seed"_a, "step"_a, "stream"_a,
           "Fills the chunk's K rows, compressed K rows and top-k indices of every layer on `stream`.");
  m.def(
      "synthetic_fill_query",
      [](Array q_in, std::uint64_t seed, int layer, std::uintptr_t stream) {
        const ArrayArg q("q", q_in);
        q.expect_dtype(Dtype::bfloat16).expect_contiguous().expect_cuda();
        check_launch(kernels::SyntheticFront::fill_query(static_cast<__nv_bfloat16*>(q.data()),
                                                         static_cast<std::size_t>(q.numel()), seed, layer,
                                                         as_stream(stream)),
                     "synthetic_fill_query");
      },
      "q"_a, "seed"_a, "layer"_a, "stream"_a, "Fills every value of q with front_q_value(seed, layer, i).");
  m.def(
      "synthetic_sink_values",
      [](std::uint64_t seed, int layer, int h_q) {
        std::vector<float> v(static_cast<std::size_t>(h_q));
        for (std::size_t h = 0; h < v.size(); ++h) v[h] = 4.0F * kernels::front_q_value(seed + 7, layer, h);
        return v;
      },
      "seed"_a, "layer"_a, "h_q"_a, "serve_loop's attention sinks of a layer: 4 * front_q_value(seed + 7, layer, h).");
  m.def(
      "synthetic_fill_cache",
      [](Array cache_in, int block_size, std::uint64_t seed, std::uintptr_t stream) {
        const ArrayArg c("cache", cache_in);
        c.expect_dtype(Dtype::uint8).expect_ndim({2}, "[num_blocks, block_stride]").expect_contiguous().expect_cuda();
        const std::int64_t used = std::int64_t{block_size} * (kernels::kKvRowBytes + kernels::kKvScaleBytes);
        if (block_size < 1 || c.shape(1) < used) {
          throw nb::value_error(("cache.shape = " + c.shape_str() + " has blocks of " + std::to_string(c.shape(1)) +
                                 " bytes; block_size = " + std::to_string(block_size) + " needs " + std::to_string(used))
                                    .c_str());
        }
        check_launch(kernels::SyntheticFront::fill_cache(static_cast<std::uint8_t*>(c.data()), c.shape(0), block_size,
                                                         c.shape(1), seed, as_stream(stream)),
                     "synthetic_fill_cache");
      },
      "cache"_a, "block_size"_a, "seed"_a, "stream"_a,
      "Fills every row of a V4 cache with random finite FP8 rows (the bench's fill).");
  m.def(
      "checksum_accumulate",
      [](Array data_in, std::uint64_t salt, Array acc_in, std::uintptr_t stream) {
        const ArrayArg data("data", data_in);
        data.expect_contiguous().expect_cuda();
        const ArrayArg acc("acc", acc_in);
        const nb::dlpack::dtype d = acc_in.array.dtype();
        if (!((d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) ||
               d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt)) &&
              d.bits == 64 && d.lanes == 1)) {
          throw nb::type_error(("acc.dtype = " + dtype_name(d) + " must be int64 or uint64").c_str());
        }
        acc.expect_ndim({1}, "[1]").expect_dim(0, 1, "one 64-bit sum").expect_same_device(data).expect_cuda();
        if (data.nbytes() % 4 != 0 || reinterpret_cast<std::uintptr_t>(data.data()) % 4 != 0) {
          throw nb::value_error(("data holds " + std::to_string(data.nbytes()) +
                                 " bytes; the checksum sums 4-byte aligned 32-bit words")
                                    .c_str());
        }
        check_launch(kernels::Checksum::accumulate(data.data(), static_cast<std::size_t>(data.nbytes()), salt,
                                                   static_cast<std::uint64_t*>(acc.data()), as_stream(stream)),
                     "checksum_accumulate");
      },
      "data"_a, "salt"_a, "acc"_a, "stream"_a,
      "acc += sum_i word[i] * (2 * (i + salt) + 1) (mod 2^64) over data's 32-bit words (serve_loop --checksum).");
}

}  // namespace spg::python
