// Checked access to one DLPack array argument of a Python call: its name (for messages), dtype,
// shape, strides (in elements), device and data pointer, without copying anything.
//
// Every check raises with a message in the project's rule (argument, value, bound; see
// docs/errors.md): a wrong dtype is a TypeError, everything else a ValueError. The checks read
// only the DLPack descriptor, never the data, so they run the same on any device and in CPU-only
// test runs.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>

namespace spg::python {

namespace nb = nanobind;

/// The element types the ops take.
enum class Dtype { bfloat16, float32, int32, uint8 };

/// @brief Name of a DLPack dtype as the frameworks print it ("bfloat16", "int64", ...).
std::string dtype_name(nb::dlpack::dtype d);
/// @brief The DLPack dtype of one of the element types.
nb::dlpack::dtype dlpack_dtype(Dtype d);

/// @brief An array parameter of a bound function: what an nb::ndarray<> parameter takes, imported
///        through import_array (torch tensors without `__dlpack__`); its caster is below.
struct Array {
  nb::ndarray<> array;
};

/// @brief One array argument. Holds a reference to the DLPack tensor for the duration of the call.
class ArrayArg {
 public:
  ArrayArg(const char* name, nb::ndarray<> array);
  ArrayArg(const char* name, const Array& array) : ArrayArg(name, array.array) {}

  [[nodiscard]] const char* name() const noexcept { return name_; }
  [[nodiscard]] int ndim() const noexcept { return static_cast<int>(array_.ndim()); }
  /// Extent of dimension `i`; negative `i` counts from the end.
  [[nodiscard]] std::int64_t shape(int i) const;
  /// Stride of dimension `i` in elements; negative `i` counts from the end.
  [[nodiscard]] std::int64_t stride(int i) const;
  [[nodiscard]] std::int64_t numel() const noexcept { return static_cast<std::int64_t>(array_.size()); }
  [[nodiscard]] std::int64_t nbytes() const noexcept { return static_cast<std::int64_t>(array_.nbytes()); }
  [[nodiscard]] void* data() const noexcept { return array_.data(); }
  [[nodiscard]] nb::dlpack::dtype dtype() const noexcept { return array_.dtype(); }
  [[nodiscard]] int device_type() const noexcept { return array_.device_type(); }
  [[nodiscard]] int device_id() const noexcept { return array_.device_id(); }
  /// "cuda:0", "cpu", ...
  [[nodiscard]] std::string device_name() const;
  [[nodiscard]] std::string shape_str() const;
  [[nodiscard]] std::string strides_str() const;

  /// @throws nb::type_error unless the dtype is `want`.
  const ArrayArg& expect_dtype(Dtype want) const;
  /// @throws nb::value_error unless ndim is one of `allowed`; `form` names the dims ("[s_q, h_q, d_qk]").
  const ArrayArg& expect_ndim(std::initializer_list<int> allowed, const char* form) const;
  /// @throws nb::value_error unless dimension `i` has extent `want`; `what` says where `want` comes from.
  const ArrayArg& expect_dim(int i, std::int64_t want, const std::string& what) const;
  /// @throws nb::value_error unless the array is C-contiguous (dims of extent 1 may have any stride).
  const ArrayArg& expect_contiguous() const;
  /// @throws nb::value_error unless the last dimension has stride 1.
  const ArrayArg& expect_unit_last_stride() const;
  /// @throws nb::value_error unless the array lives on the same device as `other`.
  const ArrayArg& expect_same_device(const ArrayArg& other) const;
  /// @throws nb::value_error unless the array is in CUDA device memory.
  const ArrayArg& expect_cuda() const;

 private:
  const char* name_;
  nb::ndarray<> array_;
};

/// @brief Makes the array's device current for the scope of a call and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_{-1};
};

/// @brief True for what an nb::ndarray<> argument accepts: an object exporting DLPack, a DLPack
///        capsule or a buffer.
bool is_array(nb::handle h);

