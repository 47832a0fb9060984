// What the launchers need to know about the current device, queried once per device.
//
// The ops size their grids from the SM count and pick kernels by compute capability on every
// run(); asking the driver each time (four attribute queries) is host work an eager step repeats
// for every kernel. The answers never change for a device, so they are cached per device index.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace spg::core {

struct DeviceInfo {
  int device{0};
  int sms{0};
  int major{0};
  int minor{0};
  std::int64_t l2_bytes{0};  ///< the L2 cache's size
};

/// The current device's index, SM count, compute capability and L2 size. The first call for a device
/// queries the driver; later calls read the cache (cudaGetDevice is the only CUDA call).
[[nodiscard]] cudaError_t current_device_info(DeviceInfo& info) noexcept;

/// Raises `kernel`'s dynamic shared memory limit to `bytes` (cudaFuncSetAttribute) on
/// `info.device`, once per device: `done` is the kernel's own set of devices already raised
/// (one static per kernel). Devices past 63 are raised on every call.
[[nodiscard]] cudaError_t allow_dynamic_smem_once(const void* kernel, int bytes, const DeviceInfo& info,
                                                  std::atomic<std::uint64_t>& done) noexcept;

}  // namespace spg::core
