// Move-only owners of CUDA handles (stream, event, device and pinned-host memory).
//
// Every raw CUDA handle in spgraph lives in one of these. Destructors are noexcept and tolerate
// cudaErrorCudartUnloading (the runtime may already be gone at static destruction).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "memory/error.hpp"

namespace spg::memory {

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

/// @brief Owns `bytes` of device memory from one cudaMalloc.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void release() noexcept;
  void* data_{nullptr};
  std::size_t bytes_{0};
};

/// @brief Owns `bytes` of page-locked host memory from one cudaHostAlloc.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void release() noexcept;
  void* data_{nullptr};
  std::size_t bytes_{0};
};

/// @brief True when at least one CUDA device is usable from this process.
[[nodiscard]] bool cuda_device_available() noexcept;

}  // namespace spg::memory
