// A static NVTX injection for the test binaries: it stands where Nsight Systems would, and records
// the ranges pushed and popped in the "spgraph" domain on the calling thread, so tests can check
// that the executor's ranges are named as documented and balanced on every exit path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spg::test {

struct NvtxRange {
  std::string name;          ///< the range's (registered or ASCII) message
  std::int64_t payload{-1};  ///< its int64 payload, -1 when it has none
  int depth{0};              ///< ranges of the domain open around it when it was pushed
};

/// The ranges of the "spgraph" domain since the last clear(), in push order.
class NvtxRecorder {
 public:
  /// True once NVTX has initialized this injection (at the process's first NVTX call): without
  /// it nothing is recorded and every check on the records would hold vacuously.
  [[nodiscard]] static bool attached();
  static void clear();
  [[nodiscard]] static std::vector<NvtxRange> pushed();
  [[nodiscard]] static int open();        ///< pushes minus pops since clear()
  [[nodiscard]] static int pops();        ///< pops since clear()
  [[nodiscard]] static bool underflow();  ///< a pop with no range open since clear()
};

}  // namespace spg::test
