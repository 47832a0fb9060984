// KvInsert and KvGather on the device against the CPU references, bit for bit: every case runs
// eagerly and as a captured graph replayed on two metadata sets of the same bucket.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cmath>
#include <limits>
#include <cstdint>
#include <random>
#include <vector>

#include "common/catch.hpp"
#include "gpu/kernels_test_util.hpp"
#include "spgraph/core/device_info.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"
#include "spgraph/kernels/reference/pipeline_reference.hpp"
#include "spgraph/kernels/step_status.hpp"

using namespace spg;
using namespace spg::kernels;
using spg::test::GuardedArray;
using spg::test::LaunchMode;

namespace {

constexpr std::uint8_t kKvPoison = 0xFF;  // bf16 0xFFFF: a NaN no gather of these caches produces

/// One insert step: rows, their slots and the real row count.
struct InsertStep {
  std::vector<std::uint16_t> rows;  // [rows_bucket, 512]
  std::vector<std::int32_t> slots;  // [rows_bucket]
  int num_rows{0};
};

InsertStep random_insert_step(std::mt19937& rng, int rows_bucket, int num_rows, const CacheLayout& layout,
                              int bad_slots) {
  InsertStep s;
  s.rows = test::random_k_rows(rng, std::size_t(rows_bucket));
  s.num_rows = num_rows;
  std::vector<std::int32_t> all(std::size_t(layout.capacity()));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int32_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  s.slots.assign(all.begin(), all.begin() + rows_bucket);
  // Some rows are skipped (-1); padded rows past num_rows hold garbage the kernel must not read.
  for (int i = 0; i < rows_bucket; i += 7) s.slots[std::size_t(i)] = -1;
  for (int i = num_rows; i < rows_bucket; ++i) s.slots[std::size_t(i)] = std::numeric_limits<std::int32_t>::max();
  const std::int32_t bad[] = {static_cast<std::int32_t>(layout.capacity()), -2, std::numeric_limits<std::int32_t>::max(),
                              static_cast<std::int32_t>(layout.capacity() + 5), std::numeric_limits<std::int32_t>::min()};
  for (int k = 0; k < bad_slots; ++k) s.slots[std::size_t(3 + 5 * k)] = bad[k % 5];
  return s;
}

/// Checks the device cache against the reference insert of `rows` at `slots` (the first
/// `num_rows` of `rows_bucket`) into `initial`; returns the reference's fault log.
reference::FaultLog expect_cache_after_insert(const GuardedArray<std::uint8_t>& cache,
                                              const std::vector<std::uint8_t>& initial, const std::uint16_t* rows,
                                              const std::int32_t* slots, int num_rows, int rows_bucket,
                                              const CacheLayout& layout) {
  std::vector<std::uint8_t> want = initial;
  reference::FaultLog log;
  reference::kv_insert(rows, slots, num_rows, rows_bucket, want.data(), layout, log);
  const std::string diff = test::first_mismatch(cache.download(), want, std::size_t(layout.block_stride), "cache bytes");
  INFO(diff);
  CHECK(diff.empty());
  return log;
}

void run_insert_case(int block_size, int num_blocks, int rows_bucket, int rows_a, int rows_b, int bad_slots) {
  std::mt19937 rng(1234U + unsigned(block_size * 31 + rows_bucket));
  const CacheLayout layout = CacheLayout::make(block_size, num_blocks);
  const std::vector<std::uint8_t> initial = test::random_cache(rng, layout);
  const InsertStep steps[2] = {random_insert_step(rng, rows_bucket, rows_a, layout, bad_slots),
                               random_insert_step(rng, rows_bucket, rows_b, layout, bad_slots)};

  core::Stream stream;
  GuardedArray<std::uint8_t> cache(layout.bytes());
  GuardedArray<std::uint16_t> rows(std::size_t(rows_bucket) * kKvDim);
  GuardedArray<std::int32_t> slots(static_cast<std::size_t>(rows_bucket));
  GuardedArray<std::int32_t> num_rows(1);
  GuardedArray<StepStatus> status(1);

  KvInsertArgs args;
  args.rows = reinterpret_cast<const __nv_bfloat16*>(rows.get());
  args.slot_mapping = slots.get();
  args.num_rows = num_rows.get();
  args.rows_bucket = rows_bucket;
  args.cache = cache.get();
  args.layout = layout;
  args.status = status.get();
  KvInsert::can_implement(args);

  auto load = [&](const InsertStep& s) {
    cache.upload(initial);
    rows.upload(s.rows);
    slots.upload(s.slots);
    num_rows.upload({s.num_rows});
  };
  auto check = [&](const InsertStep& s) {
    const reference::FaultLog log =
        expect_cache_after_insert(cache, initial, s.rows.data(), s.slots.data(), s.num_rows, rows_bucket, layout);
    CHECK(cache.damaged_guard_bytes() == 0);
    test::check_status(status.get(), log);
  };

  for (LaunchMode mode : {LaunchMode::eager, LaunchMode::graph}) {
    INFO(test::mode_name(mode) << ", block_size " << block_size << ", rows_bucket " << rows_bucket);
    load(steps[0]);
    if (mode == LaunchMode::eager) {
      SPG_CUDA_TRY(reset(status.get(), stream.get()));
      SPG_CUDA_TRY(KvInsert::run(args, stream.get()));
      stream.synchronize();
      check(steps[0]);
      continue;
    }
    const test::CapturedLaunch graph(stream.get(), [&] {
      const cudaError_t e = reset(status.get(), stream.get());
      return e != cudaSuccess ? e : KvInsert::run(args, stream.get());
    });
    graph.replay(stream.get());
    check(steps[0]);
    INFO("second metadata set: " << steps[1].num_rows << " rows");
    load(steps[1]);
    graph.replay(stream.get());
    check(steps[1]);
  }
}

/// Builds a gather case's caches and block tables and checks one metadata set per launch mode.
struct GatherSetup {
  int r;
  GatherPart part;
  int requests_bucket;
  int compressed_block_size;  // block_tokens / r
  int window_block_size;
  std::vector<reference::HostChunk> chunks;  // one per replay
  std::int64_t max_rows;                      // M_max
  int compressed_stride{0};
  int window_stride{0};
  // Faults to plant, applied to the block tables after they are drawn.
  std::vector<std::pair<std::size_t, std::int32_t>> compressed_table_edits{};
  std::vector<std::pair<std::size_t, std::int32_t>> window_table_edits{};
};

void run_gather_case(GatherSetup s) {
  std::mt19937 rng(977U + unsigned(s.r * 13 + int(s.part) * 7 + s.requests_bucket));
  const int window_blocks = s.requests_bucket * s.window_stride + 3;
  const int compressed_blocks = s.requests_bucket * std::max(s.compressed_stride, 1) + 5;
  const CacheLayout window_layout = CacheLayout::make(s.window_block_size, window_blocks);
  const CacheLayout compressed_layout = CacheLayout::make(s.compressed_block_size, compressed_blocks);
  const bool with_compressed = s.part != GatherPart::window;
  const bool with_window = s.part != GatherPart::compressed;

  std::vector<std::uint8_t> window_cache_host;
  std::vector<std::int32_t> window_table_host;
  if (with_window) {
    window_cache_host = test::random_cache(rng, window_layout);
    window_table_host = test::random_block_table(rng, s.requests_bucket, s.window_stride, window_blocks);
    for (auto [i, v] : s.window_table_edits) window_table_host[i] = v;
  }
  std::vector<std::uint8_t> compressed_cache_host;
  std::vector<std::int32_t> compressed_table_host;
  if (with_compressed) {
    compressed_cache_host = test::random_cache(rng, compressed_layout);
    compressed_table_host = test::random_block_table(rng, s.requests_bucket, s.compressed_stride, compressed_blocks);
    for (auto [i, v] : s.compressed_table_edits) compressed_table_host[i] = v;
  }

  core::Stream stream;
  GuardedArray<std::uint8_t> window_cache(with_window ? window_layout.bytes() : 16);
  GuardedArray<std::int32_t> window_table(with_window ? window_table_host.size() : 1);
  GuardedArray<std::uint8_t> compressed_cache(with_compressed ? compressed_layout.bytes() : 16);
  GuardedArray<std::int32_t> compressed_table(with_compressed ? compressed_table_host.size() : 1);
  if (with_window) {
    window_cache.upload(window_cache_host);
    window_table.upload(window_table_host);
  }
  if (with_compressed) {
    compressed_cache.upload(compressed_cache_host);
    compressed_table.upload(compressed_table_host);
  }
  const std::size_t kv_elems = std::size_t(s.requests_bucket) * std::size_t(s.max_rows) * kKvDim;
  GuardedArray<std::uint16_t> kv(kv_elems);
  GuardedArray<StepStatus> status(1);
  test::DeviceChunk chunk(s.requests_bucket);

  KvGatherArgs args;
  if (s.part == GatherPart::window) {
    args.cache = window_cache.get();
    args.layout = window_layout;
    args.block_table = window_table.get();
    args.block_table_stride = s.window_stride;
  } else {
    args.cache = compressed_cache.get();
    args.layout = compressed_layout;
    args.block_table = compressed_table.get();
    args.block_table_stride = s.compressed_stride;
  }
  if (s.part == GatherPart::both) {
    args.window_cache = window_cache.get();
    args.window_layout = window_layout;
    args.window_block_table = window_table.get();
    args.window_block_table_stride = s.window_stride;
  }
  args.chunk = chunk.arrays();
  args.part = s.part;
  args.compress_ratio = s.r;
  args.requests_bucket = s.requests_bucket;
  args.max_rows_per_request = s.max_rows;
  args.kv = reinterpret_cast<__nv_bfloat16*>(kv.get());
  args.status = status.get();
  KvGather::can_implement(args);

  const reference::CacheView window_view{window_cache_host.data(), window_layout, window_table_host.data(),
                                         s.window_stride};
  const reference::CacheView compressed_view{compressed_cache_host.data(), compressed_layout,
                                             compressed_table_host.data(), s.compressed_stride};
  const reference::CacheView& part_view = s.part == GatherPart::window ? window_view : compressed_view;

  auto check = [&](const reference::HostChunk& c) {
    std::vector<std::uint16_t> want(kv_elems, 0xFFFF);
    reference::FaultLog log;
    reference::kv_gather(part_view, window_view, c, s.part, s.r, s.requests_bucket, s.max_rows, want.data(), log);
    const std::string diff = test::first_mismatch(kv.download(), want, kKvDim, "kv (bf16 bits)");
    INFO(diff);
    CHECK(diff.empty());
    CHECK(kv.damaged_guard_bytes() == 0);
    test::check_status(status.get(), log);
  };

  for (LaunchMode mode : {LaunchMode::eager, LaunchMode::graph}) {
    INFO(test::mode_name(mode) << ", r = " << s.r << ", part " << int(s.part));
    kv.fill_bytes(kKvPoison);
    chunk.write(s.chunks[0]);
    if (mode == LaunchMode::eager) {
      SPG_CUDA_TRY(reset(status.get(), stream.get()));
      SPG_CUDA_TRY(KvGather::run(args, stream.get()));
      stream.synchronize();
      check(s.chunks[0]);
      continue;
    }
    const test::CapturedLaunch graph(stream.get(), [&] {
      const cudaError_t e = reset(status.get(), stream.get());
      return e != cudaSuccess ? e : KvGather::run(args, stream.get());
    });
    graph.replay(stream.get());
    check(s.chunks[0]);
    for (std::size_t k = 1; k < s.chunks.size(); ++k) {
      INFO("metadata set " << k);
      kv.fill_bytes(kKvPoison);
      chunk.write(s.chunks[k]);
      graph.replay(stream.get());
      check(s.chunks[k]);
    }
  }
}

/// Block table widths that fit every chunk's sequences.
void size_tables(GatherSetup& s, int max_seq) {
  s.window_stride = (max_seq + s.window_block_size - 1) / s.window_block_size;
  s.compressed_stride = s.r > 1 ? (max_seq / s.r + s.compressed_block_size - 1) / s.compressed_block_size : 0;
  s.compressed_stride = std::max(s.compressed_stride, 1);
  s.max_rows = 0;
  for (const auto& c : s.chunks) s.max_rows = std::max<std::int64_t>(s.max_rows, c.scalars.m_rows);
  s.max_rows += 3;
}

}  // namespace

