// Table C of docs/benchmarks.md: see bench_kernels.hpp.
//
// Inputs rotate over several sets (caches, block tables, outputs) so that each timed call starts
// with an L2 that does not already hold its data, as in a real step where the cache rows were
// written long before. The caches hold real quantized rows (filled through KvInsert).
#include "samples/bench/bench_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/chunk.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/reference/combine_indices_reference.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"
#include "spgraph/kernels/step_status.hpp"
#include "samples/bench/probes.hpp"

namespace spg::bench {

namespace {

using core::DeviceBuffer;
using namespace spg::kernels;

// The "large" workload of table B and its layer: 4 requests x 2048 new tokens, prefix 32768, C4A.
constexpr int kRequests = 4;
constexpr int kNewTokens = 2048;
constexpr int kPrefix = 32768;
constexpr int kRatio = 4;
constexpr int kWindow = 128;
constexpr int kTopKLarge = 1024;
constexpr int kSwaBlock = 64;
constexpr int kBlockTokens = 256;
constexpr int kMaxModelLen = 65536;
constexpr double kGB = 1e9;

template <class T>
T* at(const DeviceBuffer& b, std::size_t offset_elems = 0) {
  return static_cast<T*>(b.data()) + offset_elems;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer d(host.size() * sizeof(T));
  SPG_CUDA_TRY(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  // The benchmark's stream is non-blocking: make sure the copy landed before it is used there.
  SPG_CUDA_TRY(cudaDeviceSynchronize());
  return d;
}

/// bf16 bits of K-like rows: normal values scaled per 64-value tile by 2^k, k in [-8, 8].
std::vector<std::uint16_t> random_rows(std::mt19937& rng, std::size_t rows) {
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<std::uint16_t> out(rows * kKvDim);
  for (std::size_t i = 0; i < out.size(); i += kKvTile) {
    const float scale = std::ldexp(1.0F, exponent(rng));
    for (int j = 0; j < kKvTile; ++j) out[i + std::size_t(j)] = reference::bf16_round(normal(rng) * scale);
  }
  return out;
}

/// One chunk's metadata in device memory (scalars, then query_start_loc, seq_lens, gather_lens).
struct DeviceChunk {
  reference::HostChunk host;
  DeviceBuffer buffer;
  ChunkArrays arrays{};
};

DeviceChunk make_chunk(int requests, int query_len, int prefix, int r) {
  DeviceChunk c;
  c.host.query_start_loc.resize(std::size_t(requests) + 1);
  c.host.seq_lens.assign(std::size_t(requests), prefix + query_len);
  c.host.gather_lens.assign(std::size_t(requests), std::min(prefix + query_len, query_len + kWindow - 1));
  for (int b = 0; b <= requests; ++b) c.host.query_start_loc[std::size_t(b)] = b * query_len;
  const int n = (prefix + query_len) / r;
  c.host.scalars = ChunkScalars{};
  c.host.scalars.num_requests = requests;
  c.host.scalars.num_tokens = requests * query_len;
  c.host.scalars.n_rows = n;
  c.host.scalars.m_rows = n + c.host.gather_lens[0];
  std::vector<std::int32_t> words(sizeof(ChunkScalars) / 4 + 3 * std::size_t(requests) + 1);
  std::memcpy(words.data(), &c.host.scalars, sizeof(ChunkScalars));
  std::int32_t* w = words.data() + sizeof(ChunkScalars) / 4;
  std::copy(c.host.query_start_loc.begin(), c.host.query_start_loc.end(), w);
  std::copy(c.host.seq_lens.begin(), c.host.seq_lens.end(), w + requests + 1);
  std::copy(c.host.gather_lens.begin(), c.host.gather_lens.end(), w + 2 * requests + 1);
  c.buffer = upload(words);
  const auto* scalars = at<const ChunkScalars>(c.buffer);
  const std::int32_t* arrays = at<const std::int32_t>(c.buffer, sizeof(ChunkScalars) / 4);
  c.arrays = ChunkArrays{scalars, arrays, arrays + requests + 1, arrays + 2 * requests + 1};
  return c;
}

/// Fills every slot of a cache with quantized random rows, through KvInsert.
void fill_cache(std::uint8_t* cache, const CacheLayout& layout, const DeviceBuffer& rows, int rows_count,
                StepStatus* status, cudaStream_t stream) {
  // slot_mapping holds rows_bucket entries from each insert's first slot: pad the tail with -1.
  std::vector<std::int32_t> slots(std::size_t(layout.capacity() + rows_count), -1);
  std::iota(slots.begin(), slots.begin() + layout.capacity(), 0);
  const DeviceBuffer slots_d = upload(slots);
  const DeviceBuffer count(sizeof(std::int32_t));
  for (std::int64_t first = 0; first < layout.capacity(); first += rows_count) {
    const auto n = static_cast<std::int32_t>(std::min<std::int64_t>(rows_count, layout.capacity() - first));
    SPG_CUDA_TRY(cudaMemcpy(count.data(), &n, sizeof n, cudaMemcpyHostToDevice));
    SPG_CUDA_TRY(cudaDeviceSynchronize());
    const KvInsertArgs a{at<const __nv_bfloat16>(rows), at<const std::int32_t>(slots_d, std::size_t(first)),
                         at<const std::int32_t>(count), rows_count, cache, layout, status};
    KvInsert::can_implement(a);
    SPG_CUDA_TRY(KvInsert::run(a, stream));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
  }
}

/// A block table [requests, stride] of distinct random physical blocks (unused entries 0).
std::vector<std::int32_t> block_table(std::mt19937& rng, int requests, int used, int stride, int num_blocks) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::int32_t> table(std::size_t(requests) * std::size_t(stride), 0);
  for (int b = 0; b < requests; ++b) {
    for (int i = 0; i < used; ++i) table[std::size_t(b * stride + i)] = ids[std::size_t(b * used + i)];
  }
  return table;
}

void check_no_faults(const StepStatus* status, const char* what) {
  StepStatus s{};
  SPG_CUDA_TRY(cudaMemcpy(&s, status, sizeof s, cudaMemcpyDeviceToHost));
  SPG_EXPECTS_AS(Error, s.total() == 0, what << ": the kernels counted " << s.total() << " faults on valid input");
}

bool has_copy_ceiling(const Reporter& reporter) {
  return std::any_of(reporter.records().begin(), reporter.records().end(), [](const Record& r) {
    return r.suite == "ceilings" && r.name == "copy" && r.metric == "gbps";
  });
}

void measure_copy_ceiling(Reporter& reporter, cudaStream_t stream) {
  constexpr std::size_t bytes = std::size_t{2} << 30;
  const DeviceBuffer src(bytes);
  const DeviceBuffer dst(bytes);
  SPG_CUDA_TRY(cudaMemset(src.data(), 0x5A, bytes));
  SPG_CUDA_TRY(cudaDeviceSynchronize());
  const double us = median_gpu_us(
      stream, [&] { SPG_CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream)); },
      TimingOptions{3, 20});
  reporter.add(Record{"ceilings", "copy", "cudaMemcpyAsync", "gbps", 2.0 * double(bytes) / (us * 1e-6) / kGB});
}

