// Owners of CUDA handles: see resources.hpp.
#include "spgraph/core/resources.hpp"

#include <cstdio>
#include <sstream>

namespace spg::core {

namespace detail {
void report_release_failure(const char* what, cudaError_t status) noexcept {
  if (status == cudaSuccess || status == cudaErrorCudartUnloading) {
    return;
  }
  std::fprintf(stderr, "spgraph: releasing %s failed: %s\n", what, cudaGetErrorName(status));
}
[[noreturn]] void throw_allocation_failure(const char* what, std::size_t bytes, cudaError_t status) {
  (void)cudaGetLastError();
  std::ostringstream os;
  os << __FILE__ << ':' << __LINE__ << ": allocating a " << what << " of " << bytes << " B failed with " << cudaGetErrorName(status) << " ("
     << cudaGetErrorString(status) << ')';
  throw CudaError(status, os.str());
}

}  // namespace detail

Stream::Stream() { SPG_CUDA_TRY(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (handle_ != nullptr) {
    detail::report_release_failure("stream", cudaStreamDestroy(handle_));
  }
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) {
      detail::report_release_failure("stream", cudaStreamDestroy(handle_));
    }
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const { SPG_CUDA_TRY(cudaStreamSynchronize(handle_)); }

Event::Event(bool timing) {
  SPG_CUDA_TRY(cudaEventCreateWithFlags(&handle_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (handle_ != nullptr) {
    detail::report_release_failure("event", cudaEventDestroy(handle_));
  }
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) {
      detail::report_release_failure("event", cudaEventDestroy(handle_));
    }
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) const { SPG_CUDA_TRY(cudaEventRecord(handle_, stream)); }
void Event::synchronize() const { SPG_CUDA_TRY(cudaEventSynchronize(handle_)); }

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0F;
  SPG_CUDA_TRY(cudaEventElapsedTime(&ms, start.get(), handle_));
  return ms;
}

bool cuda_device_available() noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace spg::core