TEST_CASE("insert quantizes rows into the cache exactly as the reference", "[gpu][kv_cache]") {
  SECTION("SWA layout, 64-row blocks, 47 then 29 of 53 rows") { run_insert_case(64, 5, 53, 47, 29, 0); }
  SECTION("C128A layout, 2-row blocks") { run_insert_case(2, 71, 41, 41, 13, 0); }
}

TEST_CASE("insert skips and counts slots outside the cache and leaves its guards untouched", "[gpu][kv_cache]") {
  run_insert_case(64, 3, 37, 37, 23, 4);
}

TEST_CASE("insert with num_rows past rows_bucket writes nothing and counts a scalars fault", "[gpu][kv_cache]") {
  run_insert_case(64, 3, 19, 20, 19, 0);
}

TEST_CASE("insert derives SWA slots from the block table exactly as the explicit slot list", "[gpu][kv_cache]") {
  // Three requests of a 4-request bucket: a long prefix, a fresh prompt, and one whose table rows
  // hold a block id outside the cache (its rows are counted and skipped); the padded request
  // has a table row past what its length needs.
  std::mt19937 rng(20261130);
  const int block = 16;
  const CacheLayout layout = CacheLayout::make(block, 40);
  const int stride = 5;  // table width: 80 positions
  const std::vector<int> query_lens = {20, 37, 15};
  const std::vector<int> seq_lens = {50, 37, 75};
  const int r_bucket = 4;
  const reference::HostChunk c = reference::make_host_chunk(query_lens, seq_lens, 1, 128, r_bucket);
  const int tokens = c.scalars.num_tokens;
  const int rows_bucket = 80;
  std::vector<std::int32_t> table(std::size_t(r_bucket) * stride);
  std::vector<std::int32_t> ids(40);
  for (int i = 0; i < 40; ++i) ids[std::size_t(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = ids[i];
  table[2 * stride + 4] = 40;  // request 2, positions 64..79: outside the cache

  // The explicit list the derivation must reproduce, -1 where it must skip.
  std::vector<std::int32_t> slots(std::size_t(rows_bucket), -1);
  int bad_rows = 0;
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < query_lens[std::size_t(b)]; ++i) {
      const int pos = seq_lens[std::size_t(b)] - query_lens[std::size_t(b)] + i;
      const int id = table[std::size_t(b * stride + pos / block)];
      const int row = c.query_start_loc[std::size_t(b)] + i;
      if (id >= layout.num_blocks) {
        ++bad_rows;
      } else {
        slots[std::size_t(row)] = id * block + pos % block;
      }
    }
  }
  REQUIRE(bad_rows == 75 - 64);

  const std::vector<std::uint8_t> initial = test::random_cache(rng, layout);
  const std::vector<std::uint16_t> rows = test::random_k_rows(rng, std::size_t(rows_bucket));
  core::Stream stream;
  GuardedArray<std::uint8_t> cache(layout.bytes());
  GuardedArray<std::uint16_t> rows_d(rows.size());
  GuardedArray<std::int32_t> table_d(table.size());
  GuardedArray<std::int32_t> unused_slots(static_cast<std::size_t>(rows_bucket));
  GuardedArray<std::int32_t> flag(1);
  GuardedArray<StepStatus> status(1);
  test::DeviceChunk chunk(r_bucket);
  chunk.write(c);
  cache.upload(initial);
  rows_d.upload(rows);
  table_d.upload(table);
  unused_slots.upload(std::vector<std::int32_t>(std::size_t(rows_bucket), std::numeric_limits<std::int32_t>::min()));
  flag.upload({1});

  const ChunkArrays arrays = chunk.arrays();
  KvInsertArgs args{reinterpret_cast<const __nv_bfloat16*>(rows_d.get()), unused_slots.get(), &arrays.scalars->num_tokens,
                    rows_bucket, cache.get(), layout, status.get()};
  args.derive = flag.get();
  args.block_table = table_d.get();
  args.block_table_stride = stride;
  args.query_start_loc = arrays.query_start_loc;
  args.seq_lens = arrays.seq_lens;
  args.num_requests = &arrays.scalars->num_requests;
  args.requests_bucket = r_bucket;
  KvInsert::can_implement(args);
  SPG_CUDA_TRY(reset(status.get(), stream.get()));
  SPG_CUDA_TRY(KvInsert::run(args, stream.get()));
  stream.synchronize();

  const reference::FaultLog log =
      expect_cache_after_insert(cache, initial, rows.data(), slots.data(), tokens, rows_bucket, layout);
  CHECK(log.counts == std::array<std::uint32_t, kFaultKinds>{});
  const std::vector<StepStatus> st = status.download();
  CHECK(st[0].count(Fault::block_id) == std::uint32_t(bad_rows));
  CHECK(st[0].total() == std::uint64_t(bad_rows));
  CHECK(st[0].first.kind == static_cast<std::int32_t>(Fault::block_id));
  CHECK(st[0].first.value == 40);

  // The flag cleared: the same launch reads the slot list (here all skipped), so nothing changes.
  const std::vector<std::uint8_t> before = cache.download();
  unused_slots.upload(std::vector<std::int32_t>(std::size_t(rows_bucket), -1));
  flag.upload({0});
  SPG_CUDA_TRY(reset(status.get(), stream.get()));
  SPG_CUDA_TRY(KvInsert::run(args, stream.get()));
  stream.synchronize();
  CHECK(cache.download() == before);
  CHECK(status.download()[0].total() == 0);

  // A request whose positions run past the table's width: counted once, none of its rows written.
  const std::vector<int> long_seq = {50, 37, 81};
  chunk.write(reference::make_host_chunk(query_lens, long_seq, 1, 128, r_bucket));
  flag.upload({1});
  SPG_CUDA_TRY(reset(status.get(), stream.get()));
  SPG_CUDA_TRY(KvInsert::run(args, stream.get()));
  stream.synchronize();
  const std::vector<StepStatus> st2 = status.download();
  CHECK(st2[0].count(Fault::seq_len) == 1);
  CHECK(st2[0].count(Fault::block_id) == 0);
}