void add_rate(Reporter& reporter, const std::string& name, const std::string& variant, double us, double bytes,
              double copy_gbps) {
  const double gbps = bytes / (us * 1e-6) / kGB;
  reporter.add(Record{"kernels", name, variant, "gpu_us", us});
  reporter.add(Record{"kernels", name, variant, "gbps", gbps});
  if (std::isfinite(copy_gbps)) reporter.add(Record{"kernels", name, variant, "copy_ratio", gbps / copy_gbps});
}

/// Keeps the device busy for about 15 ms so that its clocks are up when a timed section starts
/// (the host-side set-up before each section leaves it idle).
class ClockWarmer {
 public:
  ClockWarmer() : src_(kBytes), dst_(kBytes) {
    SPG_CUDA_TRY(cudaMemset(src_.data(), 0x2D, kBytes));
    SPG_CUDA_TRY(cudaDeviceSynchronize());
  }
  void warm(cudaStream_t stream) const {
    for (int i = 0; i < 120; ++i) {
      SPG_CUDA_TRY(cudaMemcpyAsync(dst_.data(), src_.data(), kBytes, cudaMemcpyDeviceToDevice, stream));
    }
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
  }

 private:
  static constexpr std::size_t kBytes = std::size_t{256} << 20;
  DeviceBuffer src_;
  DeviceBuffer dst_;
};

