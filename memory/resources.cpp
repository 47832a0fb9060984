// Owners of CUDA handles: see resources.hpp.
#include "memory/resources.hpp"

#include <cstdio>

namespace spg::memory {

namespace detail {
void report_release_failure(const char* what, cudaError_t status) noexcept {
  if (status == cudaSuccess || status == cudaErrorCudartUnloading) {
    return;
  }
  std::fprintf(stderr, "spgraph: releasing %s failed: %s\n", what, cudaGetErrorName(status));
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

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) {
    SPG_CUDA_TRY(cudaMalloc(&data_, bytes));
  }
}

DeviceBuffer::~DeviceBuffer() { release(); }

void DeviceBuffer::release() noexcept {
  if (data_ != nullptr) {
    detail::report_release_failure("device buffer", cudaFree(data_));
    data_ = nullptr;
    bytes_ = 0;
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) {
    SPG_CUDA_TRY(cudaHostAlloc(&data_, bytes, cudaHostAllocDefault));
  }
}

PinnedBuffer::~PinnedBuffer() { release(); }

void PinnedBuffer::release() noexcept {
  if (data_ != nullptr) {
    detail::report_release_failure("pinned buffer", cudaFreeHost(data_));
    data_ = nullptr;
    bytes_ = 0;
  }
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
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

}  // namespace spg::memory