TEST_CASE("insert rounds e4m3 midpoints to even as the reference does", "[gpu][kv_cache]") {
  // Tiles whose amax is 448 (scale 2^0) filled with every midpoint between neighbouring e4m3
  // values and the bf16 values on either side of it, then tiles whose amax sits on a scale boundary.
  std::vector<std::uint16_t> values;
  for (int bits = 0; bits < 0x7E; ++bits) {
    const double lo = reference::e4m3_value(static_cast<std::uint8_t>(bits));
    const double hi = reference::e4m3_value(static_cast<std::uint8_t>(bits + 1));
    const std::uint16_t mid = reference::bf16_round(static_cast<float>((lo + hi) / 2));
    for (const std::uint16_t v : {mid, static_cast<std::uint16_t>(mid - 1), static_cast<std::uint16_t>(mid + 1)}) {
      values.push_back(v);
      values.push_back(static_cast<std::uint16_t>(v | 0x8000));
    }
  }
  const int rows_needed = int((values.size() + kKvNopeDim - 1) / kKvNopeDim) + 2;
  std::vector<std::uint16_t> rows(std::size_t(rows_needed) * kKvDim, reference::bf16_round(0.5F));
  std::size_t v = 0;
  for (int r = 0; r < rows_needed - 2; ++r) {
    for (int t = 0; t < kKvTiles; ++t) {
      std::uint16_t* tile = rows.data() + std::size_t(r) * kKvDim + std::size_t(t) * kKvTile;
      tile[0] = reference::bf16_round(448.0F);
      for (int j = 1; j < kKvTile; ++j) tile[j] = v < values.size() ? values[v++] : reference::bf16_round(-3.0F);
    }
  }
  // Amax exactly 448 * 2^e and one bf16 step above it, for a range of e.
  for (int r = rows_needed - 2; r < rows_needed; ++r) {
    for (int t = 0; t < kKvTiles; ++t) {
      const int e = (r - rows_needed + 2) * 20 + 3 * t - 20;
      std::uint16_t* tile = rows.data() + std::size_t(r) * kKvDim + std::size_t(t) * kKvTile;
      const std::uint16_t edge = reference::bf16_round(std::ldexp(448.0F, e));
      tile[0] = t % 2 == 0 ? edge : static_cast<std::uint16_t>(edge + 1);
      for (int j = 1; j < kKvTile; ++j) tile[j] = reference::bf16_round(std::ldexp(1.3F + 0.01F * float(j), e));
    }
  }
  const CacheLayout layout = CacheLayout::make(64, 1);
  std::vector<std::int32_t> slots(static_cast<std::size_t>(rows_needed));
  for (int i = 0; i < rows_needed; ++i) slots[std::size_t(i)] = 63 - i;
  std::mt19937 rng(5);
  const std::vector<std::uint8_t> initial = test::random_cache(rng, layout);

  core::Stream stream;
  GuardedArray<std::uint8_t> cache(layout.bytes());
  GuardedArray<std::uint16_t> rows_d(rows.size());
  GuardedArray<std::int32_t> slots_d(slots.size());
  GuardedArray<std::int32_t> num_rows(1);
  GuardedArray<StepStatus> status(1);
  cache.upload(initial);
  rows_d.upload(rows);
  slots_d.upload(slots);
  num_rows.upload({rows_needed});
  const KvInsertArgs args{reinterpret_cast<const __nv_bfloat16*>(rows_d.get()), slots_d.get(), num_rows.get(),
                          rows_needed, cache.get(), layout, status.get()};
  KvInsert::can_implement(args);
  SPG_CUDA_TRY(reset(status.get(), stream.get()));
  SPG_CUDA_TRY(KvInsert::run(args, stream.get()));
  stream.synchronize();
  const reference::FaultLog log =
      expect_cache_after_insert(cache, initial, rows.data(), slots.data(), rows_needed, rows_needed, layout);
  test::check_status(status.get(), log);
}

