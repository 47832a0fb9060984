// ArrayArg and DeviceScope: see array_arg.hpp.
#include "array_arg.hpp"

#include <cuda_runtime_api.h>

#include <iterator>
#include <sstream>
#include <utility>
#include <vector>

#include "spgraph/core/error.hpp"

namespace spg::python {

using nb::dlpack::dtype_code;

nb::dlpack::dtype dlpack_dtype(Dtype d) {
  switch (d) {
    case Dtype::bfloat16: return {static_cast<std::uint8_t>(dtype_code::Bfloat), 16, 1};
    case Dtype::float32: return {static_cast<std::uint8_t>(dtype_code::Float), 32, 1};
    case Dtype::int32: return {static_cast<std::uint8_t>(dtype_code::Int), 32, 1};
    case Dtype::uint8: return {static_cast<std::uint8_t>(dtype_code::UInt), 8, 1};
  }
  return {};
}

namespace {

// DLPack device types (dlpack.h's DLDeviceType), spelled out: nanobind's tags differ by version.
constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;
constexpr int kDLCUDAHost = 3;
constexpr int kDLROCM = 10;
constexpr int kDLCUDAManaged = 13;

std::string device_type_name(int type) {
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    case kDLROCM: return "rocm";
    default: return "device type " + std::to_string(type);
  }
}

template <class List>
std::string join(const List& values) {
  std::ostringstream os;
  os << '[';
  bool first = true;
  for (auto v : values) {
    os << (first ? "" : ", ") << v;
    first = false;
  }
  os << ']';
  return os.str();
}

}  // namespace

std::string dtype_name(nb::dlpack::dtype d) {
  std::string base;
  // DLPack's float8 codes (newer than some nanobind versions' enum).
  if (d.code == 10 && d.bits == 8) return "float8_e4m3fn";
  if (d.code == 12 && d.bits == 8) return "float8_e5m2";
  switch (static_cast<dtype_code>(d.code)) {
    case dtype_code::Int: base = "int"; break;
    case dtype_code::UInt: base = "uint"; break;
    case dtype_code::Float: base = "float"; break;
    case dtype_code::Bfloat: base = "bfloat"; break;
    case dtype_code::Complex: base = "complex"; break;
    case dtype_code::Bool: return "bool";
    default: base = "dtype code " + std::to_string(d.code) + " of "; break;
  }
  std::string name = base + std::to_string(d.bits);
  if (d.lanes != 1) name += "x" + std::to_string(d.lanes);
  return name;
}

ArrayArg::ArrayArg(const char* name, nb::ndarray<> array) : name_(name), array_(std::move(array)) {}

std::int64_t ArrayArg::shape(int i) const {
  const int n = ndim();
  return static_cast<std::int64_t>(array_.shape(static_cast<std::size_t>(i < 0 ? n + i : i)));
}

std::int64_t ArrayArg::stride(int i) const {
  const int n = ndim();
  const int k = i < 0 ? n + i : i;
  if (array_.stride_ptr() != nullptr) return array_.stride(static_cast<std::size_t>(k));
  std::int64_t s = 1;  // no strides in the descriptor: compact row-major
  for (int d = k + 1; d < n; ++d) s *= shape(d);
  return s;
}

std::string ArrayArg::device_name() const {
  const std::string type = device_type_name(device_type());
  return device_type() == kDLCPU ? type : type + ":" + std::to_string(device_id());
}

std::string ArrayArg::shape_str() const {
  std::vector<std::int64_t> v;
  for (int i = 0; i < ndim(); ++i) v.push_back(shape(i));
  return join(v);
}

std::string ArrayArg::strides_str() const {
  std::vector<std::int64_t> v;
  for (int i = 0; i < ndim(); ++i) v.push_back(stride(i));
  return join(v);
}

const ArrayArg& ArrayArg::expect_dtype(Dtype want) const {
  const nb::dlpack::dtype w = dlpack_dtype(want);
  if (array_.dtype() != w) {
    throw nb::type_error((std::string(name_) + ".dtype = " + dtype_name(array_.dtype()) + " must be " + dtype_name(w))
                             .c_str());
  }
  return *this;
}

const ArrayArg& ArrayArg::expect_ndim(std::initializer_list<int> allowed, const char* form) const {
  for (int n : allowed) {
    if (ndim() == n) return *this;
  }
  throw nb::value_error((std::string(name_) + ".shape = " + shape_str() + " must be " + form).c_str());
}

const ArrayArg& ArrayArg::expect_dim(int i, std::int64_t want, const std::string& what) const {
  if (shape(i) != want) {
    std::ostringstream os;
    os << name_ << ".shape[" << (i < 0 ? ndim() + i : i) << "] = " << shape(i) << " must be " << want << " ("
       << what << "); " << name_ << ".shape = " << shape_str();
    throw nb::value_error(os.str().c_str());
  }
  return *this;
}

