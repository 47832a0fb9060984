// spgraph._cupti: the process's CUPTI allocation counter (memory::AllocationCounter) from Python,
// in a module of its own so that importing spgraph never loads CUPTI: while a CUPTI subscriber
// exists, every cudaGraphLaunch leaves the driver's fast path (docs/graphs.md, "Host time per
// step"), so only a process that counts allocations pays for it. docs/python.md, "The executor".
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "spgraph/memory/allocation_counter.hpp"

namespace nb = nanobind;

namespace {

spg::memory::AllocationCounter& counter() { return spg::memory::AllocationCounter::instance(); }

}  // namespace

NB_MODULE(_cupti, m) {
  using namespace nb::literals;
  m.doc() = "The CUPTI allocation counter (AllocationCounter); use spgraph.allocation_counter().";
  // No exception translator here: spg::Error is a std::runtime_error, which nanobind raises as
  // RuntimeError already. Translators are kept in the internals nanobind shares between the
  // modules of one domain and are tried newest first, so a catch-all spg::Error translator
  // registered by this module would take every spgraph error of _spgraph too, turning its
  // ValueError (InvalidArgument) and MemoryError (CapacityError) into RuntimeError once
  // spgraph._cupti is imported (docs/python.md, "Errors").
  m.def("subscribe", [] { (void)counter(); },
        "Subscribes CUPTI to the CUDA allocation and free calls of the process (once; raises when another tool "
        "holds CUPTI's one subscription).");
  m.def("count", [] { return counter().count(); }, "Allocation and free calls counted since the last reset().");
  m.def("reset", [] { counter().reset(); }, "Zeroes the count and the names.");
  m.def("names", [] { return counter().names(); }, "The API functions counted since the last reset (first 16).");
  m.def("watched_callbacks", [] { return counter().watched_callbacks(); }, "How many API callbacks are watched.");
  m.def("attached", [] { return counter().attached(); }, "Whether CUPTI is attached (counting).");
  m.def("detach", [] { counter().detach(); },
        "Detaches CUPTI (unsubscribe + cuptiFinalize): graph launches return to their fast path; nothing is counted.");
  m.def("attach", [] { counter().attach(); }, "Attaches CUPTI again.");
}
