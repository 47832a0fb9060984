// Host helpers of the sparse MLA GPU tests: seeded inputs, device copies, eager and
// captured-then-replayed launches, and the accuracy bars of docs/pipeline.md checked element by
// element against the double-precision CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu/captured_launch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/reference/accuracy.hpp"
#include "spgraph/kernels/reference/sparse_mla_reference.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"

namespace spg::test::mla {

// ---- numbers

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                    // round to nearest even
  return static_cast<std::uint16_t>(u >> 16);
}

inline float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// splitmix64: fast, seedable, good enough for test data.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e5d1ull) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi).
  double uniform(double lo = 0.0, double hi = 1.0) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  std::int64_t below(std::int64_t n) { return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); }
  /// Approximately normal (sum of four uniforms), mean 0, standard deviation 1.
  double normal() { return (uniform() + uniform() + uniform() + uniform() - 2.0) * 1.7320508075688772; }

 private:
  std::uint64_t s_;
};

/// Fills `n` bf16 values with amplitude * normal() + offset. Chunks of 2^20 values are seeded by
/// (seed, chunk), so the values do not depend on how many threads fill them.
inline std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed, double amplitude, double offset = 0.0) {
  std::vector<std::uint16_t> v(n);
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  const unsigned workers = static_cast<unsigned>(
      std::max<std::size_t>(1, std::min<std::size_t>({16, chunks, std::thread::hardware_concurrency()})));
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&, w]() {
      for (std::size_t c = w; c < chunks; c += workers) {
        Rng rng(seed * 1000003 + c);
        const std::size_t end = std::min(n, (c + 1) * kChunk);
        for (std::size_t i = c * kChunk; i < end; ++i) {
          const double x = amplitude * rng.normal() + offset;
          v[i] = f32_to_bf16(static_cast<float>(x == 0.0 ? 1e-3 : x));  // never exactly zero
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  return v;
}

inline std::vector<float> widen(std::span<const std::uint16_t> v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_f32(v[i]);
  return f;
}

/// Index values that every rule of docs/pipeline.md masks, for a given s_kv.
inline std::vector<std::int32_t> invalid_index_values(int s_kv) {
  return {std::numeric_limits<std::int32_t>::min(), -123456, -2, -1, s_kv, s_kv + 1,
          std::numeric_limits<std::int32_t>::max()};
}

// ---- device memory

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) : n_(n), buf_(std::max<std::size_t>(n, 1) * sizeof(T)) {}
  explicit DeviceArray(std::span<const T> host) : DeviceArray(host.size()) { upload(host); }
  void upload(std::span<const T> host) {
    SPG_EXPECTS(host.size() <= n_, "upload of " << host.size() << " into " << n_);
    if (!host.empty()) SPG_CUDA_TRY(cudaMemcpy(buf_.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    // A pageable copy may still be in flight on the legacy stream, which does not order against
    // the tests' non-blocking streams.
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0) SPG_CUDA_TRY(cudaMemcpy(h.data(), buf_.data(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  /// Copies elements [first, first + count) back.
  std::vector<T> download(std::size_t first, std::size_t count) const {
    std::vector<T> h(count);
    if (count > 0)
      SPG_CUDA_TRY(cudaMemcpy(h.data(), data() + first, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  /// 0xFF bytes: NaN for bf16 and f32. Synchronized: cudaMemset runs on the legacy stream, which
  /// does not order against the tests' non-blocking streams.
  void poison() {
    SPG_CUDA_TRY(cudaMemset(buf_.data(), 0xFF, std::max<std::size_t>(n_, 1) * sizeof(T)));
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }
  T* data() const { return static_cast<T*>(buf_.data()); }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_{0};
  core::DeviceBuffer buf_;
};

// ---- launches

enum class Mode { eager, graph };
inline const char* mode_name(Mode m) { return m == Mode::eager ? "eager" : "graph"; }

// ---- checks against the reference (docs/pipeline.md, "Accuracy bars")

struct Verdict {
  bool ok{true};
  std::string message;
};

inline std::string fmt(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

/// out: every element |err| <= 8e-4 or |err| / |ref| <= 2.4e-2 (NaN never passes), and
/// 1 - cos(out, ref) <= 1e-5 over the whole tensor; `looser` multiplies both element bars.
/// Elements are [token, head, 512] with tokens[i] naming token position i.
inline Verdict check_out(std::span<const std::uint16_t> got, std::span<const double> ref, int h_q,
                         std::span<const int> tokens, const std::string& what, double looser = 1.0) {
  if (got.size() != ref.size()) return {false, what + ": size " + std::to_string(got.size()) + " vs " + std::to_string(ref.size())};
  const spg::kernels::reference::AccuracyScore s = spg::kernels::reference::score_out(got, ref, looser);
  if (s.out_ok()) return {};
  const std::size_t row = s.worst_index / 512;
  std::ostringstream os;
  os << what << ": out worst element [token " << tokens[row / static_cast<std::size_t>(h_q)] << ", head "
     << row % static_cast<std::size_t>(h_q) << ", col " << s.worst_index % 512 << "] got "
     << fmt(bf16_to_f32(got[s.worst_index])) << " ref " << fmt(ref[s.worst_index]) << " (score " << s.worst
     << " of 1); 1 - cos = " << s.cos_diff;
  return {false, os.str()};
}

/// lse / max_logits: |err| <= 1e-4 or relative <= 3e-5; infinities must match exactly.
inline Verdict check_stat(std::span<const float> got, std::span<const double> ref, int h_q, std::span<const int> tokens,
                          const std::string& what) {
  if (got.size() != ref.size()) return {false, what + ": size mismatch"};
  const spg::kernels::reference::AccuracyScore s = spg::kernels::reference::score_stat(got, ref);
  if (s.stat_ok()) return {};
  std::ostringstream os;
  os << what << " worst element [token " << tokens[s.worst_index / static_cast<std::size_t>(h_q)] << ", head "
     << s.worst_index % static_cast<std::size_t>(h_q) << "] got " << fmt(got[s.worst_index]) << " ref "
     << fmt(ref[s.worst_index]) << " (score " << s.worst << " of 1)";
  return {false, os.str()};
}

// ---- wgmma building blocks (test_sparse_mla_wgmma_tiles.cu)

/// S = Q K^T [64 x 64] and O = bf16(S) K [64 x 512] with P from registers (o_rs) and from a
/// shared panel (o_ss), fp32, row-major.
struct WgmmaTileOutputs {
  std::vector<float> s;
  std::vector<float> o_rs;
  std::vector<float> o_ss;
  std::vector<std::uint32_t> panel_acc;   ///< the P panel (8 KiB) by store_acc_panel(S, 1, 1)
  std::vector<std::uint32_t> panel_frag;  ///< the P panel by store_a_frags_panel(the A fragments of S)
  std::vector<float> o_rs128;  ///< o_rs as four m64n128k16 products (128-column quarters)
  std::vector<float> o_ss128;  ///< o_ss the same way
};

/// Runs the wgmma tile kernel on bf16 tiles q and k, [64 x 512] row-major each (outputs
/// NaN-poisoned first). Needs an sm_90 device.
WgmmaTileOutputs run_wgmma_tiles(const std::vector<std::uint16_t>& q, const std::vector<std::uint16_t>& k);

}  // namespace spg::test::mla
