// Bound buffers in, views out: see buffers.hpp.
#include "buffers.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <sstream>
#include <string>

#include "array_arg.hpp"
#include "config.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"

namespace spg::python {

namespace {

using graphs::LayerBuffer;

std::string where(std::size_t layer, LayerBuffer b) {
  return "buffers[" + std::to_string(layer) + "]." + graphs::layer_buffer_name(b);
}

std::string all_names() {
  std::string s;
  for (LayerBuffer b : graphs::kLayerBuffers) s += std::string(s.empty() ? "" : ", ") + graphs::layer_buffer_name(b);
  return s;
}

/// The array an entry gives for buffer `b`: dict item or attribute; None when absent.
nb::object member(nb::handle entry, LayerBuffer b) {
  const char* name = graphs::layer_buffer_name(b);
  if (PyDict_Check(entry.ptr())) {
    PyObject* v = PyDict_GetItemString(entry.ptr(), name);  // borrowed
    return v == nullptr ? nb::none() : nb::borrow(v);
  }
  PyObject* v = PyObject_GetAttrString(entry.ptr(), name);
  if (v == nullptr) {
    PyErr_Clear();
    return nb::none();
  }
  return nb::steal(v);
}

void check_keys(nb::handle entry, std::size_t layer) {
  if (!PyDict_Check(entry.ptr())) return;
  for (auto [key, value] : nb::borrow<nb::dict>(entry)) {
    (void)value;
    const std::string k = PyUnicode_Check(key.ptr()) ? nb::cast<std::string>(key) : std::string(nb::repr(key).c_str());
    bool known = false;
    for (LayerBuffer b : graphs::kLayerBuffers) known |= k == graphs::layer_buffer_name(b);
    if (!known) {
      throw nb::value_error(("buffers[" + std::to_string(layer) + "] has the key '" + k +
                             "'; the buffers of a layer are " + all_names())
                                .c_str());
    }
  }
}

/// A typed strided view of an array of rank R (strides in elements, none negative).
template <class T, std::size_t R>
graphs::DeviceView<T, R> view_of(const ArrayArg& a, Dtype dtype, const char* form) {
  a.expect_dtype(dtype).expect_ndim({static_cast<int>(R)}, form);
  std::array<std::size_t, R> extents{};
  std::array<std::size_t, R> strides{};
  for (std::size_t i = 0; i < R; ++i) {
    const std::int64_t s = a.stride(static_cast<int>(i));
    if (s < 0) {
      throw nb::value_error((std::string(a.name()) + " has strides " + a.strides_str() +
                             "; a bound buffer cannot have negative strides")
                                .c_str());
    }
    extents[i] = static_cast<std::size_t>(a.shape(static_cast<int>(i)));
    strides[i] = static_cast<std::size_t>(s);
  }
  return graphs::strided_view<T, R>(static_cast<T*>(a.data()), extents, strides);
}

/// A cache array in the V4 layout: block_size from the config, block stride and count from the array.
graphs::PagedCache cache_of(const ArrayArg& a, const kernels::CacheLayout& want) {
  a.expect_dtype(Dtype::uint8);
  graphs::PagedCache c;
  c.data = static_cast<std::uint8_t*>(a.data());
  c.layout.block_size = want.block_size;
  std::int64_t blocks = 0;
  if (a.ndim() == 1) {
    a.expect_unit_last_stride();
    c.layout.block_stride = want.block_stride;
    if (a.shape(0) % want.block_stride != 0) {
      std::ostringstream os;
      os << a.name() << ".shape = " << a.shape_str() << " (flat bytes) must be a multiple of the block stride "
         << want.block_stride << " (" << want.block_size << " rows a block); give [num_blocks, block_stride] for "
         << "a padded stride";
      throw nb::value_error(os.str().c_str());
    }
    blocks = a.shape(0) / want.block_stride;
  } else if (a.ndim() >= 2) {
    std::int64_t inner = 1;
    for (int i = a.ndim() - 1; i >= 1; --i) {
      if (a.shape(i) != 1 && a.stride(i) != inner) {
        throw nb::value_error((std::string(a.name()) + ": the bytes of one block must be contiguous; shape " +
                               a.shape_str() + " has strides " + a.strides_str())
                                  .c_str());
      }
      inner *= a.shape(i);
    }
    blocks = a.shape(0);
    c.layout.block_stride = blocks > 1 ? a.stride(0) : inner;
    if (c.layout.block_stride < inner) {
      std::ostringstream os;
      os << a.name() << ": shape " << a.shape_str() << ", strides " << a.strides_str() << ": blocks of " << inner
         << " bytes lie " << c.layout.block_stride << " bytes apart; they must not overlap";
      throw nb::value_error(os.str().c_str());
    }
  } else {
    throw nb::value_error((std::string(a.name()) + ".shape = " + a.shape_str() +
                           " must be [num_blocks, block_stride] (uint8) or flat bytes [num_blocks * block_stride]")
                              .c_str());
  }
  c.layout.num_blocks = checked_int((std::string(a.name()) + " blocks").c_str(), blocks, 0, 2147483647);
  return c;
}

template <class View>
nb::object view_object(const View& v, Dtype dtype, nb::handle owner, int device, Framework fw) {
  constexpr std::size_t R = View::rank();
  if (v.data_handle() == nullptr) return nb::none();
  std::size_t shape[R];
  std::int64_t strides[R];
  for (std::size_t i = 0; i < R; ++i) {
    shape[i] = v.extent(i);
    strides[i] = static_cast<std::int64_t>(v.stride(i));
  }
  const nb::ndarray<> a(static_cast<void*>(v.data_handle()), R, shape, owner, strides, dlpack_dtype(dtype),
                        nb::device::cuda::value, device);
  if (fw == Framework::torch) return nb::cast(nb::ndarray<nb::pytorch>(a));
  return nb::cast(a);
}

nb::object cache_object(const graphs::PagedCache& c, nb::handle owner, int device, Framework fw) {
  if (c.data == nullptr) return nb::none();
  const std::array<std::size_t, 2> extents{static_cast<std::size_t>(c.layout.num_blocks),
                                           static_cast<std::size_t>(c.layout.block_stride)};
  return view_object(graphs::contiguous_view<std::uint8_t, 2>(c.data, extents), Dtype::uint8, owner, device, fw);
}

std::vector<std::vector<int>> every_layer(const model::PipelineConfig& config) {
  std::vector<int> all(config.layers.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return {all};
}

}  // namespace

BoundBuffers bound_buffers(const model::PipelineConfig& config, nb::handle buffers) {
  BoundBuffers out;
  if (buffers.is_none()) return out;
  if (PyUnicode_Check(buffers.ptr()) || PySequence_Check(buffers.ptr()) == 0 || PyDict_Check(buffers.ptr())) {
    throw nb::type_error(("buffers must be a sequence with one entry per layer (None, a dict or an object "
                          "naming the layer's buffers), not " +
                          py_type_name(buffers))
                             .c_str());
  }
  const Py_ssize_t n = PySequence_Size(buffers.ptr());
  if (n < 0) throw nb::python_error();
  if (n == 0) return out;
  if (static_cast<std::size_t>(n) != config.layers.size()) {
    // The binding check's own message: one LayerBuffers per layer, or none.
    graphs::check_binding_shapes(config, std::vector<graphs::LayerBuffers>(static_cast<std::size_t>(n)), {}, true);
  }
  std::string first_device;
  out.layers.resize(static_cast<std::size_t>(n));
  for (std::size_t l = 0; l < out.layers.size(); ++l) {
    const nb::object entry = nb::steal(PySequence_GetItem(buffers.ptr(), static_cast<Py_ssize_t>(l)));
    if (!entry.is_valid()) throw nb::python_error();
    if (entry.is_none()) continue;
    if (is_array(entry)) {
      throw nb::type_error(("buffers[" + std::to_string(l) + "] is an array; each entry names one layer's buffers "
                            "(a dict {name: array}, a LayerBuffers, or None)")
                               .c_str());
    }
    check_keys(entry, l);
    graphs::LayerBuffers& b = out.layers[l];
    const model::LayerConfig& layer = config.layers[l];
    for (LayerBuffer which : graphs::kLayerBuffers) {
      const nb::object value = member(entry, which);
      if (value.is_none()) continue;
      const std::string name = where(l, which);
      if (!is_array(value)) {
        throw nb::type_error((name + " must be an array (an object exporting DLPack), not " + py_type_name(value)).c_str());
      }
      const ArrayArg a(name.c_str(), import_array<>(value, name));
      a.expect_cuda();
      if (out.device < 0) {
        out.device = a.device_id();
        first_device = name;
      } else if (a.device_id() != out.device) {
        throw nb::value_error((name + " is on " + a.device_name() + " but " + first_device + " is on cuda:" +
                               std::to_string(out.device) + "; every bound buffer must be on one device")
                                  .c_str());
      }
      switch (which) {
        case LayerBuffer::q: b.q = view_of<__nv_bfloat16, 3>(a, Dtype::bfloat16, "[rows, h_q, d_qk]"); break;
        case LayerBuffer::topk_indices: b.topk_indices = view_of<std::int32_t, 2>(a, Dtype::int32, "[rows, top_k]"); break;
        case LayerBuffer::k_rows: b.k_rows = view_of<__nv_bfloat16, 2>(a, Dtype::bfloat16, "[rows, 512]"); break;
        case LayerBuffer::compressed_k_rows:
          b.compressed_k_rows = view_of<__nv_bfloat16, 2>(a, Dtype::bfloat16, "[rows, 512]");
          break;
        case LayerBuffer::swa_cache:
          b.swa_cache = cache_of(a, graphs::required_cache(config, layer, which));
          break;
        case LayerBuffer::compressed_cache:
          b.compressed_cache = cache_of(a, graphs::required_cache(config, layer, which));
          break;
        case LayerBuffer::attn_sink: b.attn_sink = view_of<float, 1>(a, Dtype::float32, "[h_q]"); break;
        case LayerBuffer::out: b.out = view_of<__nv_bfloat16, 3>(a, Dtype::bfloat16, "[rows, h_q, 512]"); break;
        case LayerBuffer::lse: b.lse = view_of<float, 2>(a, Dtype::float32, "[rows, h_q]"); break;
        case LayerBuffer::max_logits: b.max_logits = view_of<float, 2>(a, Dtype::float32, "[rows, h_q]"); break;
      }
      out.arrays.push_back(value);
    }
  }
  return out;
}

Framework framework_arg(nb::handle name) {
  if (PyUnicode_Check(name.ptr())) {
    const std::string s = nb::cast<std::string>(name);
    if (s == "dlpack") return Framework::dlpack;
    if (s == "torch") return Framework::torch;
    throw nb::value_error(("tensors = '" + s + "' must be 'dlpack' or 'torch'").c_str());
  }
  throw nb::type_error(("tensors must be 'dlpack' or 'torch', not " + py_type_name(name)).c_str());
}

nb::dict layer_views(const graphs::LayerBuffers& b, nb::handle owner, int device, Framework fw) {
  nb::dict d;
  d["q"] = view_object(b.q, Dtype::bfloat16, owner, device, fw);
  d["topk_indices"] = view_object(b.topk_indices, Dtype::int32, owner, device, fw);
  d["k_rows"] = view_object(b.k_rows, Dtype::bfloat16, owner, device, fw);
  d["compressed_k_rows"] = view_object(b.compressed_k_rows, Dtype::bfloat16, owner, device, fw);
  d["swa_cache"] = cache_object(b.swa_cache, owner, device, fw);
  d["compressed_cache"] = cache_object(b.compressed_cache, owner, device, fw);
  d["attn_sink"] = view_object(b.attn_sink, Dtype::float32, owner, device, fw);
  d["out"] = view_object(b.out, Dtype::bfloat16, owner, device, fw);
  d["lse"] = view_object(b.lse, Dtype::float32, owner, device, fw);
  d["max_logits"] = view_object(b.max_logits, Dtype::float32, owner, device, fw);
  return d;
}

nb::dict workspace_views(const graphs::StepWorkspace& w, nb::handle owner, int device, Framework fw) {
  nb::dict d;
  d["kv"] = view_object(w.kv, Dtype::bfloat16, owner, device, fw);
  d["combined_indices"] = view_object(w.combined_indices, Dtype::int32, owner, device, fw);
  d["combined_lens"] = view_object(w.combined_lens, Dtype::int32, owner, device, fw);
  return d;
}

void bind_buffers(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "check_buffers",
      [](nb::handle config, nb::handle buffers, const std::vector<std::vector<int>>& programs, bool insert) {
        const model::PipelineConfig c = pipeline_config(config);
        c.validate();
        const BoundBuffers b = bound_buffers(c, buffers);
        graphs::check_binding_shapes(c, b.layers, programs.empty() ? every_layer(c) : programs, insert);
      },
      "config"_a, "buffers"_a, "programs"_a, "insert"_a,
      "The binding checks that need no device (check_binding_shapes): raises ValueError naming the layer and buffer.");
  m.def(
      "plan_bound",
      [](nb::handle config, nb::handle buffers, bool insert) {
        const model::PipelineConfig c = pipeline_config(config);
        const BoundBuffers b = bound_buffers(c, buffers);
        return plan_dict(graphs::plan_pipeline_pool(c, b.layers, insert));
      },
      "config"_a, "buffers"_a, "insert"_a, "The pool planned around these bindings (no GPU needed).");
}

}  // namespace spg::python