const ArrayArg& ArrayArg::expect_contiguous() const {
  if (numel() == 0) return *this;
  std::int64_t want = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape(i) != 1 && stride(i) != want) {
      throw nb::value_error((std::string(name_) + " must be contiguous: shape " + shape_str() + " has strides " +
                             strides_str() + " (elements); pass a contiguous tensor (e.g. .contiguous())")
                                .c_str());
    }
    want *= shape(i);
  }
  return *this;
}

const ArrayArg& ArrayArg::expect_unit_last_stride() const {
  if (ndim() > 0 && shape(-1) != 1 && stride(-1) != 1) {
    throw nb::value_error((std::string(name_) + ".stride(-1) = " + std::to_string(stride(-1)) +
                           " must be 1 (its rows must be contiguous); strides " + strides_str())
                              .c_str());
  }
  return *this;
}

const ArrayArg& ArrayArg::expect_same_device(const ArrayArg& other) const {
  if (device_type() != other.device_type() || device_id() != other.device_id()) {
    throw nb::value_error((std::string(name_) + " is on " + device_name() + " but " + other.name() + " is on " +
                           other.device_name() + "; every tensor of one call must be on the same device")
                              .c_str());
  }
  return *this;
}

const ArrayArg& ArrayArg::expect_cuda() const {
  if (device_type() != kDLCUDA && device_type() != kDLCUDAManaged) {
    throw nb::value_error((std::string(name_) + " is on " + device_name() +
                           "; spgraph's ops run on CUDA device memory (cuda or cuda_managed)")
                              .c_str());
  }
  return *this;
}