/// Launches timed back to back per repetition in the "-back-to-back" variants: the launch latency
/// then overlaps the previous kernel, as between the nodes of a graph.
constexpr int kBackToBack = 8;

struct Timing {
  double single_us;        ///< median of single launches, each between two events
  double back_to_back_us;  ///< median of kBackToBack launches between two events, per launch
};

/// Times `launch(set)` over rotating sets, after warming the clocks.
Timing time_launches(const ClockWarmer& warmer, cudaStream_t stream, int sets, const std::function<void(int)>& launch) {
  warmer.warm(stream);
  int current = 0;
  const auto rotate = [&](int i) { current = i % sets; };
  const double single = median_gpu_us(stream, [&] { launch(current); }, TimingOptions{5, 30}, rotate);
  const double batch = median_gpu_us(
      stream,
      [&] {
        for (int k = 0; k < kBackToBack; ++k) launch((current * kBackToBack + k) % sets);
      },
      TimingOptions{3, 20}, rotate);
  return Timing{single, batch / kBackToBack};
}

void add_rates(Reporter& reporter, const std::string& name, const Timing& t, double bytes, double copy_gbps) {
  add_rate(reporter, name, "spgraph", t.single_us, bytes, copy_gbps);
  add_rate(reporter, name, "spgraph-back-to-back", t.back_to_back_us, bytes, copy_gbps);
}

/// One rotation set of the large workload: its caches, block tables and kv workspace.
struct CacheSet {
  DeviceBuffer compressed_cache, swa_cache, compressed_table, swa_table, kv;
};

/// The large workload's caches (filled with quantized rows), metadata and gather arguments.
struct CacheWorkload {
  static constexpr int kSets = 4;
  int compressed_rows{0};  // per request
  int swa_stride{0};
  CacheLayout compressed_layout{};
  CacheLayout swa_layout{};
  DeviceBuffer status_buffer{sizeof(StepStatus)};
  DeviceChunk chunk;
  std::vector<CacheSet> sets;
  std::vector<KvGatherArgs> both, compressed, window;  // per set

  [[nodiscard]] StepStatus* status() const { return at<StepStatus>(status_buffer); }
  /// Bytes one gathered row moves: its 576-byte data row and 8-byte scale row read, 1024 bytes written.
  static constexpr double kRowBytes = kKvRowBytes + kKvScaleBytes + 2.0 * kKvDim;
  [[nodiscard]] double compressed_bytes() const { return double(kRequests) * compressed_rows * kRowBytes; }
  [[nodiscard]] double window_bytes() const { return double(kRequests) * chunk.host.gather_lens[0] * kRowBytes; }
};