TEST_CASE("gather of the compressed cache (stage 1) matches the reference", "[gpu][kv_cache]") {
  const int W = 128;
  SECTION("r = 4: prefix 0, long prefix, seq_len < W, query_len 0, padded requests") {
    GatherSetup s{4, GatherPart::compressed, 6, 64, 64, {}, 0};
    s.chunks.push_back(test::make_chunk({37, 3001 + 61, 50, 1000}, {37, 61, 11, 0}, 6, 4, W));
    s.chunks.push_back(test::make_chunk({5, 2999, 131, 777, 4093}, {5, 3, 131, 0, 17}, 6, 4, W));
    size_tables(s, 4093);
    run_gather_case(s);
  }
  SECTION("r = 128: two rows a block") {
    GatherSetup s{128, GatherPart::compressed, 3, 2, 64, {}, 0};
    s.chunks.push_back(test::make_chunk({127, 5000, 1031}, {127, 113, 2}, 3, 128, W));
    s.chunks.push_back(test::make_chunk({4999, 300}, {1, 300}, 3, 128, W));
    size_tables(s, 5000);
    run_gather_case(s);
  }
}

TEST_CASE("gather of the SWA window (stage 2) matches the reference", "[gpu][kv_cache]") {
  const int W = 128;
  SECTION("r = 1: window rows from row 0 (N = 0)") {
    GatherSetup s{1, GatherPart::window, 5, 1, 64, {}, 0};
    s.chunks.push_back(test::make_chunk({37, 3062, 50, 1000}, {37, 61, 11, 0}, 5, 1, W));
    s.chunks.push_back(test::make_chunk({129, 2}, {1, 2}, 5, 1, W));
    size_tables(s, 3062);
    run_gather_case(s);
  }
  SECTION("r = 4: window rows after N compressed rows, odd block size") {
    GatherSetup s{4, GatherPart::window, 4, 64, 61, {}, 0};
    s.chunks.push_back(test::make_chunk({2203, 97, 640}, {200, 97, 0}, 4, 4, W, 5));
    s.chunks.push_back(test::make_chunk({1, 3000, 445, 128}, {1, 1, 300, 127}, 4, 4, W));
    size_tables(s, 3000);
    run_gather_case(s);
  }
}

