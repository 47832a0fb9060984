// See bench_attention.hpp. Inputs are filled from a 16 Mi-value block of seeded random bf16
// values repeated over each tensor (rows never line up with the period, and nothing is zero).
#include "samples/bench/bench_attention.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/checksum/checksum.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"
#include "spgraph/kernels/spin/spin.hpp"
#include "samples/bench/timeline.hpp"

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
  /// FlashMLA's time for the row (0 when not listed): its SM90 sparse prefill kernel built from
  /// public source at 9241ae3 with its own flags, called from C++, measured on an H200 on
  /// 2026-12-01 in the same device run as spgraph's `bench --tables A` at 3f974c3, sustained
  /// (25 ms warm-up, >= 100 ms timed), mean of two rounds (docs/benchmarks.md, table A).
  double flashmla_us;
};

std::vector<Row> table_a() {
  // FlashMLA figures of 2026-12-01 (see Row::flashmla_us); they replace the figures of
  // 2026-11-30, which came from calls through Python.
  std::vector<Row> rows;
  const int v32_kv[] = {8192, 32768, 65536, 131072};
  const double v32_flashmla[] = {3850, 4023, 4283, 4416};
  for (int i = 0; i < 4; ++i) rows.push_back({"V32", 576, 128, 2048, v32_kv[i], 4096, false, i == 1, v32_flashmla[i]});
  const int v4_kv[] = {8192, 32768, 65536};
  const double c1_flashmla[] = {564, 584, 625};
  const double c2_flashmla[] = {1963, 2017, 2132};
  for (int i = 0; i < 3; ++i) rows.push_back({"V4-C1", 512, 64, 512, v4_kv[i], 4096, false, i == 1, c1_flashmla[i]});
  for (int i = 0; i < 3; ++i) rows.push_back({"V4-C2", 512, 128, 1024, v4_kv[i], 4096, false, i == 1, c2_flashmla[i]});
  rows.push_back({"V4-C4A-pro", 512, 128, 1152, 32768, 4096, true, false, 2254});
  rows.push_back({"V4-C128A", 512, 128, 8320, 65536, 4096, true, false, 15430});
  const double h128_flashmla[] = {33.6, 35.9, 145.7};
  const double h64_flashmla[] = {20.5, 21.8, 45.1};
  const int small_sq[] = {16, 64, 256};
  for (int i = 0; i < 3; ++i) {
    rows.push_back({"small-h128-k1152", 512, 128, 1152, 8192, small_sq[i], true, small_sq[i] != 16, h128_flashmla[i]});
    rows.push_back({"small-h64-k640", 512, 64, 640, 8192, small_sq[i], true, small_sq[i] == 16, h64_flashmla[i]});
  }
  return rows;
}

/// A path by its name in SparseMlaPath ("automatic", "single_pass", "split_topk", ...).
struct NamedPath {
  const char* name;
  kernels::SparseMlaPath path;
  const char* variant;  ///< the record's variant
};
constexpr NamedPath kPaths[] = {
    {"automatic", kernels::SparseMlaPath::automatic, "spgraph"},
    {"single_pass", kernels::SparseMlaPath::single_pass, "spgraph-single-pass"},
    {"split_topk", kernels::SparseMlaPath::split_topk, "spgraph-split-topk"},
    {"single_pass_mma", kernels::SparseMlaPath::single_pass_mma, "spgraph-single-pass-mma"},
    {"split_topk_mma", kernels::SparseMlaPath::split_topk_mma, "spgraph-split-topk-mma"},
    {"split_dv", kernels::SparseMlaPath::split_dv, "spgraph-split-dv"},
};

bool is_split_path(kernels::SparseMlaPath p) {
  return p == kernels::SparseMlaPath::split_topk || p == kernels::SparseMlaPath::split_topk_mma;
}

/// Paths timed on the small chunks only: the top-k splits (their fp32 partials at s_q 4096 are
/// gigabytes) and the split-dv pass (twice the CTAs of a long row's many waves: slower by design).
bool small_rows_only(kernels::SparseMlaPath p) { return is_split_path(p) || p == kernels::SparseMlaPath::split_dv; }

