// Table S (staging): see bench_staging.hpp.
#include "samples/bench/bench_staging.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/buckets.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/step.hpp"
#include "samples/bench/step_inputs.hpp"

namespace spg::bench {

namespace {

using Clock = std::chrono::steady_clock;

double us_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

/// Reads and writes a buffer larger than the last-level cache, a line at a time (and, in 4 KiB
/// pages, more pages than the TLBs hold): the step's inputs and staging block are then cold, as
/// after a step's GPU time with other host work in it.
void evict(std::vector<unsigned char>& buffer) {
  for (std::size_t i = 0; i < buffer.size(); i += 64) buffer[i] = static_cast<unsigned char>(buffer[i] + 1);
}

}  // namespace

void run_staging_benchmarks(Reporter& rep, int reps) {
  SPG_EXPECTS(reps >= 1, "bench: --staging-reps = " << reps << " must be at least 1");
  // steady_clock's own cost, in every sample below once.
  std::vector<double> clock;
  for (int i = 0; i < 1000; ++i) {
    const auto t0 = Clock::now();
    const auto t1 = Clock::now();
    clock.push_back(us_between(t0, t1));
  }
  std::printf("  staging (host only, plain host memory): steady_clock::now() pair %.3f us\n", median(clock));
  std::vector<unsigned char> eviction(std::size_t{96} << 20, 0);
  const int cold_reps = std::max(5, reps / 100);
  for (const bool model : {false, true}) {
    const model::PipelineConfig config = step_config(model);
    // As table D's executor: default buckets, the insert stage, steps of up to 16 full chunks.
    const graphs::BucketSet buckets = graphs::BucketSet::make_default(config.max_requests, config.max_tokens);
    graphs::ChunkEncoder encoder(config, true);
    const graphs::StepLayout layout =
        graphs::StepLayout::make(config, kStepMaxChunks * kStepR, kStepMaxChunks * kStepT);
    graphs::StepStager stager(config, layout, buckets, encoder);
    graphs::StepSplitter splitter(config, layout);
    int mask = 0;
    for (const model::LayerConfig& l : config.layers) mask |= 1 << graphs::ratio_index(l.compress_ratio);
    std::vector<std::int32_t> block(layout.words(), 0);
    const std::string program = model ? "8-layer" : "1-layer";
    for (const int chunks : {1, 4, 16}) {
      BenchStep step;
      make_step(config, chunks, step);
      const graphs::StepInput in{step.requests};
      std::vector<double> split_us;
      std::vector<double> check_us;
      std::vector<double> write_us;
      std::vector<double> total_us;
      const int warmup = reps / 10 + 10;
      for (int i = 0; i < warmup + reps; ++i) {
        const auto t0 = Clock::now();
        const graphs::StepSplit split = splitter.split(in);
        const auto t1 = Clock::now();
        const graphs::StepCheck checked = stager.check(in, mask);
        const auto t2 = Clock::now();
        stager.write(mask, block.data());
        const auto t3 = Clock::now();
        // The executor's staging phase: check, then write, one timed span.
        const graphs::StepCheck again = stager.check(in, mask);
        stager.write(mask, block.data());
        const auto t4 = Clock::now();
        SPG_EXPECTS_AS(StateError, split.chunks == chunks && checked.status == graphs::RunStatus::ok &&
                                       checked.chunks == chunks && again.chunks == chunks,
                       "bench: the " << program << " step of " << chunks << " chunks was not staged ("
                                     << graphs::run_status_name(checked.status) << ", "
                                     << (checked.bad_field != nullptr ? checked.bad_field : "") << ")");
        if (i < warmup) continue;
        split_us.push_back(us_between(t0, t1));
        check_us.push_back(us_between(t1, t2));
        write_us.push_back(us_between(t2, t3));
        total_us.push_back(us_between(t3, t4));
      }
      std::vector<double> cold_us;
      for (int i = 0; i < cold_reps; ++i) {
        evict(eviction);
        const auto t0 = Clock::now();
        const graphs::StepCheck checked = stager.check(in, mask);
        stager.write(mask, block.data());
        const auto t1 = Clock::now();
        SPG_EXPECTS_AS(StateError, checked.chunks == chunks, "bench: a cold step was not staged");
        cold_us.push_back(us_between(t0, t1));
      }
      SPG_EXPECTS_AS(StateError, block[static_cast<std::size_t>(kernels::StepStateWords::count)] == chunks,
                     "bench: the staging block does not hold the step");
      const std::string row = "staging/" + program + "/" + std::to_string(chunks) + " chunks";
      auto add = [&](const char* metric, double v) { rep.add({"staging", row, "host", metric, v}); };
      const double total = median(total_us);
      add("staging_us", total);
      add("staging_us_per_chunk", total / chunks);
      add("split_us", median(split_us));
      add("check_us", median(check_us));
      add("write_us", median(write_us));
      add("staging_us_cold", median(cold_us));
      std::printf("  %-28s staging %.3f us (%.3f us a chunk): split %.3f, split + checks %.3f, writes %.3f; "
                  "cold caches %.2f us\n",
                  row.c_str(), total, total / chunks, median(split_us), median(check_us), median(write_us),
                  median(cold_us));
    }
  }
}

}  // namespace spg::bench