CacheWorkload make_cache_workload(std::mt19937& rng, cudaStream_t stream) {
  CacheWorkload w;
  const int seq = kPrefix + kNewTokens;
  w.compressed_rows = seq / kRatio;                                // 8704 per request
  const int compressed_block = kBlockTokens / kRatio;              // 64 rows
  const int compressed_used = (w.compressed_rows + compressed_block - 1) / compressed_block;
  const int compressed_stride = kMaxModelLen / kRatio / compressed_block;
  const int swa_used = (seq + kSwaBlock - 1) / kSwaBlock;
  w.swa_stride = kMaxModelLen / kSwaBlock;
  w.compressed_layout = CacheLayout::make(compressed_block, kRequests * compressed_used + 16);
  w.swa_layout = CacheLayout::make(kSwaBlock, kRequests * swa_used + 16);
  // M_max of the layer (max_model_len / r + min(max_model_len, T + W - 1)) for T = 4 x 2048.
  const std::int64_t max_rows = kMaxModelLen / kRatio + std::min(kMaxModelLen, kNewTokens * kRequests + kWindow - 1);

  constexpr int kFillRows = 16384;
  const DeviceBuffer fill_rows = upload(random_rows(rng, kFillRows));
  SPG_CUDA_TRY(reset(w.status(), stream));
  w.chunk = make_chunk(kRequests, kNewTokens, kPrefix, kRatio);
  for (int s = 0; s < CacheWorkload::kSets; ++s) {
    CacheSet set;
    set.compressed_cache = DeviceBuffer(w.compressed_layout.bytes());
    set.swa_cache = DeviceBuffer(w.swa_layout.bytes());
    fill_cache(at<std::uint8_t>(set.compressed_cache), w.compressed_layout, fill_rows, kFillRows, w.status(), stream);
    fill_cache(at<std::uint8_t>(set.swa_cache), w.swa_layout, fill_rows, kFillRows, w.status(), stream);
    set.compressed_table =
        upload(block_table(rng, kRequests, compressed_used, compressed_stride, w.compressed_layout.num_blocks));
    set.swa_table = upload(block_table(rng, kRequests, swa_used, w.swa_stride, w.swa_layout.num_blocks));
    set.kv = DeviceBuffer(std::size_t(kRequests) * std::size_t(max_rows) * kKvDim * 2);
    w.sets.push_back(std::move(set));
  }
  auto gather_args = [&](const CacheSet& set, GatherPart part) {
    KvGatherArgs a;
    const bool window = part == GatherPart::window;
    a.cache = at<const std::uint8_t>(window ? set.swa_cache : set.compressed_cache);
    a.layout = window ? w.swa_layout : w.compressed_layout;
    a.block_table = at<const std::int32_t>(window ? set.swa_table : set.compressed_table);
    a.block_table_stride = window ? w.swa_stride : compressed_stride;
    a.chunk = w.chunk.arrays;
    a.part = part;
    a.compress_ratio = kRatio;
    a.requests_bucket = kRequests;
    a.max_rows_per_request = max_rows;
    a.kv = at<__nv_bfloat16>(set.kv);
    a.status = w.status();
    a.overlap_prologue = true;  // as in the pipeline: no kernel before it writes the metadata
    if (part == GatherPart::both) {
      a.window_cache = at<const std::uint8_t>(set.swa_cache);
      a.window_layout = w.swa_layout;
      a.window_block_table = at<const std::int32_t>(set.swa_table);
      a.window_block_table_stride = w.swa_stride;
    }
    KvGather::can_implement(a);
    return a;
  };
  for (const CacheSet& set : w.sets) {
    w.both.push_back(gather_args(set, GatherPart::both));
    w.compressed.push_back(gather_args(set, GatherPart::compressed));
    w.window.push_back(gather_args(set, GatherPart::window));
  }
  return w;
}

