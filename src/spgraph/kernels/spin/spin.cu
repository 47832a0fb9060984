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

__global__ void gate_kernel(const unsigned* gate, unsigned open, unsigned long long timeout_ns) {
  unsigned long long t0 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned v = 0;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(gate) : "memory");
    if (v >= open) break;
    unsigned long long t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 >= timeout_ns) break;
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
