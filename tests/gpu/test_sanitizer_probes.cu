// What compute-sanitizer's racecheck models, on the one ordering the attention kernel relies on and
// the tool reports: a named-barrier hand-off. One warpgroup stores to shared memory and
// announces it with `bar.arrive id, 256`; the other waits with `bar.sync id, 256` and loads. PTX
// orders the arriving threads' prior stores before the waiting threads' later loads (the
// producer-consumer form of bar.arrive), and the wgmma kernel passes its row maxima between its two
// consumer warpgroups exactly so (kWgBarM0 / kWgBarM1 in sparse_mla_wgmma_kernel.cuh).
//
// The cases run the hand-off twice, with bar.arrive and, as the control, with bar.sync on both
// sides, many times over with new values each round, and check every value loaded. Run under
// racecheck (scripts/compute_sanitizer.sh runs them): hazards reported on the arrive form and none
// on the control are the tool's view of bar.arrive, the same report it gives on the attention
// kernel's row maxima, not a race in the protocol.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla_device.cuh"
#include "spgraph/kernels/sparse_mla/wgmma_sm90.cuh"

namespace {

namespace d = spg::kernels::detail;

constexpr int kRounds = 64;
constexpr int kBarData = 1;  // named barrier ids, as in the kernel: 0 is __syncthreads
constexpr int kBarFree = 2;

/// A CTA of 384 threads, as the attention kernel's: threads 128..255 write round r's values,
/// threads 0..127 read them, and the third warpgroup (the kernel's producer) takes no part in the
/// named barriers, so their count (256) is not the whole CTA. `arrive` picks bar.arrive for
/// the writers' side of the data barrier (the attention kernel's form) or bar.sync (the control).
/// The free barrier orders the next round's stores after this round's loads the same way.
__global__ void __launch_bounds__(384) handoff_kernel(bool arrive, int seed, int* mismatches) {
  __shared__ int values[128];
  const int tid = static_cast<int>(threadIdx.x);
  if (tid >= 256) return;
  int bad = 0;
  for (int r = 0; r < kRounds; ++r) {
    if (tid >= 128) {
      if (r > 0) d::named_barrier(kBarFree, 256);
      values[tid - 128] = seed + 131 * r + tid;
      if (arrive) {
        d::named_barrier_arrive(kBarData, 256);
      } else {
        d::named_barrier(kBarData, 256);
      }
    } else {
      d::named_barrier(kBarData, 256);
      bad += values[tid] != seed + 131 * r + tid + 128 ? 1 : 0;
      if (r + 1 < kRounds) {
        if (arrive) {
          d::named_barrier_arrive(kBarFree, 256);
        } else {
          d::named_barrier(kBarFree, 256);
        }
      }
    }
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

int run_handoff(bool arrive, int seed) {
  spg::core::DeviceBuffer buffer(sizeof(int));
  auto* mismatches = static_cast<int*>(buffer.data());
  SPG_CUDA_TRY(cudaMemset(mismatches, 0, sizeof(int)));
  handoff_kernel<<<1, 384>>>(arrive, seed, mismatches);
  SPG_CUDA_TRY(cudaGetLastError());
  int host = -1;
  SPG_CUDA_TRY(cudaMemcpy(&host, mismatches, sizeof(int), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace

TEST_CASE("sanitizer probe: a bar.arrive / bar.sync hand-off orders shared stores before loads",
          "[gpu][sanitizer-probe]") {
  CHECK(run_handoff(true, 1000) == 0);
  CHECK(run_handoff(true, -77) == 0);
}

TEST_CASE("sanitizer probe: the same hand-off with bar.sync on both sides (control)", "[gpu][sanitizer-probe]") {
  CHECK(run_handoff(false, 1000) == 0);
  CHECK(run_handoff(false, -77) == 0);
}
