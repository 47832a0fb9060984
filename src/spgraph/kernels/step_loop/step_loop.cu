// Step loop: see step_loop.hpp.
#include "spgraph/kernels/step_loop/step_loop.hpp"

#include "spgraph/core/error.hpp"
#include "spgraph/kernels/alignment.hpp"
#include "spgraph/kernels/step_loop/step_loop_kernel.cuh"

namespace spg::kernels {

namespace {
constexpr int kHeadThreads = 128;
constexpr int kCopyThreads = 256;
constexpr int kCopyMaxCtas = 16;  // as the stage-in: a 64 KiB block in one round trip over the bus

}  // namespace

void StepLoop::can_implement(const StepLoopArgs& a) {
  SPG_EXPECTS(a.staging != nullptr && a.state != nullptr && a.chunk_meta != nullptr && a.status != nullptr,
              "StepLoop: staging, state, chunk_meta and status must not be null");
  SPG_EXPECTS(aligned(a.staging, 16) && aligned(a.state, 16) && aligned(a.chunk_meta, 16),
              "StepLoop: staging, state and chunk_meta must be 16-byte aligned");
  SPG_EXPECTS(a.max_chunks >= 0, "StepLoop: max_chunks = " << a.max_chunks << " must be at least 0");
  SPG_EXPECTS(a.header_words == StepStateWords::header_words(a.max_chunks),
              "StepLoop: header_words = " << a.header_words << " must be " << StepStateWords::header_words(a.max_chunks));
  SPG_EXPECTS((a.release.sequence == nullptr) == (a.release.released == nullptr) &&
                  (a.release.released == nullptr || a.release.arrivals != nullptr),
              "StepLoop: release needs sequence, released and arrivals together (or none)");
  SPG_EXPECTS(a.chunk_bytes > 0 && a.chunk_bytes % 16 == 0 && a.chunk_bytes / 16 <= static_cast<std::size_t>(INT32_MAX),
              "StepLoop: chunk_bytes = " << a.chunk_bytes << " must be a positive multiple of 16 below 2^35");
}

cudaError_t StepLoop::run_head(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept {
  detail::step_head_kernel<<<1, kHeadThreads, 0, stream>>>(a.staging, a.state, a.status, c);
  return cudaGetLastError();
}

cudaError_t StepLoop::run_next(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept {
  detail::step_next_kernel<<<1, 1, 0, stream>>>(a.state, c);
  return cudaGetLastError();
}

cudaError_t StepLoop::run_chunk_stage_in(const StepLoopArgs& a, cudaStream_t stream) noexcept {
  const int vectors = static_cast<int>(a.chunk_bytes / 16);
  const int ctas = vectors / kCopyThreads + 1 < kCopyMaxCtas ? vectors / kCopyThreads + 1 : kCopyMaxCtas;
  detail::chunk_stage_in_kernel<<<ctas, kCopyThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(a.staging + a.header_words), a.state, static_cast<uint4*>(a.chunk_meta), vectors);
  return cudaGetLastError();
}

cudaError_t StepLoop::run_tail(const StepLoopArgs& a, cudaStream_t stream) noexcept {
  detail::step_tail_kernel<<<1, 1, 0, stream>>>(a.release);
  return cudaGetLastError();
}

}  // namespace spg::kernels
