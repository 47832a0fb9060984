// Step loop: see step_loop.hpp.
#include "spgraph/kernels/step_loop/step_loop.hpp"

#include "spgraph/core/error.hpp"
#include "spgraph/kernels/alignment.hpp"
#include "spgraph/kernels/step_loop/step_loop_kernel.cuh"

namespace spg::kernels {

namespace {
// head: 64 CTAs keep 64 x 256 x 4 x 16 B = 1 MiB of the staging block's reads over the bus in
// flight; next: one 16-byte vector a thread for a block of up to 16 x 256 x 4 x 16 B = 256 KiB.
constexpr int kHeadMaxCtas = 64;
constexpr int kNextMaxCtas = 16;

int ctas_for(std::int64_t vectors, int max_ctas) noexcept {
  const std::int64_t per_cta = std::int64_t{detail::kStepCopyThreads};
  const std::int64_t n = (vectors + per_cta - 1) / per_cta;
  return static_cast<int>(n < 1 ? 1 : (n < max_ctas ? n : max_ctas));
}

int chunk_vectors(const StepLoopArgs& a) noexcept { return static_cast<int>(a.chunk_bytes / 16); }

}  // namespace

void StepLoop::can_implement(const StepLoopArgs& a) {
  SPG_EXPECTS(a.state != nullptr && a.chunk_meta != nullptr && a.status != nullptr && a.step_meta != nullptr,
              "StepLoop: state, step_meta, chunk_meta and status must not be null");
  SPG_EXPECTS(aligned(a.staging, 16) && aligned(a.state, 16) && aligned(a.chunk_meta, 16) && aligned(a.step_meta, 16),
              "StepLoop: staging, state, step_meta and chunk_meta must be 16-byte aligned");
  SPG_EXPECTS(a.staging != nullptr || a.release.released == nullptr,
              "StepLoop: a release needs a staging block (a staged step run again has none)");
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
  const int vectors = chunk_vectors(a);
  // Without a staging block (a staged step run again) head copies nothing: one CTA.
  const int ctas =
      a.staging == nullptr ? 1 : ctas_for(std::int64_t{a.max_chunks} * vectors / detail::kStepCopyUnroll, kHeadMaxCtas);
  const uint4* const chunks = a.staging == nullptr ? nullptr : reinterpret_cast<const uint4*>(a.staging + a.header_words);
  detail::step_head_kernel<<<ctas, detail::kStepCopyThreads, 0, stream>>>(a.staging, a.state, a.status, chunks,
                                                                          static_cast<uint4*>(a.step_meta), vectors, c);
  return cudaGetLastError();
}

namespace {

/// next (kFast: the first loop's): a few CTAs copy the current chunk's block and advance the state.
template <bool kFast>
cudaError_t launch_next(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept {
  const int vectors = chunk_vectors(a);
  detail::step_next_kernel<kFast><<<ctas_for(vectors, kNextMaxCtas), detail::kStepCopyThreads, 0, stream>>>(
      static_cast<const uint4*>(a.step_meta), a.state, static_cast<uint4*>(a.chunk_meta), vectors, c);
  return cudaGetLastError();
}

}  // namespace

cudaError_t StepLoop::run_next(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept {
  return launch_next<false>(a, c, stream);
}

cudaError_t StepLoop::run_next_fast(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept {
  return launch_next<true>(a, c, stream);
}

cudaError_t StepLoop::run_tail(const StepLoopArgs& a, cudaStream_t stream) noexcept {
  detail::step_tail_kernel<<<1, 1, 0, stream>>>(a.release);
  return cudaGetLastError();
}

}  // namespace spg::kernels
