// The spgraph._spgraph extension module: the ops over DLPack arrays, the configs and the planner,
// the executor over engine-owned arrays, the scheduler and serve_loop's synthetic front, and the
// translation of spgraph's C++ errors into Python exceptions (docs/python.md, "Errors").
#include <nanobind/nanobind.h>

#include "buffers.hpp"
#include "config.hpp"
#include "executor.hpp"
#include "spgraph/core/error.hpp"
#include "ops.hpp"
#include "scheduler.hpp"
#include "synthetic.hpp"

namespace nb = nanobind;

namespace {

PyObject* g_cuda_error = nullptr;  // spgraph.CudaError, a RuntimeError

// spg::InvalidArgument -> ValueError (its message names the argument, its value and its bound),
// CapacityError -> MemoryError, StateError -> RuntimeError, CudaError -> spgraph.CudaError.
void translate(const std::exception_ptr& p, void* /*payload*/) {
  try {
    std::rethrow_exception(p);
  } catch (const spg::CudaError& e) {
    PyErr_SetString(g_cuda_error, e.what());
  } catch (const spg::InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const spg::CapacityError& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const spg::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace

NB_MODULE(_spgraph, m) {
  m.doc() = "spgraph's ops and executor over DLPack arrays (zero-copy); use the spgraph and spgraph.torch modules.";
  g_cuda_error = PyErr_NewExceptionWithDoc("spgraph.CudaError",
                                           "A CUDA call made by spgraph failed; the message names the call and "
                                           "the CUDA error.",
                                           PyExc_RuntimeError, nullptr);
  m.attr("CudaError") = nb::handle(g_cuda_error);
  nb::register_exception_translator(translate);
  spg::python::bind_ops(m);
  spg::python::bind_config(m);
  spg::python::bind_buffers(m);
  spg::python::bind_executor(m);
  spg::python::bind_scheduler(m);
  spg::python::bind_synthetic(m);
}