DeviceScope::DeviceScope(int device) {
  SPG_CUDA_TRY(cudaGetDevice(&previous_));
  if (previous_ == device) {
    previous_ = -1;
    return;
  }
  SPG_CUDA_TRY(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

namespace {

/// What torch_view compares a tensor's attributes with, fetched from the loaded torch module once
/// (new references, kept for the process).
struct TorchObjects {
  PyTypeObject* tensor{nullptr};  // torch._C.TensorBase: every torch.Tensor (and subclass)
  PyObject* strided{nullptr};     // torch.strided
  PyObject* to_dlpack{nullptr};   // torch.utils.dlpack.to_dlpack: the C-level export, no Python wrapper
  std::vector<PyObject*> dtypes;  // the torch dtypes DLPack names and the ops may see (all real)
  // The attribute names torch_view reads, interned once: a lookup by a str object skips building
  // and hashing one from a C string on each access (4 accesses a tensor).
  PyObject* requires_grad{nullptr};
  PyObject* is_neg{nullptr};
  PyObject* layout{nullptr};
  PyObject* dtype{nullptr};
};

/// torch's objects, or nullptr while torch is not imported (then no torch tensor can exist).
const TorchObjects* torch_objects() noexcept {
  static TorchObjects objects;
  static bool ready = false;
  if (ready) return &objects;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return nullptr;
  PyObject* c = PyObject_GetAttrString(torch, "_C");
  PyObject* base = c != nullptr ? PyObject_GetAttrString(c, "TensorBase") : nullptr;
  Py_XDECREF(c);
  PyObject* strided = PyObject_GetAttrString(torch, "strided");
  PyObject* to_dlpack = nullptr;
  if (PyObject* utils = PyImport_ImportModule("torch.utils.dlpack")) {
    to_dlpack = PyObject_GetAttrString(utils, "to_dlpack");
    Py_DECREF(utils);
  }
  if (base == nullptr || !PyType_Check(base) || strided == nullptr || to_dlpack == nullptr) {
    PyErr_Clear();
    Py_XDECREF(base);
    Py_XDECREF(strided);
    Py_XDECREF(to_dlpack);
    return nullptr;  // not the torch this path knows: DLPack for everything
  }
  for (const char* name : {"bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                           "bool"}) {
    PyObject* o = PyObject_GetAttrString(torch, name);
    if (o == nullptr) {
      PyErr_Clear();
      continue;
    }
    objects.dtypes.push_back(o);
  }
  PyObject** const attr_names[] = {&objects.requires_grad, &objects.is_neg, &objects.layout, &objects.dtype};
  const char* const spelled[] = {"requires_grad", "is_neg", "layout", "dtype"};
  static_assert(std::size(attr_names) == std::size(spelled));
  for (std::size_t i = 0; i < std::size(attr_names); ++i) {
    *attr_names[i] = PyUnicode_InternFromString(spelled[i]);
    if (*attr_names[i] == nullptr) {
      PyErr_Clear();
      return nullptr;  // (the interned names made so far stay: a few bytes, once)
    }
  }
  objects.tensor = reinterpret_cast<PyTypeObject*>(base);
  objects.strided = strided;
  objects.to_dlpack = to_dlpack;
  ready = true;
  return &objects;
}

/// obj.name, or obj.name() when `call` (a method call without a bound-method object); a new
/// reference, nullptr (error cleared) on failure.
PyObject* attr(PyObject* obj, PyObject* name, bool call) noexcept {
  PyObject* v = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
  if (v == nullptr) PyErr_Clear();
  return v;
}

/// True when obj.name (obj.name() when `call`) is the object `want`; false on any failure.
bool attr_is(PyObject* obj, PyObject* name, bool call, PyObject* want) noexcept {
  PyObject* v = attr(obj, name, call);
  const bool is = v != nullptr && v == want;
  Py_XDECREF(v);
  return is;
}

}  // namespace

bool torch_view(nb::handle h, nb::ndarray<>& out) noexcept {
  PyObject* o = h.ptr();
  if (o == nullptr) return false;
  const TorchObjects* t = torch_objects();
  if (t == nullptr || PyObject_TypeCheck(o, t->tensor) == 0) return false;
  // A dtype DLPack names (the real ones the ops see), then what torch's __dlpack__ refuses or
  // exports otherwise stays on that path: a tensor that requires grad, a negative view (a real
  // tensor can carry that bit: the .imag of a conjugate view), another layout. The conjugate bit
  // needs no check: torch sets it only on complex tensors, which the dtype has refused.
  PyObject* dtype = attr(o, t->dtype, false);
  bool known = false;
  for (PyObject* d : t->dtypes) known = known || d == dtype;
  Py_XDECREF(dtype);
  if (!known || !attr_is(o, t->requires_grad, false, Py_False) || !attr_is(o, t->is_neg, true, Py_False) ||
      !attr_is(o, t->layout, false, t->strided)) {
    return false;
  }
  // The export itself: torch's C-level DLPack export (torch.utils.dlpack.to_dlpack: no stream
  // hand-shake, no Python-level wrapper), imported by nanobind, which owns the export from here
  // on (the export holds a reference to the tensor). A tensor without storage (meta) is refused
  // there and goes to __dlpack__ for its error.
  PyObject* capsule = PyObject_CallOneArg(t->to_dlpack, o);
  if (capsule == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool ok = false;
  try {
    out = nb::cast<nb::ndarray<>>(nb::handle(capsule));
    ok = true;
  } catch (...) {
    PyErr_Clear();
  }
  Py_DECREF(capsule);
  return ok;
}

bool is_array(nb::handle h) {
  return PyCapsule_CheckExact(h.ptr()) || PyObject_HasAttrString(h.ptr(), "__dlpack__") == 1 ||
         PyObject_CheckBuffer(h.ptr()) == 1;
}

bool is_host(const ArrayArg& a) { return a.device_type() == kDLCPU; }

int checked_int(const char* name, std::int64_t v, std::int64_t lo, std::int64_t hi) {
  if (v < lo || v > hi) {
    std::ostringstream os;
    os << name << " = " << v << " must be in [" << lo << ", " << hi << "]";
    throw nb::value_error(os.str().c_str());
  }
  return static_cast<int>(v);
}

std::string py_type_name(nb::handle v) { return nb::type_name(v.type()).c_str(); }

std::int64_t int_value(nb::handle v, const std::string& what) {
  if (PyBool_Check(v.ptr()) || PyIndex_Check(v.ptr()) == 0) {
    throw nb::type_error((what + " must be an int, not " + py_type_name(v)).c_str());
  }
  int overflow = 0;
  long long x = 0;
  if (PyLong_Check(v.ptr())) {
    x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  } else {
    const nb::object index = nb::steal(PyNumber_Index(v.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  }
  if (overflow != 0) throw nb::value_error((what + " does not fit in 64 bits").c_str());
  if (x == -1 && PyErr_Occurred() != nullptr) throw nb::python_error();
  return x;
}

int int_value(nb::handle v, const std::string& what, std::int64_t lo, std::int64_t hi) {
  return checked_int(what.c_str(), int_value(v, what), lo, hi);
}

double float_value(nb::handle v, const std::string& what) {
  if (PyFloat_Check(v.ptr())) return PyFloat_AS_DOUBLE(v.ptr());
  if (!PyBool_Check(v.ptr()) && (PyLong_Check(v.ptr()) || PyIndex_Check(v.ptr()) != 0 ||
                                 PyObject_HasAttrString(v.ptr(), "__float__") == 1)) {
    const double x = PyFloat_AsDouble(v.ptr());
    if (x == -1.0 && PyErr_Occurred() != nullptr) throw nb::python_error();
    return x;
  }
  throw nb::type_error((what + " must be a float, not " + py_type_name(v)).c_str());
}

bool bool_value(nb::handle v, const std::string& what) {
  if (PyBool_Check(v.ptr())) return v.ptr() == Py_True;
  if (std::string(py_type_name(v)) == "numpy.bool" || std::string(py_type_name(v)) == "numpy.bool_") {
    return PyObject_IsTrue(v.ptr()) == 1;
  }
  throw nb::type_error((what + " must be a bool, not " + py_type_name(v)).c_str());
}

nb::object required_attr(nb::handle obj, const char* name, const std::string& what) {
  PyObject* v = PyObject_GetAttrString(obj.ptr(), name);
  if (v == nullptr) {
    PyErr_Clear();
    throw nb::type_error((what + "." + name + " is missing: " + what + " is a " + py_type_name(obj) +
                          " without that attribute")
                             .c_str());
  }
  return nb::steal(v);
}

}  // namespace spg::python
