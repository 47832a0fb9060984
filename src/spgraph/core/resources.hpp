// Move-only owners of CUDA handles (stream, event, device and pinned-host memory).
//
// Every raw CUDA handle in spgraph lives in one of these. Destructors are noexcept and tolerate
// cudaErrorCudartUnloading (the runtime may already be gone at static destruction).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "spgraph/core/error.hpp"

namespace spg::core {

namespace detail {
/// Reports a failed release from a destructor on stderr (unloading runtime excepted), never a throw.
void report_release_failure(const char* what, cudaError_t status) noexcept;
}  // namespace detail

/// @brief A non-blocking CUDA stream (never the legacy default stream).
class Stream {
 public:
  /// @throws CudaError when the stream cannot be created.
  Stream();
  ~Stream();
  Stream(Stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  [[nodiscard]] cudaStream_t get() const noexcept { return handle_; }
  /// @throws CudaError if any work on the stream failed.
  void synchronize() const;

 private:
  cudaStream_t handle_{nullptr};
};

/// @brief A CUDA event; timing enabled unless asked otherwise.
class Event {
 public:
  explicit Event(bool timing = true);
  ~Event();
  Event(Event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  [[nodiscard]] cudaEvent_t get() const noexcept { return handle_; }
  void record(cudaStream_t stream) const;
  void synchronize() const;
  /// Milliseconds from `start` to this event (both must have completed).
  [[nodiscard]] float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t handle_{nullptr};
};

namespace detail {
/// How a Buffer gets and returns its bytes: device memory (cudaMalloc) or page-locked host
/// memory (cudaHostAlloc).
struct DeviceMemory {
  static cudaError_t allocate(void** p, std::size_t bytes) noexcept { return cudaMalloc(p, bytes); }
  static cudaError_t free(void* p) noexcept { return cudaFree(p); }
  static constexpr const char* kName = "device buffer";
};
struct PinnedMemory {
  static cudaError_t allocate(void** p, std::size_t bytes) noexcept {
    return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
  }
  static cudaError_t free(void* p) noexcept { return cudaFreeHost(p); }
  static constexpr const char* kName = "pinned buffer";
};
[[noreturn]] void throw_allocation_failure(const char* what, std::size_t bytes, cudaError_t status);
}  // namespace detail

/// @brief Owns `bytes` of memory from one allocation of kind `Memory`; move-only.
template <class Memory>
class Buffer {
 public:
  Buffer() = default;
  /// @throws CudaError naming the kind and the size when the allocation fails.
  explicit Buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t status = Memory::allocate(&data_, bytes);
    if (status != cudaSuccess) {
      data_ = nullptr;
      detail::throw_allocation_failure(Memory::kName, bytes, status);
    }
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) {
      detail::report_release_failure(Memory::kName, Memory::free(data_));
      data_ = nullptr;
      bytes_ = 0;
    }
  }
  void* data_{nullptr};
  std::size_t bytes_{0};
};

/// @brief Device memory from one cudaMalloc.
using DeviceBuffer = Buffer<detail::DeviceMemory>;
/// @brief Page-locked host memory from one cudaHostAlloc.
using PinnedBuffer = Buffer<detail::PinnedMemory>;

/// @brief True when at least one CUDA device is usable from this process.
[[nodiscard]] bool cuda_device_available() noexcept;

}  // namespace spg::core