/// Splits "a,b,c" into its non-empty parts.
std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> parts;
  std::size_t from = 0;
  while (from <= list.size()) {
    const std::size_t comma = std::min(list.find(',', from), list.size());
    if (comma > from) parts.push_back(list.substr(from, comma - from));
    from = comma + 1;
  }
  return parts;
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

/// The "gated" launch mode's gate: a page-locked word the device waits on ahead of each sample
/// (kernels::launch_gate) and the host opens once the sample's events and launch are enqueued.
/// Its destructor (on an exception too) opens every gate still closed, so no stream stays blocked.
class LaunchGate {
 public:
  LaunchGate() : word_(sizeof(unsigned)) { std::atomic_ref<unsigned>(*word()).store(0); }
  ~LaunchGate() { std::atomic_ref<unsigned>(*word()).store(std::numeric_limits<unsigned>::max()); }
  LaunchGate(const LaunchGate&) = delete;
  LaunchGate& operator=(const LaunchGate&) = delete;
  /// A gate on `stream` that opens at the next open().
  void enqueue(cudaStream_t stream) { SPG_CUDA_TRY(kernels::launch_gate(word(), ++next_, kGateTimeoutNs, stream)); }
  void open() { std::atomic_ref<unsigned>(*word()).store(next_, std::memory_order_release); }

 private:
  /// Longer than any sample's enqueue; a gate past it opens by itself (the sample is then wrong,
  /// but the stream is not blocked).
  static constexpr unsigned long long kGateTimeoutNs = 1'000'000'000ULL;
  [[nodiscard]] unsigned* word() const { return static_cast<unsigned*>(word_.data()); }
  core::PinnedBuffer word_;
  unsigned next_{0};
};

#ifdef SPGRAPH_WGMMA_TIMELINE
/// A/B builds with the wgmma timeline (wgmma_timeline.hpp): the last launch's `ctas` CTAs summed
/// up (samples/bench/timeline.hpp), printed as one line and recorded as metrics tl_*.
void report_timeline(Reporter& reporter, const std::string& row, const char* variant, std::size_t ctas) {
  std::vector<kernels::WgmmaTimelineRecord> rec(std::min<std::size_t>(ctas, kernels::kWgmmaTimelineCtas));
  SPG_CUDA_TRY(kernels::read_wgmma_timeline(rec.data(), rec.size()));
  const TimelineSummary t = summarize_timeline(rec);
  std::printf("  timeline %s %s (%zu CTAs, %zu gaps, %zu overlaps; medians, SM cycles): start %.0f  loop %.0f  tail %.0f"
              "  cta %.0f  gap to the next CTA %.0f  producer done %.0f before the last P V  SM clock %.0f MHz\n",
              row.c_str(), variant, t.ctas, t.gaps, t.overlaps, t.start, t.loop, t.tail, t.cta, t.gap, t.producer_slack,
              t.sm_mhz);
  std::printf("  timeline %s %s parts: start: first gathers issued %.0f, Q's left half in WG0 %.0f;  tail: row-sum barrier "
              "%.0f, finalize + staging + store issue %.0f (first panel %.0f, then %.0f a panel), stores' reads %.0f;  gap: "
              "launch %.0f, set-up %.0f;  WG1 ends last in %.0f%% of the CTAs (WG1's end - WG0's %.0f)\n",
              row.c_str(), variant, t.first_fill, t.q_left, t.epi_sync, t.epi_stage, t.epi_first_panel, t.epi_per_panel,
              t.epi_drain, t.launch_gap, t.setup, 100.0 * t.wg1_ends_last, t.end_skew);
  const std::pair<const char*, double> metrics[] = {{"tl_start_cycles", t.start}, {"tl_loop_cycles", t.loop},
                                                    {"tl_tail_cycles", t.tail},   {"tl_cta_cycles", t.cta},
                                                    {"tl_gap_cycles", t.gap},     {"tl_producer_slack_cycles", t.producer_slack},
                                                    {"tl_sm_mhz", t.sm_mhz},      {"tl_ctas", static_cast<double>(t.ctas)},
                                                    {"tl_first_fill_cycles", t.first_fill}, {"tl_q_left_cycles", t.q_left},
                                                    {"tl_epi_sync_cycles", t.epi_sync},     {"tl_epi_stage_cycles", t.epi_stage},
                                                    {"tl_epi_drain_cycles", t.epi_drain},   {"tl_setup_cycles", t.setup},
                                                    {"tl_launch_gap_cycles", t.launch_gap},
                                                    {"tl_epi_first_panel_cycles", t.epi_first_panel},
                                                    {"tl_epi_per_panel_cycles", t.epi_per_panel},
                                                    {"tl_end_skew_cycles", t.end_skew},
                                                    {"tl_wg1_ends_last", t.wg1_ends_last}};
  for (const auto& [metric, value] : metrics) reporter.add({"attention", row, variant, metric, value});
}
#endif

}  // namespace