TEST_CASE("gather of both parts in one launch matches the reference", "[gpu][kv_cache]") {
  const int W = 128;
  GatherSetup s{4, GatherPart::both, 5, 64, 64, {}, 0};
  s.chunks.push_back(test::make_chunk({37, 3062, 50, 1000, 4001}, {37, 61, 11, 0, 301}, 5, 4, W));
  s.chunks.push_back(test::make_chunk({4097, 9}, {1, 9}, 5, 4, W));
  size_tables(s, 4097);
  run_gather_case(s);
}

TEST_CASE("gather zero-fills rows of bad block ids, skips unfit requests, counts both", "[gpu][kv_cache]") {
  const int W = 128;
  GatherSetup s{4, GatherPart::both, 4, 64, 64, {}, 0};
  // Request 2's seq_len needs more SWA blocks than its table row has (in the second set, request 0's).
  s.chunks.push_back(test::make_chunk({1500, 900, 1700, 64}, {40, 900, 3, 64}, 4, 4, W));
  s.chunks.push_back(test::make_chunk({1700, 300}, {5, 7}, 4, 4, W));
  size_tables(s, 1600);
  // Bad block ids: past the cache, negative, in both caches.
  s.compressed_table_edits = {{0, 1 << 20}, {std::size_t(s.compressed_stride) + 1, -1}};
  s.window_table_edits = {{std::size_t(s.window_stride) * 1 + 3, -7},
                          {std::size_t(s.window_stride) * 0 + 23, std::numeric_limits<std::int32_t>::max()}};
  run_gather_case(s);
}

