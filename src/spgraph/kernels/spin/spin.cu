// See spin.hpp.
#include "spgraph/kernels/spin/spin.hpp"

namespace spg::kernels {

namespace {

__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned long long t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 >= ns) break;
  }
}

}  // namespace

cudaError_t launch_spin(unsigned long long ns, cudaStream_t stream) noexcept {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

}  // namespace spg::kernels
