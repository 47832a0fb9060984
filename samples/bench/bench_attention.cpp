// See bench_attention.hpp. Inputs are filled from a 16 Mi-value block of seeded random bf16
// values repeated over each tensor (rows never line up with the period, and nothing is zero).
#include "samples/bench/bench_attention.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/sparse_mla/sparse_mla.hpp"
#include "memory/error.hpp"
#include "memory/resources.hpp"

namespace spg::bench {

namespace {

struct Row {
  const char* label;
  int d_qk;
  int h_q;
  int topk;
  int s_kv;
  int s_q;
  bool topk_length;
  bool quick;  ///< part of the quick subset
  double peer_tflops;  ///< the peer kernel on the H200 (docs/benchmarks.md); 0 when not listed
  double peer_us;
};

std::vector<Row> table_a() {
  std::vector<Row> rows;
  const int v32_kv[] = {8192, 32768, 65536, 131072};
  const double v32_peer[] = {609, 590, 542, 526};
  for (int i = 0; i < 4; ++i) rows.push_back({"V32", 576, 128, 2048, v32_kv[i], 4096, false, i == 1, v32_peer[i], 0});
  const int v4_kv[] = {8192, 32768, 65536};
  const double c1_peer[] = {528, 502, 461};
  const double c2_peer[] = {622, 597, 563};
  for (int i = 0; i < 3; ++i) rows.push_back({"V4-C1", 512, 64, 512, v4_kv[i], 4096, false, i == 1, c1_peer[i], 0});
  for (int i = 0; i < 3; ++i) rows.push_back({"V4-C2", 512, 128, 1024, v4_kv[i], 4096, false, i == 1, c2_peer[i], 0});
  rows.push_back({"V4-C4A-pro", 512, 128, 1152, 32768, 4096, true, false, 576, 0});
  rows.push_back({"V4-C128A", 512, 128, 8320, 65536, 4096, true, false, 577, 0});
  for (const int s_q : {16, 64, 256}) {
    rows.push_back({"small-h128-k1152", 512, 128, 1152, 8192, s_q, true, s_q != 16, s_q == 64 ? 434.0 : (s_q == 256 ? 519.0 : 0.0),
                    s_q == 64 ? 45.0 : (s_q == 256 ? 149.0 : 0.0)});
    rows.push_back({"small-h64-k640", 512, 64, 640, 8192, s_q, true, s_q == 16, s_q == 16 ? 47.0 : 0.0, s_q == 16 ? 28.0 : 0.0});
  }
  return rows;
}

std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Runs `fn(begin, end)` over [0, n) on the host's cores.
template <class F>
void parallel_for(std::size_t n, F fn) {
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  const std::size_t per = (n + workers - 1) / workers;
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w) {
    const std::size_t b = std::min(n, w * per);
    const std::size_t e = std::min(n, b + per);
    pool.emplace_back([=] { fn(b, e); });
  }
  for (auto& t : pool) t.join();
}

/// Fills `count` bf16 values at `dst` from the repeated random block.
void fill_bf16(void* dst, std::size_t count, const std::vector<std::uint16_t>& block) {
  auto* d = static_cast<std::uint16_t*>(dst);
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(block.size(), count - done);
    SPG_CUDA_TRY(cudaMemcpy(d + done, block.data(), n * 2, cudaMemcpyHostToDevice));
    done += n;
  }
}

}  // namespace

// Every attention measurement runs the kernel for 25 ms before timing it and times it for at
// least 100 ms (besides the minimum counts), unless `burst`: a 150 us kernel timed right after the
// GEMM ceiling or another row measured up to 13% apart between invocations with 10 warm-up calls,
// and the long rows run slower under sustained load than in short bursts (docs/benchmarks.md).
constexpr double kWarmupMs = 25.0;
constexpr double kMinTimedMs = 100.0;