/// Dequant-gather and insert at the large workload.
void measure_cache_kernels(Reporter& reporter, const ClockWarmer& warmer, cudaStream_t stream, double copy_gbps) {
  std::mt19937 rng(2024);
  const CacheWorkload w = make_cache_workload(rng, stream);
  constexpr int kSets = CacheWorkload::kSets;
  StepStatus* status = w.status();
  const std::string name = "dequant-gather/large";
  const double bytes = w.compressed_bytes() + w.window_bytes();

  Timing t = time_launches(warmer, stream, kSets, [&](int set) {
    SPG_CUDA_TRY(KvGather::run(w.both[std::size_t(set)], stream));
  });
  add_rates(reporter, name, t, bytes, copy_gbps);
  t = time_launches(warmer, stream, kSets, [&](int set) {
    SPG_CUDA_TRY(KvGather::run(w.compressed[std::size_t(set)], stream));
    SPG_CUDA_TRY(KvGather::run(w.window[std::size_t(set)], stream));
  });
  add_rate(reporter, name, "spgraph-two-launches", t.single_us, bytes, copy_gbps);
  add_rate(reporter, name, "spgraph-two-launches-back-to-back", t.back_to_back_us, bytes, copy_gbps);
  t = time_launches(warmer, stream, kSets, [&](int set) {
    SPG_CUDA_TRY(KvGather::run(w.compressed[std::size_t(set)], stream));
  });
  add_rates(reporter, name + "/compressed", t, w.compressed_bytes(), copy_gbps);
  t = time_launches(warmer, stream, kSets, [&](int set) {
    SPG_CUDA_TRY(KvGather::run(w.window[std::size_t(set)], stream));
  });
  add_rates(reporter, name + "/window", t, w.window_bytes(), copy_gbps);
  SPG_CUDA_TRY(cudaStreamSynchronize(stream));
  check_no_faults(status, "dequant-gather");

  // The copy engine on the same byte count (half read, half written), for scale at this size.
  {
    const std::size_t half = static_cast<std::size_t>(bytes / 2) / 256 * 256;
    std::vector<DeviceBuffer> src;
    std::vector<DeviceBuffer> dst;
    for (int i = 0; i < kSets; ++i) {
      src.emplace_back(half);
      dst.emplace_back(half);
      SPG_CUDA_TRY(cudaMemset(src.back().data(), 0x3C, half));
    }
    SPG_CUDA_TRY(cudaDeviceSynchronize());
    t = time_launches(warmer, stream, kSets, [&](int set) {
      SPG_CUDA_TRY(cudaMemcpyAsync(dst[std::size_t(set)].data(), src[std::size_t(set)].data(), half,
                                   cudaMemcpyDeviceToDevice, stream));
    });
    reporter.add(Record{"ceilings", "copy-70MB", "cudaMemcpyAsync", "gbps", 2.0 * half / (t.single_us * 1e-6) / kGB});
    reporter.add(Record{"ceilings", "copy-70MB", "cudaMemcpyAsync-back-to-back", "gbps",
                        2.0 * half / (t.back_to_back_us * 1e-6) / kGB});
    t = time_launches(warmer, stream, kSets, [&](int set) {
      SPG_CUDA_TRY(launch_copy_kernel(dst[std::size_t(set)].data(), src[std::size_t(set)].data(), half, stream));
    });
    reporter.add(Record{"ceilings", "copy-70MB", "copy-kernel", "gbps", 2.0 * half / (t.single_us * 1e-6) / kGB});
    reporter.add(Record{"ceilings", "copy-70MB", "copy-kernel-back-to-back", "gbps",
                        2.0 * half / (t.back_to_back_us * 1e-6) / kGB});
    // The gather's 36/64 read/write mix over the same rows, without block tables or dequantization.
    const int rows = static_cast<int>(bytes / (576.0 + 1024.0));
    std::vector<DeviceBuffer> row_src;
    std::vector<DeviceBuffer> row_dst;
    for (int i = 0; i < kSets; ++i) {
      row_src.emplace_back(std::size_t{576} * rows);
      row_dst.emplace_back(std::size_t{1024} * rows);
      SPG_CUDA_TRY(cudaMemset(row_src.back().data(), 0x3C, std::size_t{576} * rows));
    }
    SPG_CUDA_TRY(cudaDeviceSynchronize());
    t = time_launches(warmer, stream, kSets, [&](int set) {
      SPG_CUDA_TRY(launch_stream_rows_kernel(row_dst[std::size_t(set)].data(), row_src[std::size_t(set)].data(), rows,
                                             stream));
    });
    const double row_bytes = 1600.0 * rows;
    reporter.add(Record{"ceilings", "rows-576-to-1024-70MB", "stream-kernel", "gbps", row_bytes / (t.single_us * 1e-6) / kGB});
    reporter.add(Record{"ceilings", "rows-576-to-1024-70MB", "stream-kernel-back-to-back", "gbps",
                        row_bytes / (t.back_to_back_us * 1e-6) / kGB});
  }

  // Insert: this step's 4 x 2048 new K rows into the SWA cache at their positions, rotating over
  // enough row sets that the inputs are not L2-resident; and 65536 rows for the asymptotic rate.
  const double insert_row_bytes = 2.0 * kKvDim + 4 + kKvRowBytes + kKvScaleBytes;
  {
    constexpr int kInsertSets = 8;
    const int rows = kRequests * kNewTokens;
    std::vector<std::int32_t> slots(static_cast<std::size_t>(rows));
    std::vector<std::int32_t> swa_table_host(std::size_t(kRequests) * std::size_t(w.swa_stride));
    SPG_CUDA_TRY(cudaMemcpy(swa_table_host.data(), w.sets[0].swa_table.data(), swa_table_host.size() * 4,
                            cudaMemcpyDeviceToHost));
    for (int b = 0; b < kRequests; ++b) {
      for (int k = 0; k < kNewTokens; ++k) {
        const int pos = kPrefix + k;
        slots[std::size_t(b * kNewTokens + k)] =
            swa_table_host[std::size_t(b * w.swa_stride + pos / kSwaBlock)] * kSwaBlock + pos % kSwaBlock;
      }
    }
    const DeviceBuffer slots_d = upload(slots);
    const DeviceBuffer count = upload(std::vector<std::int32_t>{rows});
    std::vector<DeviceBuffer> row_sets;
    for (int s = 0; s < kInsertSets; ++s) row_sets.push_back(upload(random_rows(rng, std::size_t(rows))));
    t = time_launches(warmer, stream, kInsertSets, [&](int set) {
      const KvInsertArgs a{at<const __nv_bfloat16>(row_sets[std::size_t(set)]), at<const std::int32_t>(slots_d),
                           at<const std::int32_t>(count), rows, at<std::uint8_t>(w.sets[0].swa_cache), w.swa_layout,
                           status};
      SPG_CUDA_TRY(KvInsert::run(a, stream));
    });
    add_rates(reporter, "insert/large", t, rows * insert_row_bytes, copy_gbps);
  }
  {
    constexpr int kBigRows = 65536;
    std::vector<std::int32_t> big_slots(kBigRows);
    std::iota(big_slots.begin(), big_slots.end(), 0);
    const DeviceBuffer big_slots_d = upload(big_slots);
    const DeviceBuffer big_count = upload(std::vector<std::int32_t>{kBigRows});
    std::vector<DeviceBuffer> big_sets;
    for (int s = 0; s < 2; ++s) big_sets.push_back(upload(random_rows(rng, kBigRows)));
    t = time_launches(warmer, stream, 2, [&](int set) {
      const KvInsertArgs a{at<const __nv_bfloat16>(big_sets[std::size_t(set)]), at<const std::int32_t>(big_slots_d),
                           at<const std::int32_t>(big_count), kBigRows,
                           at<std::uint8_t>(w.sets[std::size_t(1 + set)].swa_cache), w.swa_layout, status};
      SPG_CUDA_TRY(KvInsert::run(a, stream));
    });
    add_rates(reporter, "insert/65536-rows", t, kBigRows * insert_row_bytes, copy_gbps);
  }
  SPG_CUDA_TRY(cudaStreamSynchronize(stream));
  check_no_faults(status, "insert");
}