TEST_CASE("gather with bad chunk scalars writes nothing and counts one fault", "[gpu][kv_cache]") {
  const int W = 128;
  GatherSetup s{4, GatherPart::both, 3, 64, 64, {}, 0};
  const reference::HostChunk good = test::make_chunk({300, 200}, {30, 20}, 3, 4, W);
  s.chunks = {good, good, good, good};
  size_tables(s, 300);
  s.chunks[0].scalars.num_requests = 4;                              // past requests_bucket
  s.chunks[1].scalars.m_rows = static_cast<int>(s.max_rows) + 1;     // M past M_max
  s.chunks[2].scalars.n_rows = s.chunks[2].scalars.m_rows + 1;       // N > M
  s.chunks[3].seq_lens[1] = 1 << 30;                                 // one request unfit: seq_len fault
  run_gather_case(s);
}

TEST_CASE("dequant(insert(x)) equals the reference's bytes dequantized, and is close to x", "[gpu][kv_cache]") {
  constexpr int n = 203;
  constexpr int block_size = 64;
  std::mt19937 rng(99);
  const std::vector<std::uint16_t> x = test::random_k_rows(rng, n);
  const int stride = (n + block_size - 1) / block_size;
  const CacheLayout layout = CacheLayout::make(block_size, stride + 2);
  const std::vector<std::int32_t> table = test::random_block_table(rng, 1, stride, layout.num_blocks);
  std::vector<std::int32_t> slots(n);
  for (int p = 0; p < n; ++p) slots[std::size_t(p)] = table[std::size_t(p / block_size)] * block_size + p % block_size;

  core::Stream stream;
  GuardedArray<std::uint8_t> cache(layout.bytes());
  GuardedArray<std::uint16_t> rows(x.size());
  GuardedArray<std::int32_t> slots_d(slots.size());
  GuardedArray<std::int32_t> num_rows(1);
  GuardedArray<std::int32_t> table_d(table.size());
  GuardedArray<StepStatus> status(1);
  cache.upload(test::random_cache(rng, layout));
  rows.upload(x);
  slots_d.upload(slots);
  num_rows.upload({n});
  table_d.upload(table);
  const reference::HostChunk c = test::make_chunk({n}, {n}, 1, 1, 128);
  REQUIRE(c.gather_lens[0] == n);
  test::DeviceChunk chunk(1);
  chunk.write(c);
  GuardedArray<std::uint16_t> kv(std::size_t(c.scalars.m_rows) * kKvDim);

  const KvInsertArgs insert{reinterpret_cast<const __nv_bfloat16*>(rows.get()), slots_d.get(), num_rows.get(), n,
                            cache.get(), layout, status.get()};
  KvGatherArgs gather;
  gather.cache = cache.get();
  gather.layout = layout;
  gather.block_table = table_d.get();
  gather.block_table_stride = stride;
  gather.chunk = chunk.arrays();
  gather.part = GatherPart::window;
  gather.compress_ratio = 1;
  gather.requests_bucket = 1;
  gather.max_rows_per_request = c.scalars.m_rows;
  gather.kv = reinterpret_cast<__nv_bfloat16*>(kv.get());
  gather.status = status.get();
  KvInsert::can_implement(insert);
  KvGather::can_implement(gather);
  SPG_CUDA_TRY(reset(status.get(), stream.get()));
  SPG_CUDA_TRY(KvInsert::run(insert, stream.get()));
  SPG_CUDA_TRY(KvGather::run(gather, stream.get()));
  stream.synchronize();

  std::vector<std::uint16_t> want(std::size_t(n) * kKvDim);
  std::vector<std::uint8_t> data(kKvRowBytes);
  std::vector<std::uint8_t> scales(kKvScaleBytes);
  double worst = 0.0;
  std::size_t worst_at = 0;
  for (int p = 0; p < n; ++p) {
    const std::uint16_t* row = x.data() + std::size_t(p) * kKvDim;
    reference::quantize_row(row, data.data(), scales.data());
    reference::dequantize_row(data.data(), scales.data(), want.data() + std::size_t(p) * kKvDim);
    for (int j = 0; j < kKvDim; ++j) {
      // e4m3 keeps 4 significant bits: relative error <= 2^-4, or 2^-10 of the tile scale near 0.
      const double ref = reference::bf16_value(row[j]);
      const double got = reference::bf16_value(want[std::size_t(p) * kKvDim + std::size_t(j)]);
      const double tile_scale = j < kKvNopeDim ? std::ldexp(1.0, scales[std::size_t(j / kKvTile)] - 127) : 0.0;
      const double excess = std::fabs(got - ref) - std::max(std::fabs(ref) / 16.0, tile_scale / 1024.0) * 1.01;
      if (excess > worst) {
        worst = excess;
        worst_at = std::size_t(p) * kKvDim + std::size_t(j);
      }
    }
  }
  INFO("worst excess over the e4m3 error bound at row " << worst_at / kKvDim << ", column " << worst_at % kKvDim);
  CHECK(worst == 0.0);
  std::vector<std::uint16_t> got = kv.download();
  got.resize(want.size());
  const std::string diff = test::first_mismatch(got, want, kKvDim, "dequant(insert(x))");
  INFO(diff);
  CHECK(diff.empty());
  kernels::StepStatus st{};
  SPG_CUDA_TRY(cudaMemcpy(&st, status.get(), sizeof st, cudaMemcpyDeviceToHost));
  CHECK(st.total() == 0);
}

