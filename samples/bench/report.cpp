// See report.hpp.
#include "samples/bench/report.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"

namespace spg::bench {

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Reporter::value(const std::string& suite, const std::string& name, const std::string& variant,
                       const std::string& metric) const {
  for (const Record& r : records_) {
    if (r.suite == suite && r.name == name && r.variant == variant && r.metric == metric) return r.value;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

void Reporter::write_json(const std::string& path, const std::string& commit, const std::string& date) const {
  std::ofstream out(path);
  SPG_EXPECTS(out.good(), "--json: cannot write '" << path << "'");
  out << "[\n";
  for (std::size_t i = 0; i < records_.size(); ++i) {
    const Record& r = records_[i];
    char value[64];
    if (std::isfinite(r.value)) {
      std::snprintf(value, sizeof value, "%.6g", r.value);
    } else {
      std::snprintf(value, sizeof value, "null");
    }
    out << "  {\"suite\": \"" << r.suite << "\", \"name\": \"" << r.name << "\", \"variant\": \"" << r.variant
        << "\", \"metric\": \"" << r.metric << "\", \"value\": " << value << ", \"commit\": \"" << commit
        << "\", \"date\": \"" << date << "\"}" << (i + 1 < records_.size() ? ",\n" : "\n");
  }
  out << "]\n";
}

void Reporter::print_table(const std::string& suite) const {
  std::printf("\n== %s ==\n", suite.c_str());
  for (const Record& r : records_) {
    if (r.suite != suite) continue;
    std::printf("  %-34s %-20s %-12s %12.4g\n", r.name.c_str(), r.variant.c_str(), r.metric.c_str(), r.value);
  }
}

double median_gpu_us(cudaStream_t stream, const std::function<void()>& launch, TimingOptions opt,
                     const std::function<void(int)>& before_each, const std::function<void(int)>& after_enqueue) {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  int call = 0;
  const auto warm_start = Clock::now();
  for (; call < opt.warmup || ms_since(warm_start) < opt.warmup_ms; ++call) {
    if (before_each) before_each(call);
    launch();
    if (after_enqueue) after_enqueue(call);
    if (call % 16 == 15) SPG_CUDA_TRY(cudaStreamSynchronize(stream));  // keep the queue short
  }
  SPG_CUDA_TRY(cudaStreamSynchronize(stream));
  core::Event start;
  core::Event stop;
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(opt.reps));
  const auto timed_start = Clock::now();
  for (int i = 0; i < opt.reps || ms_since(timed_start) < opt.min_timed_ms; ++i, ++call) {
    if (before_each) before_each(call);
    start.record(stream);
    launch();
    stop.record(stream);
    if (after_enqueue) after_enqueue(call);
    stop.synchronize();
    us.push_back(1000.0 * stop.elapsed_ms_since(start));
  }
  SPG_CUDA_TRY(cudaGetLastError());
  return median(std::move(us));
}

double median_host_us(const std::function<void()>& fn, TimingOptions opt) {
  for (int i = 0; i < opt.warmup; ++i) fn();
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(opt.reps));
  for (int i = 0; i < opt.reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return median(std::move(us));
}

}  // namespace spg::bench
