// Executor: see executor.hpp and docs/graphs.md.
#include "graphs/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "memory/error.hpp"
#include "memory/pipeline_pool.hpp"

namespace spg::graphs {

namespace {

using memory::kNumRatios;
using memory::kRatios;
using memory::ratio_index;

std::vector<std::vector<int>> make_programs(const memory::PipelineConfig& config, const ExecutorOptions& o) {
  if (o.programs.empty()) {
    std::vector<int> all(config.layers.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    return {all};
  }
  for (std::size_t p = 0; p < o.programs.size(); ++p) {
    SPG_EXPECTS(!o.programs[p].empty(), "programs[" << p << "] is empty; a program needs at least one layer");
    for (int l : o.programs[p]) {
      SPG_EXPECTS(l >= 0 && l < static_cast<int>(config.layers.size()),
                  "programs[" << p << "] names layer " << l << "; layers are 0 .. " << config.layers.size() - 1);
    }
  }
  return o.programs;
}

BucketSet make_buckets(const memory::PipelineConfig& config, const ExecutorOptions& o) {
  if (o.r_buckets.empty() && o.t_buckets.empty()) {
    return BucketSet::make_default(config.max_requests, config.max_tokens);
  }
  const BucketSet d = BucketSet::make_default(config.max_requests, config.max_tokens);
  return BucketSet(o.r_buckets.empty() ? d.r_buckets() : o.r_buckets,
                   o.t_buckets.empty() ? d.t_buckets() : o.t_buckets, config.max_requests, config.max_tokens);
}

std::size_t attention_headroom(const memory::PipelineConfig& config, const std::vector<std::vector<int>>& programs,
                               const BucketSet& buckets) {
  std::size_t bytes = 0;
  for (const auto& layers : programs) {
    for (int b = 0; b < buckets.size(); ++b) {
      bytes = std::max(bytes, Pipeline::attention_workspace_bytes(config, layers, buckets.r_of(b), buckets.t_of(b)));
    }
  }
  return bytes;
}

/// Compressed blocks a request of seq_len tokens reads: its seq_len / r rows, block_tokens / r a block.
std::size_t compressed_blocks_needed(int seq_len, int r, int block_tokens) {
  const int rows = seq_len / r;
  const int per_block = block_tokens / r;
  return static_cast<std::size_t>((rows + per_block - 1) / per_block);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* run_status_name(RunStatus s) noexcept {
  switch (s) {
    case RunStatus::ok: return "ok";
    case RunStatus::no_bucket: return "no bucket holds the chunk (more requests or tokens than the largest bucket)";
    case RunStatus::bad_chunk: return "chunk inconsistent with the config (lengths, block tables or slots)";
    case RunStatus::bad_program: return "no such program";
    case RunStatus::not_warmed_up: return "warmup() has not run";
    case RunStatus::cuda_error: return "a CUDA call failed";
  }
  return "unknown";
}

Executor::Executor(memory::PipelineConfig config, ExecutorOptions options)
    : config_(std::move(config)),
      options_(std::move(options)),
      buckets_(make_buckets(config_, options_)),
      programs_(make_programs(config_, options_)),
      pool_(memory::plan_pipeline_pool(config_), attention_headroom(config_, programs_, buckets_)),
      meta_(memory::ChunkMetaLayout::make(config_)),
      staged_{memory::Event(false), memory::Event(false)} {
  for (const auto& layers : programs_) {
    int mask = 0;
    for (int l : layers) mask |= 1 << ratio_index(config_.layers[static_cast<std::size_t>(l)].compress_ratio);
    program_ratios_.push_back(mask);
  }
  // Unwritten metadata must never be garbage a kernel could trust: start from zeros.
  SPG_CUDA_TRY(cudaMemsetAsync(pool_.bytes(memory::slots::kChunkMeta, meta_.bytes()), 0, meta_.bytes(), stream()));
  for (int s = 0; s < 2; ++s) {
    staging_[s] = reinterpret_cast<std::int32_t*>(pool_.bytes(memory::slots::kStaging[s], meta_.bytes()));
    std::memset(staging_[s], 0, meta_.bytes());
  }
  SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
}

Executor::~Executor() {
  // Graphs and the pool must not be torn down under running work.
  const cudaError_t e = cudaStreamSynchronize(stream_.get());
  memory::detail::report_release_failure("executor stream work", e);
}

WarmupReport Executor::warmup() {
  SPG_EXPECTS_AS(StateError, !warmed_up_, "Executor::warmup: already warmed up");
  WarmupReport report;
  report.buckets = buckets_.size();
  report.programs = programs();

  const std::size_t ws_bytes = attention_headroom(config_, programs_, buckets_);
  if (ws_bytes > 0) {
    pool_.carve(memory::SlotSpec{"attention_workspace", ws_bytes, 256, memory::MemoryKind::device,
                                 "split-top-k partials"});
    attention_workspace_ = pool_.bytes("attention_workspace", ws_bytes);
  }

  entries_.clear();
  entries_.resize(programs_.size() * static_cast<std::size_t>(buckets_.size()));
  for (int p = 0; p < programs(); ++p) {
    for (int b = 0; b < buckets_.size(); ++b) {
      entry(p, b)->pipeline = std::make_unique<Pipeline>(config_, pool_, programs_[static_cast<std::size_t>(p)],
                                                         buckets_.r_of(b), buckets_.t_of(b), options_.insert,
                                                         attention_workspace_);
    }
  }
  report.kernel_launches_per_step = entry(0, buckets_.size() - 1)->pipeline->kernel_launches();

  // One eager pass over every shape with an empty chunk: loads every kernel and checks every launch.
  const ChunkInput empty{};
  const RunStatus st = write_staging(empty, 0, 0, 0);
  SPG_EXPECTS_AS(StateError, st == RunStatus::ok, "warm-up: the empty chunk was refused: " << run_status_name(st));
  auto t0 = std::chrono::steady_clock::now();
  for (auto& e : entries_) SPG_CUDA_TRY(e.pipeline->record(0, stream()));
  SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
  report.eager_ms = ms_since(t0);

  if (options_.capture) {
    std::size_t free_before = 0;
    std::size_t free_after = 0;
    std::size_t total = 0;
    SPG_CUDA_TRY(cudaMemGetInfo(&free_before, &total));
    t0 = std::chrono::steady_clock::now();
    for (int p = 0; p < programs(); ++p) {
      for (int b = buckets_.size() - 1; b >= 0; --b) {  // largest first
        Entry* e = entry(p, b);
        for (int s = 0; s < 2; ++s) {
          CaptureGuard guard(stream());
          SPG_CUDA_TRY(e->pipeline->record(s, stream()));
          const Graph graph = guard.finish();
          e->exec[s] = GraphExec::instantiate(graph, stream());
          ++report.graphs;
        }
      }
    }
    SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
    report.capture_ms = ms_since(t0);
    SPG_CUDA_TRY(cudaMemGetInfo(&free_after, &total));
    report.graph_device_bytes = static_cast<std::int64_t>(free_before) - static_cast<std::int64_t>(free_after);
  }
  pool_.seal();
  report.pool_device_bytes = pool_.device_bytes();
  report.pool_pinned_bytes = pool_.pinned_bytes();
  report.pool_allocation_calls = pool_.allocation_calls();
  warmed_up_ = true;
  return report;
}

RunStatus Executor::write_staging(const ChunkInput& chunk, int program, int bucket, int s) noexcept {
  const int n = static_cast<int>(chunk.requests.size());
  if (n > config_.max_requests) return RunStatus::no_bucket;
  const int mask = program_ratios_[static_cast<std::size_t>(program)];
  const int window = config_.layers[0].window;
  const int swa_bs = config_.cache.swa_block_size;
  const int ctok = config_.cache.block_tokens;
  int tokens = 0;
  for (const RequestInput& r : chunk.requests) {
    if (r.query_len < 0 || r.seq_len < r.query_len || r.seq_len > config_.max_model_len) return RunStatus::bad_chunk;
    tokens += r.query_len;
    const std::size_t swa_need = static_cast<std::size_t>((r.seq_len + swa_bs - 1) / swa_bs);
    if (r.swa_blocks.size() < swa_need) return RunStatus::bad_chunk;
    for (int i = 1; i < kNumRatios; ++i) {
      if ((mask >> i & 1) && r.compressed_blocks[i].size() < compressed_blocks_needed(r.seq_len, kRatios[i], ctok)) {
        return RunStatus::bad_chunk;
      }
    }
  }
  if (tokens > config_.max_tokens) return RunStatus::no_bucket;
  // No slot lists: the inserts derive every slot from the block tables on the device.
  const bool derive = chunk.swa_slots.empty();
  int new_rows[kNumRatios] = {0, 0, 0};
  if (options_.insert && n > 0) {
    if (!derive && chunk.swa_slots.size() != static_cast<std::size_t>(tokens)) return RunStatus::bad_chunk;
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(mask >> i & 1)) continue;
      if (derive) {
        if (!chunk.compressed_slots[i].empty()) return RunStatus::bad_chunk;  // both lists or neither
        for (const RequestInput& r : chunk.requests) {
          new_rows[i] += r.seq_len / kRatios[i] - (r.seq_len - r.query_len) / kRatios[i];
        }
      } else {
        new_rows[i] = static_cast<int>(chunk.compressed_slots[i].size());
      }
      // The bucket's insert launch covers min(T_bucket / r + R_bucket, capacity) rows.
      const int rows = std::min(buckets_.t_of(bucket) / kRatios[i] + buckets_.r_of(bucket),
                                memory::ChunkMetaLayout::compressed_slot_capacity(config_, kRatios[i]));
      if (new_rows[i] > rows) return RunStatus::bad_chunk;
    }
  }

  // Valid: fill the staging block. Only what the kernels will read this step is written.
  std::int32_t* w = staging_[s];
  int max_gather = 0;
  int* qsl = w + meta_.query_start_loc;
  qsl[0] = 0;
  for (int b = 0; b < config_.max_requests; ++b) {
    const bool real = b < n;
    const RequestInput* r = real ? &chunk.requests[static_cast<std::size_t>(b)] : nullptr;
    const int seq = real ? r->seq_len : 0;
    const int gather = real ? std::min(seq, r->query_len + window - 1) : 0;
    qsl[b + 1] = qsl[b] + (real ? r->query_len : 0);
    w[meta_.seq_lens + b] = seq;
    w[meta_.gather_lens + b] = gather;
    max_gather = std::max(max_gather, gather);
    if (!real) continue;
    // Only the SWA blocks of the window positions [seq - gather, seq) are ever read (the gather's
    // window and the insert's new tokens): the rest of the row is left as it was.
    const std::size_t swa_first = static_cast<std::size_t>((seq - gather) / swa_bs);
    const std::size_t swa_end = static_cast<std::size_t>((seq + swa_bs - 1) / swa_bs);
    std::memcpy(w + meta_.swa_block_table + b * meta_.swa_table_width + swa_first, r->swa_blocks.data() + swa_first,
                (swa_end - swa_first) * 4);
    for (int i = 1; i < kNumRatios; ++i) {
      if (!(mask >> i & 1)) continue;
      const std::size_t need = compressed_blocks_needed(seq, kRatios[i], ctok);
      std::memcpy(w + meta_.compressed_block_table[i] + b * meta_.compressed_table_width,
                  r->compressed_blocks[i].data(), need * 4);
    }
  }
  for (int i = 0; i < kNumRatios; ++i) {
    const int r = kRatios[i];
    int n_rows = 0;
    for (int b = 0; b < n && r > 1; ++b) n_rows = std::max(n_rows, chunk.requests[static_cast<std::size_t>(b)].seq_len / r);
    auto* sc = reinterpret_cast<kernels::ChunkScalars*>(w + meta_.scalars) + i;
    sc->num_requests = n;
    sc->num_tokens = tokens;
    sc->n_rows = n_rows;
    sc->m_rows = n_rows + max_gather;
    sc->new_rows = options_.insert ? new_rows[i] : 0;
    sc->derive_slots = derive ? 1 : 0;
  }
  if (options_.insert && n > 0 && !derive) {
    std::memcpy(w + meta_.swa_slots, chunk.swa_slots.data(), chunk.swa_slots.size_bytes());
    for (int i = 1; i < kNumRatios; ++i) {
      if ((mask >> i & 1) && !chunk.compressed_slots[i].empty()) {
        std::memcpy(w + meta_.compressed_slots[i], chunk.compressed_slots[i].data(),
                    chunk.compressed_slots[i].size_bytes());
      }
    }
  }
  return RunStatus::ok;
}

RunResult Executor::launch(const ChunkInput& chunk, int program, bool graph) noexcept {
  RunResult result;
  if (!warmed_up_ || (graph && !options_.capture)) {
    result.status = RunStatus::not_warmed_up;
    return result;
  }
  if (program < 0 || program >= programs()) {
    result.status = RunStatus::bad_program;
    return result;
  }
  result.bucket = buckets_.lookup(static_cast<int>(chunk.requests.size()), chunk.num_tokens());
  if (result.bucket < 0) {
    result.status = RunStatus::no_bucket;
    return result;
  }
  const int s = static_cast<int>(steps_ & 1);
  // The staging hazard: block s was last read by the launch two steps ago. Its event is recorded
  // after that whole launch, so the host waits only when it is two full steps ahead of the device.
  if (staged_pending_[s]) {
    cudaError_t q = cudaEventQuery(staged_[s].get());
    if (q == cudaErrorNotReady) {
      ++host_waits_;
      const auto t0 = std::chrono::steady_clock::now();
      q = cudaEventSynchronize(staged_[s].get());
      result.waited_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    if (q != cudaSuccess) {
      result.status = RunStatus::cuda_error;
      result.cuda = q;
      return result;
    }
    staged_pending_[s] = false;
  }
  using Clock = std::chrono::steady_clock;
  const bool timed = options_.time_host_phases;
  const Clock::time_point t0 = timed ? Clock::now() : Clock::time_point{};
  result.status = write_staging(chunk, program, result.bucket, s);
  if (result.status != RunStatus::ok) return result;
  Entry* e = entry(program, result.bucket);
  const Clock::time_point t1 = timed ? Clock::now() : Clock::time_point{};
  cudaError_t err = graph ? e->exec[s].launch(stream()) : e->pipeline->record(s, stream());
  const Clock::time_point t2 = timed ? Clock::now() : Clock::time_point{};
  if (err == cudaSuccess) err = cudaEventRecord(staged_[s].get(), stream());
  if (timed) {
    using Us = std::chrono::duration<double, std::micro>;
    result.phases = {Us(t1 - t0).count(), Us(t2 - t1).count(), Us(Clock::now() - t2).count()};
  }
  if (err != cudaSuccess) {
    result.status = RunStatus::cuda_error;
    result.cuda = err;
    return result;
  }
  staged_pending_[s] = true;
  ++steps_;
  return result;
}

RunResult Executor::run(const ChunkInput& chunk, int program) noexcept { return launch(chunk, program, true); }
RunResult Executor::run_eager(const ChunkInput& chunk, int program) noexcept { return launch(chunk, program, false); }

void Executor::synchronize() const { SPG_CUDA_TRY(cudaStreamSynchronize(stream())); }

kernels::StepStatus Executor::read_status() const {
  kernels::StepStatus status{};
  SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
  SPG_CUDA_TRY(cudaMemcpy(&status, pool_.bytes(memory::slots::kStepStatus, sizeof status), sizeof status,
                          cudaMemcpyDeviceToHost));
  return status;
}

}  // namespace spg::graphs
