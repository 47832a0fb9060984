// See device_info.hpp.
#include "spgraph/core/device_info.hpp"

#include <array>

namespace spg::core {

namespace {

constexpr int kCachedDevices = 64;
// Per device: 0 until queried, then kQueried | L2 KiB << 32 | sms << 16 | major << 8 | minor.
constexpr std::uint64_t kQueried = std::uint64_t{1} << 63;
std::array<std::atomic<std::uint64_t>, kCachedDevices> g_info{};

}  // namespace

cudaError_t current_device_info(DeviceInfo& info) noexcept {
  cudaError_t status = cudaGetDevice(&info.device);
  if (status != cudaSuccess) return status;
  const bool cached = info.device >= 0 && info.device < kCachedDevices;
  if (cached) {
    const std::uint64_t v = g_info[static_cast<std::size_t>(info.device)].load(std::memory_order_acquire);
    if (v != 0) {
      info.l2_bytes = static_cast<std::int64_t>(v >> 32 & 0x7FFFFFFFU) * 1024;
      info.sms = static_cast<int>(v >> 16 & 0xFFFFU);
      info.major = static_cast<int>(v >> 8 & 0xFFU);
      info.minor = static_cast<int>(v & 0xFFU);
      return cudaSuccess;
    }
  }
  status = cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, info.device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, info.device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&info.minor, cudaDevAttrComputeCapabilityMinor, info.device);
  int l2 = 0;
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, info.device);
  if (status != cudaSuccess) return status;
  info.l2_bytes = std::int64_t{l2 / 1024} * 1024;  // as the cache gives it back
  // What the cache holds: the SM count in 16 bits, the L2 size in whole KiB (31 bits).
  if (cached && info.sms >= 0 && info.sms <= 0xFFFF && l2 >= 0) {
    g_info[static_cast<std::size_t>(info.device)].store(kQueried | std::uint64_t(l2 / 1024) << 32 |
                                                            std::uint64_t(info.sms) << 16 |
                                                            std::uint64_t(info.major & 0xFF) << 8 |
                                                            std::uint64_t(info.minor & 0xFF),
                                                        std::memory_order_release);
  }
  return cudaSuccess;
}

cudaError_t allow_dynamic_smem_once(const void* kernel, int bytes, const DeviceInfo& info,
                                    std::atomic<std::uint64_t>& done) noexcept {
  const bool tracked = info.device >= 0 && info.device < kCachedDevices;
  const std::uint64_t bit = tracked ? std::uint64_t{1} << info.device : 0;
  if (tracked && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess && tracked) done.fetch_or(bit, std::memory_order_acq_rel);
  return status;
}

}  // namespace spg::core