// Every attention measurement runs the kernel for 25 ms before timing it and times it for at
// least 100 ms (besides the minimum counts), unless `burst`: a 150 us kernel timed right after the
// GEMM ceiling or another row measured up to 13% apart between invocations with 10 warm-up calls,
// and the long rows run slower under sustained load than in short bursts (docs/benchmarks.md).
constexpr double kWarmupMs = 25.0;
constexpr double kMinTimedMs = 100.0;
/// With several rounds or an explicit path list, the row's first variant runs this long, untimed,
/// before the first round: the host-side input set-up leaves the GPU idle for about a second, and
/// the variant timed first after that measured faster than the same kernel timed later.
constexpr double kRowWarmupMs = 200.0;

void run_attention_benchmarks(Reporter& reporter, cudaStream_t stream, const AttentionOptions& opt) {
  const bool burst = opt.burst;
  const double warmup_ms = burst ? 0.0 : kWarmupMs;
  const double min_timed_ms = burst ? 0.0 : kMinTimedMs;
  const char* timing = burst ? "burst" : "sustained";
  const int rounds = std::max(1, opt.rounds);
  reporter.add({"attention", "timing", timing, "warmup_ms", warmup_ms});
  reporter.add({"attention", "timing", timing, "min_timed_ms", min_timed_ms});
  reporter.add({"attention", "timing", timing, "rounds", static_cast<double>(rounds)});
  std::vector<const NamedPath*> listed;
  for (const std::string& name : split_list(opt.paths)) {
    const NamedPath* found = nullptr;
    for (const NamedPath& np : kPaths)
      if (name == np.name) found = &np;
    if (found == nullptr) {
      std::string names;
      for (const NamedPath& np : kPaths) names += std::string(names.empty() ? "" : ", ") + np.name;
      throw Error("bench: --paths: '" + name + "' is not a SparseMlaPath name (" + names + ")");
    }
    listed.push_back(found);
  }
#ifdef SPGRAPH_WGMMA_KV_PERSIST
  {
    // A/B build (issue 15 round 23): the whole persisting set-aside of L2 the device allows, for
    // the kernel's evict-last kv gathers (sparse_mla.cu sizes their fraction from it).
    int dev = 0;
    SPG_CUDA_TRY(cudaGetDevice(&dev));
    int max_persist = 0;
    SPG_CUDA_TRY(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, dev));
    SPG_CUDA_TRY(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, static_cast<std::size_t>(max_persist)));
    std::size_t set = 0;
    SPG_CUDA_TRY(cudaDeviceGetLimit(&set, cudaLimitPersistingL2CacheSize));
    std::printf("persisting L2 set-aside: %zu bytes (device maximum %d)\n", set, max_persist);
    reporter.add({"attention", "l2", "set-aside", "persisting_bytes", static_cast<double>(set)});
  }