TEST_CASE("kv cache ops refuse bad arguments before anything runs", "[gpu][kv_cache]") {
  GuardedArray<std::uint8_t> cache(CacheLayout::make(64, 2).bytes());
  GuardedArray<std::int32_t> ints(64);
  GuardedArray<StepStatus> status(1);
  KvGatherArgs g;
  g.cache = cache.get();
  g.layout = CacheLayout::make(64, 2);
  g.block_table = ints.get();
  g.block_table_stride = 2;
  g.chunk = ChunkArrays{reinterpret_cast<const ChunkScalars*>(ints.get()), ints.get(), ints.get(), ints.get()};
  g.part = GatherPart::compressed;
  g.compress_ratio = 4;
  g.requests_bucket = 4;
  g.max_rows_per_request = 100;
  g.kv = reinterpret_cast<__nv_bfloat16*>(cache.get());
  g.status = status.get();
  KvGather::can_implement(g);
  KvGatherArgs bad = g;
  bad.compress_ratio = 3;
  CHECK_THROWS_AS(KvGather::can_implement(bad), spg::InvalidArgument);
  bad = g;
  bad.compress_ratio = 1;
  CHECK_THROWS_AS(KvGather::can_implement(bad), spg::InvalidArgument);
  bad = g;
  bad.kv = reinterpret_cast<__nv_bfloat16*>(cache.get() + 2);
  CHECK_THROWS_AS(KvGather::can_implement(bad), spg::InvalidArgument);
  bad = g;
  bad.requests_bucket = kMaxRequestsBucket + 1;
  CHECK_THROWS_AS(KvGather::can_implement(bad), spg::InvalidArgument);
  bad = g;
  bad.layout.block_stride += 16;  // a stride must be a multiple of 576
  CHECK_THROWS_AS(KvGather::can_implement(bad), spg::InvalidArgument);
  bad = g;
  bad.layout.block_stride -= 576;  // and hold the block's rows
  CHECK_THROWS_AS(KvGather::can_implement(bad), spg::InvalidArgument);
  KvGatherArgs padded = g;  // an engine's blocks may be padded further
  padded.layout.block_stride += 576;
  padded.layout.num_blocks = 1;
  KvGather::can_implement(padded);
  bad = g;
  bad.part = GatherPart::both;  // no window cache given
  CHECK_THROWS_AS(KvGather::can_implement(bad), spg::InvalidArgument);

  KvInsertArgs i{reinterpret_cast<const __nv_bfloat16*>(cache.get()), ints.get(), ints.get(), 8, cache.get(),
                 CacheLayout::make(64, 2), status.get()};
  KvInsert::can_implement(i);
  KvInsertArgs bad_insert = i;
  bad_insert.rows_bucket = -1;
  CHECK_THROWS_AS(KvInsert::can_implement(bad_insert), spg::InvalidArgument);
  bad_insert = i;
  bad_insert.cache = cache.get() + 8;
  CHECK_THROWS_AS(KvInsert::can_implement(bad_insert), spg::InvalidArgument);
  CHECK_THROWS_AS(CacheLayout::make(0, 4), spg::InvalidArgument);
}

TEST_CASE("the launchers' cached device facts match the driver's", "[gpu][kv_cache]") {
  int device = 0;
  SPG_CUDA_TRY(cudaGetDevice(&device));
  int sms = 0;
  int major = 0;
  int minor = 0;
  SPG_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  SPG_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  SPG_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  for (int call = 0; call < 2; ++call) {  // the first call queries, the second reads the cache
    core::DeviceInfo info;
    REQUIRE(core::current_device_info(info) == cudaSuccess);
    CHECK(info.device == device);
    CHECK(info.sms == sms);
    CHECK(info.major == major);
    CHECK(info.minor == minor);
  }
}