void run_attention_benchmarks(Reporter& reporter, cudaStream_t stream, bool quick, const std::string& only, bool burst) {
  const double warmup_ms = burst ? 0.0 : kWarmupMs;
  const double min_timed_ms = burst ? 0.0 : kMinTimedMs;
  const char* timing = burst ? "burst" : "sustained";
  reporter.add({"attention", "timing", timing, "warmup_ms", warmup_ms});
  reporter.add({"attention", "timing", timing, "min_timed_ms", min_timed_ms});
  std::vector<std::uint16_t> block(std::size_t{1} << 24);
  parallel_for(block.size(), [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      const std::uint64_t r = mix(i * 0x9e3779b97f4a7c15ull + 12345);
      // sum of two uniforms in [-1, 1): a soft bell, never exactly zero after the offset
      const double u = (static_cast<double>(r >> 40) / 16777216.0) + (static_cast<double>(r & 0xffffff) / 16777216.0) - 1.0;
      block[i] = to_bf16(static_cast<float>(u == 0.0 ? 1e-3 : u));
    }
  });

  std::printf("%-18s %6s %4s %5s %6s %5s %9s %6s %9s %9s %9s %9s %9s\n", "row", "d_qk", "h_q", "topk", "s_kv", "s_q",
              "kernel", "split", "gpu_us", "TFLOP/s", "peer", "ratio", "peer_us");
  for (const Row& row : table_a()) {
    if (quick && !row.quick) continue;
    const std::string row_name = std::string(row.label) + "/" + std::to_string(row.s_kv) +
                                 (row.s_q != 4096 ? "/sq" + std::to_string(row.s_q) : std::string());
    if (!only.empty() && row_name.find(only) == std::string::npos) continue;
    const std::size_t q_elems = static_cast<std::size_t>(row.s_q) * row.h_q * row.d_qk;
    const std::size_t kv_elems = static_cast<std::size_t>(row.s_kv) * row.d_qk;
    const std::size_t idx_elems = static_cast<std::size_t>(row.s_q) * row.topk;
    memory::DeviceBuffer q(q_elems * 2), kv(kv_elems * 2), out(static_cast<std::size_t>(row.s_q) * row.h_q * 512 * 2);
    memory::DeviceBuffer indices(idx_elems * 4), lengths(static_cast<std::size_t>(row.s_q) * 4), sink(row.h_q * 4ull);
    memory::DeviceBuffer max_logits(static_cast<std::size_t>(row.s_q) * row.h_q * 4), lse(max_logits.size());
    fill_bf16(q.data(), q_elems, block);
    fill_bf16(kv.data(), kv_elems, block);

    std::vector<std::int32_t> host_idx(idx_elems);
    const auto seed = static_cast<std::uint64_t>(row.s_kv) * 131 + static_cast<std::uint64_t>(row.topk);
    parallel_for(idx_elems, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) host_idx[i] = static_cast<std::int32_t>(mix(seed + i * 0x9e3779b97f4a7c15ull) % row.s_kv);
    });
    SPG_CUDA_TRY(cudaMemcpy(indices.data(), host_idx.data(), idx_elems * 4, cudaMemcpyHostToDevice));
    // topk_length, where on, covers the whole width: every index is a valid row.
    const std::vector<std::int32_t> host_len(static_cast<std::size_t>(row.s_q), row.topk);
    SPG_CUDA_TRY(cudaMemcpy(lengths.data(), host_len.data(), host_len.size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> host_sink(static_cast<std::size_t>(row.h_q));
    for (std::size_t h = 0; h < host_sink.size(); ++h) host_sink[h] = 0.5f * std::sin(static_cast<float>(h));
    SPG_CUDA_TRY(cudaMemcpy(sink.data(), host_sink.data(), host_sink.size() * 4, cudaMemcpyHostToDevice));

    kernels::SparseMlaArgs args{};
    args.q = static_cast<const __nv_bfloat16*>(q.data());
    args.kv = static_cast<const __nv_bfloat16*>(kv.data());
    args.kv_row_stride = row.d_qk;
    args.s_kv = row.s_kv;
    args.indices = static_cast<const std::int32_t*>(indices.data());
    args.topk = row.topk;
    args.topk_length = row.topk_length ? static_cast<const std::int32_t*>(lengths.data()) : nullptr;
    args.attn_sink = static_cast<const float*>(sink.data());
    args.s_q = row.s_q;
    args.h_q = row.h_q;
    args.d_qk = row.d_qk;
    args.sm_scale = 1.0f / std::sqrt(static_cast<float>(row.d_qk));
    args.out = static_cast<__nv_bfloat16*>(out.data());
    args.max_logits = static_cast<float*>(max_logits.data());
    args.lse = static_cast<float*>(lse.data());
    kernels::SparseMla::can_implement(args);

    const double flops = 2.0 * static_cast<double>(idx_elems) * row.h_q * (row.d_qk + 512);
    const std::string& name = row_name;
    const bool small = row.s_q != 4096;
    // Every row also times the mma.sync single pass (the wgmma kernel's baseline); small chunks
    // also time the wgmma single pass and both split top-k kernels, to show what the automatic
    // choice buys.
    std::vector<std::pair<kernels::SparseMlaPath, const char*>> variants = {{kernels::SparseMlaPath::automatic, "spgraph"}};
    if (small) {
      variants.push_back({kernels::SparseMlaPath::single_pass, "spgraph-single-pass"});
      variants.push_back({kernels::SparseMlaPath::split_topk, "spgraph-split-topk"});
      variants.push_back({kernels::SparseMlaPath::split_topk_mma, "spgraph-split-topk-mma"});
    }
    variants.push_back({kernels::SparseMlaPath::single_pass_mma, "spgraph-single-pass-mma"});
    for (const auto& [path, variant] : variants) {
      args.path = path;
      const kernels::SparseMlaPlan plan = kernels::SparseMla::plan(args);
      memory::DeviceBuffer workspace(std::max<std::size_t>(kernels::SparseMla::workspace_bytes(args), 256));
      const double us = median_gpu_us(stream, [&] {
        SPG_CUDA_TRY(kernels::SparseMla::run(args, workspace.data(), stream));
      }, TimingOptions{small ? 10 : 3, small ? 50 : 20, warmup_ms, min_timed_ms});
      const double tflops = flops / (us * 1e-6) / 1e12;
      reporter.add({"attention", name, variant, "gpu_us", us});
      reporter.add({"attention", name, variant, "tflops", tflops});
      reporter.add({"attention", name, variant, "kernel", static_cast<double>(static_cast<int>(plan.kernel))});
      char path_s[16];
      std::snprintf(path_s, sizeof path_s, plan.split ? "x%d" : "1", plan.num_splits);
      std::printf("%-18s %6d %4d %5d %6d %5d %9s %6s %9.1f %9.1f %9.0f %9.2f %9.0f  %s\n", row.label, row.d_qk, row.h_q,
                  row.topk, row.s_kv, row.s_q, kernels::sparse_mla_kernel_name(plan.kernel), path_s, us, tflops,
                  row.peer_tflops, row.peer_tflops > 0 ? tflops / row.peer_tflops : 0.0, row.peer_us, variant);
      std::fflush(stdout);
    }
  }
}

}  // namespace spg::bench
