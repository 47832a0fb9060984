// The replay path's host work makes no heap allocation: ChunkEncoder::check and write (what
// Executor::run does on the host besides the graph launch) over accepted, refused and empty chunks,
// with slot lists and without, and StepStager::check and write (run(StepInput)'s) over steps. Counted by replacing the global operator new for this binary (it
// counts only while a check runs).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "common/catch.hpp"
#include "samples/bench/step_inputs.hpp"
#include "spgraph/graphs/buckets.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/step.hpp"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

// Every form of the global operator new and delete, so that none mixes with another allocator's
// (AddressSanitizer checks that what malloc gave is what free takes back).
namespace {
void* counted(std::size_t n, std::size_t align) noexcept {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}
void* counted_or_throw(std::size_t n, std::size_t align) {
  if (void* p = counted(n, align)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_or_throw(n, 0); }
void* operator new[](std::size_t n) { return counted_or_throw(n, 0); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return counted(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

using namespace spg;
using graphs::ChunkInput;
using graphs::RequestInput;

TEST_CASE("the encoder's check and write allocate nothing", "[chunk][allocation]") {
  model::PipelineConfig cfg = model::PipelineConfig::v4_default();
  graphs::ChunkEncoder enc(cfg, true);
  const int bs = cfg.cache.swa_block_size;
  std::vector<std::vector<std::int32_t>> swa(4), comp(4);
  std::vector<RequestInput> requests(4);
  std::vector<std::int32_t> swa_slots, slots4, slots128;
  for (int b = 0; b < 4; ++b) {
    for (int i = 0; i < cfg.swa_blocks_per_request(); ++i) swa[static_cast<std::size_t>(b)].push_back(b * cfg.swa_blocks_per_request() + i);
    for (int i = 0; i < cfg.compressed_blocks_per_request(); ++i) {
      comp[static_cast<std::size_t>(b)].push_back(b * cfg.compressed_blocks_per_request() + i);
    }
    RequestInput& r = requests[static_cast<std::size_t>(b)];
    r.query_len = 300 + 20 * b;
    r.seq_len = 5000 + 777 * b;
    r.swa_blocks = swa[static_cast<std::size_t>(b)];
    r.compressed_blocks[1] = r.compressed_blocks[2] = comp[static_cast<std::size_t>(b)];
    for (int p = r.seq_len - r.query_len; p < r.seq_len; ++p) swa_slots.push_back(static_cast<std::int32_t>(graphs::slot_of(r.swa_blocks, bs, p)));
    for (int row = (r.seq_len - r.query_len) / 4; row < r.seq_len / 4; ++row) {
      slots4.push_back(static_cast<std::int32_t>(graphs::slot_of(r.compressed_blocks[1], 64, row)));
    }
    for (int row = (r.seq_len - r.query_len) / 128; row < r.seq_len / 128; ++row) {
      slots128.push_back(static_cast<std::int32_t>(graphs::slot_of(r.compressed_blocks[2], 2, row)));
    }
  }
  ChunkInput listed;
  listed.requests = requests;
  listed.swa_slots = swa_slots;
  listed.compressed_slots[1] = slots4;
  listed.compressed_slots[2] = slots128;
  ChunkInput derived;
  derived.requests = requests;
  std::vector<RequestInput> shared = requests;  // request 1 writes into request 0's last block
  std::vector<std::int32_t> other = swa[1];
  other[static_cast<std::size_t>((shared[1].seq_len - 1) / bs)] = swa[0][static_cast<std::size_t>((shared[0].seq_len - 1) / bs)];
  shared[1].swa_blocks = other;
  ChunkInput refused;
  refused.requests = shared;
  std::vector<std::int32_t> words(static_cast<std::size_t>(enc.layout().words));
  constexpr int kAll = 1 << 0 | 1 << 1 | 1 << 2;
  int ok = 0;
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 100; ++i) {
    for (const ChunkInput* in : {&listed, &derived, &refused}) {
      const graphs::ChunkCheck ck = enc.check(*in, kAll);
      if (ck.status == graphs::RunStatus::ok) {
        enc.write(*in, ck, kAll, words.data());
        ++ok;
      }
    }
    const graphs::ChunkCheck empty = enc.check(ChunkInput{}, kAll);
    enc.write(ChunkInput{}, empty, kAll, words.data());
  }
  g_counting = false;
  CHECK(g_allocations.load() == 0);
  CHECK(ok == 200);  // the shared block is refused, the two good chunks accepted
}

TEST_CASE("the step stager's check and write allocate nothing", "[step][allocation]") {
  // Steps of 1, 4 and 16 full chunks of the V4 program at R = 4, T = 256 (the step benchmarks'),
  // accepted, and one refused (a block id outside the cache in its last request).
  const model::PipelineConfig cfg = bench::step_config(true);
  const graphs::BucketSet buckets = graphs::BucketSet::make_default(cfg.max_requests, cfg.max_tokens);
  graphs::ChunkEncoder enc(cfg, true);
  const graphs::StepLayout layout = graphs::StepLayout::make(cfg, 64, 4096);
  graphs::StepStager stager(cfg, layout, buckets, enc);
  bench::BenchStep steps[4];
  bench::make_step(cfg, 1, steps[0]);
  bench::make_step(cfg, 4, steps[1]);
  bench::make_step(cfg, 16, steps[2]);
  bench::make_step(cfg, 4, steps[3]);
  steps[3].swa.back()[static_cast<std::size_t>((bench::kStepPrefix + bench::kStepQuery - 1) / cfg.cache.swa_block_size)] =
      cfg.cache.swa_blocks;
  std::vector<std::int32_t> block(layout.words());
  constexpr int kAll = 1 << 0 | 1 << 1 | 1 << 2;
  int accepted = 0;
  int refused = 0;
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 100; ++i) {
    for (const bench::BenchStep& s : steps) {
      const graphs::StepCheck ck = stager.check(graphs::StepInput{s.requests}, kAll);
      if (ck.status == graphs::RunStatus::ok) {
        stager.write(kAll, block.data());
        ++accepted;
      } else {
        ++refused;
      }
    }
  }
  g_counting = false;
  CHECK(g_allocations.load() == 0);
  CHECK(accepted == 300);
  CHECK(refused == 100);
}