/// @brief A torch tensor as an nb::ndarray without `__dlpack__`: four attribute checks, then
///        torch's C-level export (torch.utils.dlpack.to_dlpack, without `__dlpack__`'s Python
///        wrapper and stream hand-shake), imported zero-copy (`_array_view`, its result tuple
///        included: 1.14 µs on the build machine, against 1.60 µs reading pointer, shape,
///        strides, dtype and device attribute by attribute and 3.2 µs through `__dlpack__`).
///        Takes only what `__dlpack__` would export the same: a strided tensor without autograd
///        or negative bit, of a real dtype DLPack names. False for anything else (and for a
///        tensor the export refuses, such as a meta tensor), which then goes through DLPack with
///        DLPack's errors. Never raises.
bool torch_view(nb::handle h, nb::ndarray<>& out) noexcept;

/// @brief `v` as an nb::ndarray (zero-copy: a torch tensor through torch_view, anything else by
///        DLPack import).
/// @throws nb::type_error naming `what` when the object cannot be imported (a meta tensor, ...).
template <class... Args>
nb::ndarray<Args...> import_array(nb::handle v, const std::string& what) {
  if constexpr (sizeof...(Args) == 0 || std::is_same_v<std::tuple<Args...>, std::tuple<nb::ro>>) {
    nb::ndarray<> fast;
    if (torch_view(v, fast)) return nb::ndarray<Args...>(fast);
  }
  try {
    return nb::cast<nb::ndarray<Args...>>(v);
  } catch (const std::bad_cast&) {
    throw nb::type_error((what + ": a " + nb::type_name(v.type()).c_str() +
                          " that DLPack cannot export (device memory of a kind spgraph cannot read, or a tensor "
                          "without storage)")
                             .c_str());
  }
}

/// @brief True for an array in host memory (DLPack kDLCPU).
bool is_host(const ArrayArg& a);

/// @brief An int argument given in int32 range.
/// @throws nb::value_error naming `name` unless `v` fits in [lo, hi].
int checked_int(const char* name, std::int64_t v, std::int64_t lo, std::int64_t hi);

/// @brief A Python int (or an object with __index__, not a bool) as a 64-bit value.
/// @throws nb::type_error naming `what` for anything else; nb::value_error past 64 bits.
std::int64_t int_value(nb::handle v, const std::string& what);
/// @brief int_value() bounded to [lo, hi] (nb::value_error naming `what`, its value and the bounds).
int int_value(nb::handle v, const std::string& what, std::int64_t lo, std::int64_t hi);
/// @brief A Python float or int. @throws nb::type_error naming `what` for anything else.
double float_value(nb::handle v, const std::string& what);
/// @brief A Python bool (or a NumPy bool). @throws nb::type_error naming `what` for anything else.
bool bool_value(nb::handle v, const std::string& what);
/// @brief `obj.name`, or nb::type_error "`what`.name is missing" when the object has no such attribute.
nb::object required_attr(nb::handle obj, const char* name, const std::string& what);
/// @brief Name of a Python object's type, for messages.
std::string py_type_name(nb::handle v);

}  // namespace spg::python

namespace nanobind::detail {

/// spg::python::Array from Python: a torch tensor through torch_view, anything else as an
/// nb::ndarray<> parameter takes it (DLPack, buffers).
template <>
struct type_caster<spg::python::Array> {
  NB_TYPE_CASTER(spg::python::Array, const_name("ndarray"))

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    if (spg::python::torch_view(src, value.array)) return true;
    make_caster<ndarray<>> c;
    if (!c.from_python(src, flags, cleanup)) return false;
    value.array = c.value;
    return true;
  }
  static handle from_cpp(const spg::python::Array& a, rv_policy policy, cleanup_list* cleanup) noexcept {
    return make_caster<ndarray<>>::from_cpp(a.array, policy, cleanup);
  }
};

}  // namespace nanobind::detail
