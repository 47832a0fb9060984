// Table S (staging): see bench_staging.hpp.
#include "samples/bench/bench_staging.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
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

/// Reads and writes a buffer larger than the last-level cache, a line at a time (and, in 4 KiB
/// pages, more pages than the TLBs hold): the step's inputs and staging block are then cold, as
/// after a step's GPU time with other host work in it.
void evict(std::vector<unsigned char>& buffer) {
  for (std::size_t i = 0; i < buffer.size(); i += 64) buffer[i] = static_cast<unsigned char>(buffer[i] + 1);
}

/// One program's staging state, as table D's executor holds it: default buckets, the insert
/// stage, steps of up to 16 full chunks.
struct Program {
  explicit Program(bool model)
      : name(model ? "8-layer" : "1-layer"),
        config(step_config(model)),
        buckets(graphs::BucketSet::make_default(config.max_requests, config.max_tokens)),
        encoder(config, true),
        layout(graphs::StepLayout::make(config, kStepMaxChunks * kStepR, kStepMaxChunks * kStepT)),
        stager(config, layout, buckets, encoder),
        splitter(config, layout),
        block(layout.words(), 0) {
    for (const model::LayerConfig& l : config.layers) mask |= 1 << graphs::ratio_index(l.compress_ratio);
  }
  std::string name;
  model::PipelineConfig config;
  graphs::BucketSet buckets;
  graphs::ChunkEncoder encoder;
  graphs::StepLayout layout;
  graphs::StepStager stager;
  graphs::StepSplitter splitter;
  std::vector<std::int32_t> block;
  int mask{0};
};

/// One row: a program's step of `chunks` chunks and its samples.
struct Row {
  Program* program{nullptr};
  int chunks{0};
  BenchStep step;
  std::vector<double> split_us, check_us, write_us, total_us, cold_us;
};

/// One sample of each phase of `row`, `cold` after flushing the caches (staging only).
void sample(Row& row, bool record, std::vector<unsigned char>* cold) {
  Program& p = *row.program;
  const graphs::StepInput in{row.step.requests};
  if (cold != nullptr) {
    evict(*cold);
    const auto t0 = Clock::now();
    const graphs::StepCheck checked = p.stager.check(in, p.mask);
    p.stager.write(p.mask, p.block.data());
    const auto t1 = Clock::now();
    SPG_EXPECTS_AS(StateError, checked.chunks == row.chunks, "bench: a cold step was not staged");
    row.cold_us.push_back(us_between(t0, t1));
    return;
  }
  const auto t0 = Clock::now();
  const graphs::StepSplit split = p.splitter.split(in);
  const auto t1 = Clock::now();
  const graphs::StepCheck checked = p.stager.check(in, p.mask);
  const auto t2 = Clock::now();
  p.stager.write(p.mask, p.block.data());
  const auto t3 = Clock::now();
  // The executor's staging phase: check, then write, one timed span.
  const graphs::StepCheck again = p.stager.check(in, p.mask);
  p.stager.write(p.mask, p.block.data());
  const auto t4 = Clock::now();
  SPG_EXPECTS_AS(StateError, split.chunks == row.chunks && checked.status == graphs::RunStatus::ok &&
                                 checked.chunks == row.chunks && again.chunks == row.chunks &&
                                 p.block[static_cast<std::size_t>(kernels::StepStateWords::count)] == row.chunks,
                 "bench: the " << p.name << " step of " << row.chunks << " chunks was not staged ("
                               << graphs::run_status_name(checked.status) << ", "
                               << (checked.bad_field != nullptr ? checked.bad_field : "") << ")");
  if (!record) return;
  row.split_us.push_back(us_between(t0, t1));
  row.check_us.push_back(us_between(t1, t2));
  row.write_us.push_back(us_between(t2, t3));
  row.total_us.push_back(us_between(t3, t4));
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
  std::unique_ptr<Program> programs[2] = {std::make_unique<Program>(false), std::make_unique<Program>(true)};
  std::vector<Row> rows;
  for (auto& p : programs) {
    for (const int chunks : {1, 4, 16}) {
      Row& row = rows.emplace_back();
      row.program = p.get();
      row.chunks = chunks;
      make_step(p->config, chunks, row.step);
    }
  }
  // The rows take turns in rounds, so that each row's median spans the same stretch of the
  // machine's time (a shared machine's speed moves by tens of percent between seconds).
  constexpr int kRounds = 20;
  for (Row& row : rows) {
    for (int i = 0; i < reps / 10 + 10; ++i) sample(row, false, nullptr);
  }
  for (int round = 0; round < kRounds; ++round) {
    const int n = reps / kRounds + (round < reps % kRounds ? 1 : 0);
    const int cold = cold_reps / kRounds + (round < cold_reps % kRounds ? 1 : 0);
    for (Row& row : rows) {
      for (int i = 0; i < n; ++i) sample(row, true, nullptr);
      for (int i = 0; i < cold; ++i) sample(row, true, &eviction);
    }
  }
  for (Row& row : rows) {
    const std::string name = "staging/" + row.program->name + "/" + std::to_string(row.chunks) + " chunks";
    auto add = [&](const char* metric, double v) { rep.add({"staging", name, "host", metric, v}); };
    const double total = median(row.total_us);
    add("staging_us", total);
    add("staging_us_per_chunk", total / row.chunks);
    add("split_us", median(row.split_us));
    add("check_us", median(row.check_us));
    add("write_us", median(row.write_us));
    add("staging_us_cold", median(row.cold_us));
    std::printf("  %-28s staging %.3f us (%.3f us a chunk): split %.3f, split + checks %.3f, writes %.3f; "
                "cold caches %.2f us\n",
                name.c_str(), total, total / row.chunks, median(row.split_us), median(row.check_us),
                median(row.write_us), median(row.cold_us));
  }
}

}  // namespace spg::bench
