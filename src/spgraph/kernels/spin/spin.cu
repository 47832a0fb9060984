// See spin.hpp.
#include "spgraph/kernels/spin/spin.hpp"

namespace spg::kernels {

namespace {

/// The device's global timer, in nanoseconds.
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long t0 = global_timer_ns();
  while (global_timer_ns() - t0 < ns) {
  }
}

__global__ void gate_kernel(const unsigned* gate, unsigned open, unsigned long long timeout_ns) {
  const unsigned long long t0 = global_timer_ns();
  for (;;) {
    unsigned v = 0;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(gate) : "memory");
    if (v >= open || global_timer_ns() - t0 >= timeout_ns) break;
    __nanosleep(256);
  }
}

}  // namespace

cudaError_t launch_gate(const unsigned* gate, unsigned open, unsigned long long timeout_ns, cudaStream_t stream) noexcept {
  gate_kernel<<<1, 1, 0, stream>>>(gate, open, timeout_ns);
  return cudaGetLastError();
}

cudaError_t launch_spin(unsigned long long ns, cudaStream_t stream) noexcept {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

}  // namespace spg::kernels
