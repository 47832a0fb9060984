// Benchmark records and timing for samples/bench: medians of CUDA-event-timed repetitions,
// printed as a table and written as the JSON records docs/benchmarks.md describes.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace spg::bench {

/// One measured median (docs/benchmarks.md, "Results file").
struct Record {
  std::string suite;    ///< ceilings | attention | kernels | pipeline | executor
  std::string name;     ///< row label, e.g. "V4-C2/32768"
  std::string variant;  ///< e.g. spgraph, spgraph-graph, spgraph-eager, flashmla-reference
  std::string metric;   ///< tflops, gpu_us, host_us, gbps, alloc_calls, capture_ms, ...
  double value{0.0};
};

class Reporter {
 public:
  void add(Record r) { records_.push_back(std::move(r)); }
  [[nodiscard]] const std::vector<Record>& records() const noexcept { return records_; }
  /// Finds a record's value; NaN when absent.
  [[nodiscard]] double value(const std::string& suite, const std::string& name, const std::string& variant,
                             const std::string& metric) const;
  /// Writes all records as a JSON list with the commit and date stamped on each.
  void write_json(const std::string& path, const std::string& commit, const std::string& date) const;
  /// Prints records of one suite as "name  variant  metric  value" rows.
  void print_table(const std::string& suite) const;

 private:
  std::vector<Record> records_;
};

/// Timing of `reps` calls of `launch` on `stream` after `warmup` calls, each call bracketed by
/// CUDA events; returns the median in microseconds. `before_each` (optional, untimed) runs before
/// each call, for instance to rotate inputs; `after_enqueue` (optional) after a timed call's stop
/// event is enqueued and before the host waits for it (to open a gate `before_each` enqueued
/// ahead of the start event). `warmup_ms` and `min_timed_ms` stretch the warm-up
/// and the timed calls to at least that much wall time, so a short kernel is timed under its own
/// steady load, not in the state the previous measurement left the GPU in.
struct TimingOptions {
  int warmup{5};
  int reps{30};
  double warmup_ms{0.0};
  double min_timed_ms{0.0};
};
double median_gpu_us(cudaStream_t stream, const std::function<void()>& launch, TimingOptions opt = {},
                     const std::function<void(int)>& before_each = {},
                     const std::function<void(int)>& after_enqueue = {});

/// Median of host-side wall time per call of `fn` (microseconds), after warm-up.
double median_host_us(const std::function<void()>& fn, TimingOptions opt = {});

double median(std::vector<double> v);

/// Microseconds from `a` to `b` on the steady clock.
inline double us_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace spg::bench
