// Stage-in: see stage_in.hpp.
#include "spgraph/kernels/stage_in/stage_in.hpp"

#include <cstdint>

#include "spgraph/core/error.hpp"
#include "spgraph/kernels/stage_in/stage_in_kernel.cuh"

namespace spg::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxCtas = 16;  // 4096 threads: a 64 KiB block in one round trip over the bus

__global__ void __launch_bounds__(kThreads) stage_in_kernel(const uint4* __restrict__ staging, uint4* __restrict__ meta,
                                                             int vectors, StatusBlock* status, StagingRelease release) {
  const int tid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const std::uint32_t sequence = threadIdx.x == 0 ? detail::staging_sequence(release) : 0;
  if (tid == 0) detail::fold_step_faults(status);
  for (int i = tid; i < vectors; i += static_cast<int>(gridDim.x * blockDim.x)) meta[i] = staging[i];
  detail::release_staging(release, sequence, true);
}

}  // namespace

void StageIn::can_implement(const void* staging, const void* meta, std::size_t bytes, const StatusBlock* status,
                            const StagingRelease& release) {
  SPG_EXPECTS((release.sequence == nullptr) == (release.released == nullptr) &&
                  (release.released == nullptr || release.arrivals != nullptr),
              "StageIn: release needs sequence, released and arrivals together (or none)");
  SPG_EXPECTS(staging != nullptr && meta != nullptr && status != nullptr,
              "StageIn: staging, meta and status must not be null");
  SPG_EXPECTS(reinterpret_cast<std::uintptr_t>(staging) % 16 == 0 && reinterpret_cast<std::uintptr_t>(meta) % 16 == 0 &&
                  reinterpret_cast<std::uintptr_t>(status) % alignof(StatusBlock) == 0,
              "StageIn: staging and meta must be 16-byte aligned, status " << alignof(StatusBlock) << "-byte aligned");
  SPG_EXPECTS(bytes > 0 && bytes % 16 == 0 && bytes / 16 <= static_cast<std::size_t>(INT32_MAX),
              "StageIn: bytes = " << bytes << " must be a positive multiple of 16 below 2^35");
  cudaPointerAttributes attr{};
  SPG_CUDA_TRY(cudaPointerGetAttributes(&attr, staging));
  SPG_EXPECTS(attr.type == cudaMemoryTypeHost || attr.type == cudaMemoryTypeDevice,
              "StageIn: staging must be pinned host memory or device memory (cudaPointerGetAttributes type "
                  << static_cast<int>(attr.type) << ")");
}

cudaError_t StageIn::run(const void* staging, void* meta, std::size_t bytes, StatusBlock* status, cudaStream_t stream,
                         const StagingRelease& release) noexcept {
  const int vectors = static_cast<int>(bytes / 16);
  const int ctas = vectors / kThreads + 1 < kMaxCtas ? vectors / kThreads + 1 : kMaxCtas;
  stage_in_kernel<<<ctas, kThreads, 0, stream>>>(static_cast<const uint4*>(staging), static_cast<uint4*>(meta), vectors,
                                                 status, release);
  return cudaGetLastError();
}

}  // namespace spg::kernels