/// Combine indices: latency at the tiny workload, bandwidth at the large one.
void measure_combine(Reporter& reporter, const ClockWarmer& warmer, cudaStream_t stream) {
  struct Workload {
    const char* name;
    int requests, query_len, prefix, top_k, sets;
  };
  const Workload workloads[] = {{"combine/tiny", 1, 16, 4096, 512, 4}, {"combine/large", kRequests, kNewTokens, kPrefix, kTopKLarge, 3}};
  const DeviceBuffer status_buffer(sizeof(StepStatus));
  auto* status = at<StepStatus>(status_buffer);
  SPG_CUDA_TRY(reset(status, stream));
  std::mt19937 rng(77);
  for (const Workload& w : workloads) {
    const DeviceChunk chunk = make_chunk(w.requests, w.query_len, w.prefix, kRatio);
    const int tokens = w.requests * w.query_len;
    const int width = (w.top_k + kWindow + 127) / 128 * 128;
    const int rows = (w.prefix + w.query_len) / kRatio;
    std::vector<std::vector<std::int32_t>> topk_host;
    std::vector<DeviceBuffer> topk;
    std::vector<DeviceBuffer> combined;
    std::uniform_int_distribution<int> row(0, rows - 1);
    for (int s = 0; s < w.sets; ++s) {
      std::vector<std::int32_t> t(std::size_t(tokens) * std::size_t(w.top_k));
      for (auto& v : t) v = row(rng);
      topk.push_back(upload(t));
      topk_host.push_back(std::move(t));
      combined.push_back(DeviceBuffer(std::size_t(tokens) * std::size_t(width) * 4));
    }
    const DeviceBuffer lens(std::size_t(tokens) * 4);
    std::vector<CombineIndicesArgs> args;
    for (int s = 0; s < w.sets; ++s) {
      CombineIndicesArgs a;
      a.topk_indices = at<const std::int32_t>(topk[std::size_t(s)]);
      a.top_k = w.top_k;
      a.compress_ratio = kRatio;
      a.window = kWindow;
      a.chunk = chunk.arrays;
      a.tokens_bucket = tokens;
      a.requests_bucket = w.requests;
      a.combined = at<std::int32_t>(combined[std::size_t(s)]);
      a.combined_width = width;
      a.lens = at<std::int32_t>(lens);
      a.status = status;
      CombineIndices::can_implement(a);
      args.push_back(a);
    }
    const Timing t = time_launches(warmer, stream, w.sets, [&](int set) {
      SPG_CUDA_TRY(CombineIndices::run(args[std::size_t(set)], stream));
    });
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
    check_no_faults(status, w.name);
    const int current = 0;
    SPG_CUDA_TRY(CombineIndices::run(args[std::size_t(current)], stream));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));

    // Bytes from the reference's lens; and a check of the last output against the reference.
    std::vector<std::int32_t> want(std::size_t(tokens) * std::size_t(width), 0);
    std::vector<std::int32_t> want_lens(static_cast<std::size_t>(tokens));
    reference::FaultLog log;
    reference::combine_indices(topk_host[std::size_t(current)].data(), w.top_k, kRatio, kWindow, chunk.host, tokens,
                               w.requests, want.data(), width, want_lens.data(), log);
    std::vector<std::int32_t> got_lens(static_cast<std::size_t>(tokens));
    SPG_CUDA_TRY(cudaMemcpy(got_lens.data(), lens.data(), got_lens.size() * 4, cudaMemcpyDeviceToHost));
    SPG_EXPECTS_AS(Error, got_lens == want_lens, w.name << ": lens differ from the reference");
    std::vector<std::int32_t> got(want.size());
    SPG_CUDA_TRY(cudaMemcpy(got.data(), combined[std::size_t(current)].data(), got.size() * 4, cudaMemcpyDeviceToHost));
    for (int k = 0; k < tokens; ++k) {
      const auto first = std::size_t(k) * std::size_t(width);
      SPG_EXPECTS_AS(Error, std::equal(got.begin() + std::ptrdiff_t(first), got.begin() + std::ptrdiff_t(first) + want_lens[std::size_t(k)],
                                       want.begin() + std::ptrdiff_t(first)),
                     w.name << ": combined row " << k << " differs from the reference");
    }
    double written = 0.0;
    for (const std::int32_t l : want_lens) written += 4.0 * (l + 1);
    const double read = 4.0 * tokens * std::min(w.top_k, rows);
    for (const auto& [variant, us] : {std::pair<const char*, double>{"spgraph", t.single_us},
                                      std::pair<const char*, double>{"spgraph-back-to-back", t.back_to_back_us}}) {
      reporter.add(Record{"kernels", w.name, variant, "gpu_us", us});
      reporter.add(Record{"kernels", w.name, variant, "gbps", written / (us * 1e-6) / kGB});
      reporter.add(Record{"kernels", w.name, variant, "gbps_read_written", (written + read) / (us * 1e-6) / kGB});
    }
  }
}

}  // namespace

void run_kernel_benchmarks(Reporter& reporter, cudaStream_t stream) {
  const ClockWarmer warmer;
  if (!has_copy_ceiling(reporter)) {
    warmer.warm(stream);
    measure_copy_ceiling(reporter, stream);
  }
  double copy_gbps = std::numeric_limits<double>::quiet_NaN();
  for (const Record& r : reporter.records()) {
    if (r.suite == "ceilings" && r.name == "copy" && r.metric == "gbps") copy_gbps = r.value;
  }
  measure_cache_kernels(reporter, warmer, stream, copy_gbps);
  measure_combine(reporter, warmer, stream);
}

}  // namespace spg::bench