#endif
  const std::vector<std::string> row_filters = split_list(opt.rows);
  std::vector<std::uint16_t> block(std::size_t{1} << 24);
  parallel_for(block.size(), [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      const std::uint64_t r = mix(i * 0x9e3779b97f4a7c15ull + 12345);
      // sum of two uniforms in [-1, 1): a soft bell, never exactly zero after the offset
      const double u = (static_cast<double>(r >> 40) / 16777216.0) + (static_cast<double>(r & 0xffffff) / 16777216.0) - 1.0;
      block[i] = to_bf16(static_cast<float>(u == 0.0 ? 1e-3 : u));
    }
  });

  struct Summary {
    std::string row;
    std::string variant;
    std::string kernel;
    double us;
    double tflops;
    double flashmla_us;
    double auto_us;  ///< the row's automatic variant, 0 when it was not timed
  };
  std::vector<Summary> summary;
  core::DeviceBuffer checksum_acc(opt.checksum ? sizeof(std::uint64_t) : 0);  // --checksum's accumulator
  std::printf("%-18s %6s %4s %5s %6s %5s %17s %6s %9s %9s %11s %7s\n", "row", "d_qk", "h_q", "topk", "s_kv", "s_q",
              "kernel", "split", "gpu_us", "TFLOP/s", "FlashMLA_us", "ratio");
  for (Row row : table_a()) {
    if (opt.quick && !row.quick) continue;
    // A small-chunk row (the split paths, more warm-up calls in bursts): by the row, not --s-q.
    const bool small = row.s_q != 4096;
    if (opt.s_q > 0) {
      row.s_q = opt.s_q;
      row.flashmla_us = 0;  // FlashMLA's figures are of the rows' own s_q
    }
    std::string row_name = std::string(row.label) + "/" + std::to_string(row.s_kv) +
                           (row.s_q != 4096 ? "/sq" + std::to_string(row.s_q) : std::string());
    if (opt.s_kv > 0) {
      row_name += "/kv" + std::to_string(opt.s_kv);
      row.s_kv = opt.s_kv;
      row.flashmla_us = 0;  // and of their own s_kv
    }
    if (!row_filters.empty() && std::none_of(row_filters.begin(), row_filters.end(), [&](const std::string& f) {
          return row_name.find(f) != std::string::npos;
        }))
      continue;
    const std::size_t q_elems = static_cast<std::size_t>(row.s_q) * row.h_q * row.d_qk;
    const std::size_t kv_elems = static_cast<std::size_t>(row.s_kv) * row.d_qk;
    const std::size_t idx_elems = static_cast<std::size_t>(row.s_q) * row.topk;
    core::DeviceBuffer q(q_elems * 2), kv(kv_elems * 2), out(static_cast<std::size_t>(row.s_q) * row.h_q * 512 * 2);
    core::DeviceBuffer indices(idx_elems * 4), lengths(static_cast<std::size_t>(row.s_q) * 4), sink(row.h_q * 4ull);
    core::DeviceBuffer max_logits(static_cast<std::size_t>(row.s_q) * row.h_q * 4), lse(max_logits.size());
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
    // Default: every row also times the mma.sync single pass (the wgmma kernel's baseline); small
    // chunks also time the wgmma single pass, both split top-k kernels and the split-dv pass, to
    // show what the automatic choice buys. With --paths: the listed paths, split and split-dv ones
    // on the small chunks only (small_rows_only), each kernel once per row (a path whose plan
    // names a kernel already timed on the row is skipped).
    std::vector<const NamedPath*> variants;
    if (listed.empty()) {
      variants.push_back(&kPaths[0]);
      if (small) {
        variants.push_back(&kPaths[1]);
        variants.push_back(&kPaths[2]);
        variants.push_back(&kPaths[4]);
        variants.push_back(&kPaths[5]);
      }
      variants.push_back(&kPaths[3]);
    } else {
      for (const NamedPath* np : listed)
        if (small || !small_rows_only(np->path)) variants.push_back(np);
    }
    struct Timed {
      const NamedPath* path;
      kernels::SparseMlaPlan plan;
      kernels::SparseMlaArgs args;
      core::DeviceBuffer workspace;
      std::vector<double> us;  ///< one median per round
      kernels::SparseMlaLaunch prepared{};  ///< launch "prepared" / "chain"
    };
    std::vector<Timed> timed;
    for (const NamedPath* np : variants) {
      kernels::SparseMlaArgs a = args;
      a.path = np->path;
      if (is_split_path(np->path)) a.num_splits = opt.num_splits;
      kernels::SparseMla::can_implement(a);
      const kernels::SparseMlaPlan plan = kernels::SparseMla::plan(a);
      const bool duplicate = std::any_of(timed.begin(), timed.end(), [&](const Timed& t) {
        return t.plan.kernel == plan.kernel && t.plan.num_splits == plan.num_splits && t.plan.split == plan.split;
      });
      if (duplicate && !listed.empty()) continue;
      timed.push_back({np, plan, a, core::DeviceBuffer(std::max<std::size_t>(kernels::SparseMla::workspace_bytes(a), 256)), {}, {}});
    }
    std::optional<LaunchGate> gate;  // "gated" only
    const bool prepared = opt.launch != "oneshot";
    const int per_sample = opt.launch == "chain" ? kChainLaunches : 1;
    if (prepared)
      for (Timed& t : timed) t.prepared = kernels::SparseMla::initialize(t.args, t.workspace.data());
    // One sample's launches: the one-shot call, or the prepared launch (per_sample times).
    auto launch_of = [&](Timed& t) {
      return [&t, prepared, per_sample, stream] {
        if (!prepared) {
          SPG_CUDA_TRY(kernels::SparseMla::run(t.args, t.workspace.data(), stream));
          return;
        }
        for (int i = 0; i < per_sample; ++i) SPG_CUDA_TRY(t.prepared.run(stream));
      };
    };
    const TimingOptions timing_opt{small ? 10 : 3, small ? 50 : 20, warmup_ms, min_timed_ms};
    // "gated": a gate ahead of each sample's start event holds the device until the host has
    // enqueued the event, the launch and the stop event, so the sample is the kernel's time on the
    // device from an idle start, without the host's launch work or latency in it, and the device
    // idles between samples no longer than one-shot lets it.
    std::function<void(int)> before_each;
    std::function<void(int)> after_enqueue;
    if (opt.launch == "gated") {
      gate.emplace();
      before_each = [&gate, stream](int) { gate->enqueue(stream); };
      after_enqueue = [&gate](int) { gate->open(); };
    }
    auto time_one = [&](Timed& t) {
      return median_gpu_us(stream, launch_of(t), timing_opt, before_each, after_enqueue) / per_sample;
    };
    if (!burst && (rounds > 1 || !listed.empty()) && !timed.empty())
      median_gpu_us(stream, launch_of(timed.front()), TimingOptions{1, 1, kRowWarmupMs, 0.0});
    // Round r times the variants in turn starting from variant r (mod n), so over the rounds each
    // variant follows each of the others and none is always first.
    const std::size_t n = timed.size();
    for (int r = 0; r < rounds; ++r)
      for (std::size_t k = 0; k < n; ++k) {
        Timed& t = timed[(k + static_cast<std::size_t>(r)) % n];
        t.us.push_back(time_one(t));
      }
    for (Timed& t : timed) {
      const double us = median(t.us);
      const double tflops = flops / (us * 1e-6) / 1e12;
      const std::string variant_name = std::string(t.path->variant) + (prepared ? "+" + opt.launch : std::string());
      const char* variant = variant_name.c_str();
      reporter.add({"attention", row_name, variant, "gpu_us", us});
      reporter.add({"attention", row_name, variant, "tflops", tflops});
      reporter.add({"attention", row_name, variant, "kernel", static_cast<double>(static_cast<int>(t.plan.kernel))});
      reporter.add({"attention", row_name, variant, "num_splits", static_cast<double>(t.plan.num_splits)});
      if (rounds > 1)
        for (int r = 0; r < rounds; ++r)
          reporter.add({"attention", row_name, variant, "gpu_us_round" + std::to_string(r), t.us[static_cast<std::size_t>(r)]});
      char path_s[16];
      std::snprintf(path_s, sizeof path_s, t.plan.split ? "x%d" : "1", t.plan.num_splits);
      std::printf("%-18s %6d %4d %5d %6d %5d %17s %6s %9.1f %9.1f %11.1f %7.3f  %s\n", row.label, row.d_qk, row.h_q,
                  row.topk, row.s_kv, row.s_q, kernels::sparse_mla_kernel_name(t.plan.kernel), path_s, us, tflops,
                  row.flashmla_us, row.flashmla_us > 0 ? row.flashmla_us / us : 0.0, variant);
      std::fflush(stdout);
      summary.push_back({row_name, variant, kernels::sparse_mla_kernel_name(t.plan.kernel), us, tflops, row.flashmla_us, 0.0});
#ifdef SPGRAPH_WGMMA_TIMELINE
      const bool timeline = t.plan.kernel == kernels::SparseMlaKernel::wgmma_single_pass ||
                            t.plan.kernel == kernels::SparseMlaKernel::wgmma_split_dv;
#else
      constexpr bool timeline = false;
#endif
      if (opt.checksum || timeline) {
        // One more launch of this variant, untimed: the rows' buffers (and the timeline's records)
        // are shared by its variants, and each launch overwrites them.
#ifdef SPGRAPH_WGMMA_TIMELINE
        if (timeline) SPG_CUDA_TRY(kernels::clear_wgmma_timeline(stream));
#endif
        launch_of(t)();
        SPG_CUDA_TRY(cudaStreamSynchronize(stream));
      }
      if (opt.checksum) {
        // Its outputs' checksum: out (its token stride is the contiguous one), max_logits, lse.
        SPG_CUDA_TRY(cudaMemsetAsync(checksum_acc.data(), 0, sizeof(std::uint64_t), stream));
        SPG_CUDA_TRY(kernels::Checksum::accumulate(out.data(), out.size(), 1, static_cast<std::uint64_t*>(checksum_acc.data()), stream));
        SPG_CUDA_TRY(kernels::Checksum::accumulate(max_logits.data(), max_logits.size(), 2,
                                                   static_cast<std::uint64_t*>(checksum_acc.data()), stream));
        SPG_CUDA_TRY(kernels::Checksum::accumulate(lse.data(), lse.size(), 3, static_cast<std::uint64_t*>(checksum_acc.data()), stream));
        std::uint64_t sum = 0;
        SPG_CUDA_TRY(cudaMemcpyAsync(&sum, checksum_acc.data(), sizeof sum, cudaMemcpyDeviceToHost, stream));
        SPG_CUDA_TRY(cudaStreamSynchronize(stream));
        std::printf("checksum %s %s 0x%016llx\n", row_name.c_str(), variant, static_cast<unsigned long long>(sum));
        reporter.add({"attention", row_name, variant, "checksum_hi", static_cast<double>(sum >> 32)});
        reporter.add({"attention", row_name, variant, "checksum_lo", static_cast<double>(sum & 0xffffffffull)});
      }
#ifdef SPGRAPH_WGMMA_TIMELINE
      if (timeline) {
        report_timeline(reporter, row_name, variant,
                        static_cast<std::size_t>(row.s_q) * (row.h_q / 64) * t.plan.num_splits * t.plan.dv_parts);
      }
#endif
    }
    // The row's automatic figure, for each variant's A/B ratio in the summary.
    const auto row_begin = summary.end() - static_cast<std::ptrdiff_t>(timed.size());
    double auto_us = 0.0;
    const std::string auto_variant = std::string(kPaths[0].variant) + (prepared ? "+" + opt.launch : std::string());
    for (auto it = row_begin; it != summary.end(); ++it)
      if (it->variant == auto_variant) auto_us = it->us;
    for (auto it = row_begin; it != summary.end(); ++it) it->auto_us = auto_us;
  }
  // The short table: one line per (row, variant); ratio = FlashMLA time / spgraph time (above 1:
  // spgraph faster), against the FlashMLA figures of 2026-12-01 (Row::flashmla_us).
  std::printf("== attention summary (%s, %d round%s; FlashMLA: 9241ae3, H200, 2026-12-01, sustained)\n", timing, rounds,
              rounds == 1 ? "" : "s");
  // vs_auto = the row's automatic time / this variant's time (above 1: faster than automatic).
  std::printf("%-28s %-30s %-17s %10s %9s %11s %7s %7s\n", "row", "variant", "kernel", "median_us", "TFLOP/s",
              "FlashMLA_us", "ratio", "vs_auto");
  for (const Summary& r : summary)
    std::printf("%-28s %-30s %-17s %10.1f %9.1f %11.1f %7.3f %7.3f\n", r.row.c_str(), r.variant.c_str(), r.kernel.c_str(),
                r.us, r.tflops, r.flashmla_us, r.flashmla_us > 0 ? r.flashmla_us / r.us : 0.0,
                r.auto_us > 0 ? r.auto_us / r.us : 0.0);
  std::printf("== end of attention summary\n");
  std::fflush(stdout);
}

}  // namespace spg::bench
