// CombineIndices on the device against the CPU reference, exactly: every case runs eagerly and as a
// captured graph replayed on two metadata sets of the same bucket.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/catch.hpp"
#include "gpu/kernels_test_util.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/reference/combine_indices_reference.hpp"
#include "spgraph/kernels/step_status.hpp"

using namespace spg;
using namespace spg::kernels;
using spg::test::GuardedArray;
using spg::test::LaunchMode;

namespace {

constexpr std::uint8_t kPoison = 0x7B;  // int32 0x7B7B7B7B: no index or length here is that large

struct CombineCase {
  int r;
  int top_k;
  int window;
  int tokens_bucket;
  int requests_bucket;
  std::vector<reference::HostChunk> chunks;
  int bad_entries{0};  // top-k entries outside the request's rows to plant per set
};

/// Top-k rows for one chunk: valid indices into each token's request rows, some -1, and garbage
/// past topk_len (never read); `bad` entries below topk_len outside 0 .. seq_len/r - 1.
std::vector<std::int32_t> random_topk(std::mt19937& rng, const CombineCase& c, const reference::HostChunk& chunk, int bad) {
  std::vector<std::int32_t> out(std::size_t(c.tokens_bucket) * std::size_t(std::max(c.top_k, 1)),
                                std::numeric_limits<std::int32_t>::max() - 3);
  if (c.r == 1) return out;
  std::uniform_int_distribution<int> pct(0, 99);
  std::vector<std::pair<int, int>> planted;  // (token, entry) where a fault can go
  for (int b = 0; b < chunk.scalars.num_requests; ++b) {
    const int seq = chunk.seq_lens[std::size_t(b)];
    const int qs = chunk.query_start_loc[std::size_t(b)];
    const int qlen = chunk.query_start_loc[std::size_t(b) + 1] - qs;
    const int rows = seq / c.r;
    for (int t = qs; t < qs + qlen; ++t) {
      const int pos = seq - qlen + (t - qs);
      const int len = std::min((pos + 1) / c.r, c.top_k);
      std::uniform_int_distribution<int> row(0, std::max(rows - 1, 0));
      for (int j = 0; j < len; ++j) {
        out[std::size_t(t) * std::size_t(c.top_k) + std::size_t(j)] = pct(rng) < 10 ? -1 : row(rng);
        if (j % 7 == 3) planted.emplace_back(t, j);
      }
      (void)rows;
    }
  }
  const std::int32_t bad_values[] = {-2, std::numeric_limits<std::int32_t>::min(), 1 << 30, -100};
  std::shuffle(planted.begin(), planted.end(), rng);
  for (int k = 0; k < bad && k < int(planted.size()); ++k) {
    const auto [t, j] = planted[std::size_t(k)];
    int b = 0;
    while (chunk.query_start_loc[std::size_t(b) + 1] <= t) ++b;
    // Alternate between just past the request's rows and far outside them.
    const std::int32_t v = k % 2 == 0 ? chunk.seq_lens[std::size_t(b)] / c.r + k / 2 : bad_values[(k / 2) % 4];
    out[std::size_t(t) * std::size_t(c.top_k) + std::size_t(j)] = v;
  }
  return out;
}

void run_combine_case(const CombineCase& c) {
  std::mt19937 rng(4242U + unsigned(c.r * 7 + c.top_k + c.tokens_bucket));
  const int width = (c.top_k + c.window + 127) / 128 * 128;
  std::vector<std::vector<std::int32_t>> topks;
  for (const auto& chunk : c.chunks) topks.push_back(random_topk(rng, c, chunk, c.bad_entries));

  core::Stream stream;
  GuardedArray<std::int32_t> topk(topks[0].size());
  GuardedArray<std::int32_t> combined(std::size_t(c.tokens_bucket) * std::size_t(width));
  GuardedArray<std::int32_t> lens(std::size_t(c.tokens_bucket));
  GuardedArray<StepStatus> status(1);
  test::DeviceChunk chunk(c.requests_bucket);

  CombineIndicesArgs args;
  args.topk_indices = c.r > 1 ? topk.get() : nullptr;
  args.top_k = c.top_k;
  args.compress_ratio = c.r;
  args.window = c.window;
  args.chunk = chunk.arrays();
  args.tokens_bucket = c.tokens_bucket;
  args.requests_bucket = c.requests_bucket;
  args.combined = combined.get();
  args.combined_width = width;
  args.lens = lens.get();
  args.status = status.get();
  CombineIndices::can_implement(args);

  auto check = [&](std::size_t set) {
    const auto& h = c.chunks[set];
    std::vector<std::int32_t> want(combined.size(), 0);
    std::vector<std::int32_t> want_lens(lens.size(), -5);
    reference::FaultLog log;
    reference::combine_indices(topks[set].data(), c.top_k, c.r, c.window, h, c.tokens_bucket, c.requests_bucket,
                               want.data(), width, want_lens.data(), log);
    const std::vector<std::int32_t> got_lens = lens.download();
    const std::string lens_diff = test::first_mismatch(got_lens, want_lens, 1, "lens");
    INFO(lens_diff);
    REQUIRE(lens_diff.empty());
    // Only entries below lens[t] are defined; compare those.
    std::vector<std::int32_t> got = combined.download();
    for (int t = 0; t < c.tokens_bucket; ++t) {
      for (int j = want_lens[std::size_t(t)]; j < width; ++j) {
        got[std::size_t(t) * std::size_t(width) + std::size_t(j)] = 0;
      }
    }
    const std::string diff = test::first_mismatch(got, want, std::size_t(width), "combined");
    INFO(diff);
    CHECK(diff.empty());
    CHECK(combined.damaged_guard_bytes() == 0);
    CHECK(lens.damaged_guard_bytes() == 0);
    CHECK(topk.damaged_guard_bytes() == 0);
    test::check_status(status.get(), log);
  };

  for (LaunchMode mode : {LaunchMode::eager, LaunchMode::graph}) {
    INFO(test::mode_name(mode) << ", r = " << c.r << ", top_k " << c.top_k << ", T_bucket " << c.tokens_bucket);
    combined.fill_bytes(kPoison);
    lens.fill_bytes(kPoison);
    chunk.write(c.chunks[0]);
    topk.upload(topks[0]);
    if (mode == LaunchMode::eager) {
      SPG_CUDA_TRY(reset(status.get(), stream.get()));
      SPG_CUDA_TRY(CombineIndices::run(args, stream.get()));
      stream.synchronize();
      check(0);
      continue;
    }
    const test::CapturedLaunch graph(stream.get(), [&] {
      const cudaError_t e = reset(status.get(), stream.get());
      return e != cudaSuccess ? e : CombineIndices::run(args, stream.get());
    });
    graph.replay(stream.get());
    check(0);
    for (std::size_t k = 1; k < c.chunks.size(); ++k) {
      INFO("metadata set " << k);
      combined.fill_bytes(kPoison);
      lens.fill_bytes(kPoison);
      chunk.write(c.chunks[k]);
      topk.upload(topks[k]);
      graph.replay(stream.get());
      check(k);
    }
  }
}

}  // namespace

TEST_CASE("combine for C4A: prefix 0, long prefix, seq_len < W, query_len 0, padding", "[gpu][combine]") {
  const int W = 128;
  CombineCase c{4, 512, W, 128, 6, {}};
  // Tokens: 37 + 61 + 11 + 0 = 109 real of 128; 4 real requests of 6.
  c.chunks.push_back(test::make_chunk({37, 3001 + 61, 50, 1000}, {37, 61, 11, 0}, 6, 4, W));
  c.chunks.push_back(test::make_chunk({4099, 5, 640, 129, 2}, {3, 5, 100, 17, 2}, 6, 4, W, 7));
  run_combine_case(c);
}

TEST_CASE("combine where top_k exceeds the compressed rows, r = 128, top_k not a multiple of 4", "[gpu][combine]") {
  const int W = 128;
  CombineCase c{128, 37, W, 61, 3, {}};
  c.chunks.push_back(test::make_chunk({5000, 300, 129}, {23, 30, 7}, 3, 128, W));
  c.chunks.push_back(test::make_chunk({127, 128, 9999}, {1, 1, 59}, 3, 128, W));
  run_combine_case(c);
}

TEST_CASE("combine where top_k exceeds the compressed rows, r = 4, a small window", "[gpu][combine]") {
  CombineCase c{4, 1024, 7, 47, 2, {}};
  c.chunks.push_back(test::make_chunk({300, 21}, {26, 21}, 2, 4, 7));
  c.chunks.push_back(test::make_chunk({4500}, {47}, 2, 4, 7));
  run_combine_case(c);
}

TEST_CASE("combine for SWA-only layers (r = 1, no top-k)", "[gpu][combine]") {
  const int W = 128;
  CombineCase c{1, 0, W, 97, 4, {}};
  c.chunks.push_back(test::make_chunk({37, 3062, 50, 1000}, {37, 41, 11, 0}, 4, 1, W));
  c.chunks.push_back(test::make_chunk({96}, {96}, 4, 1, W));
  run_combine_case(c);
}

TEST_CASE("combine writes -1 for bad top-k indices and counts them; -1 stays -1 (never -1 + M * b)",
          "[gpu][combine]") {
  const int W = 128;
  CombineCase c{4, 512, W, 80, 3, {}, 9};
  c.chunks.push_back(test::make_chunk({2000, 700, 1300}, {20, 30, 30}, 3, 4, W));
  c.chunks.push_back(test::make_chunk({900, 3100}, {40, 39}, 3, 4, W));
  run_combine_case(c);
}

TEST_CASE("combine gives lens = 0 to tokens of unfit requests and of bad chunks, and counts them", "[gpu][combine]") {
  const int W = 128;
  CombineCase c{4, 512, W, 64, 3, {}};
  const reference::HostChunk good = test::make_chunk({800, 64, 300}, {20, 20, 20}, 3, 4, W);
  reference::HostChunk unfit = good;
  unfit.gather_lens[1] = 10;     // fewer window rows than its tokens index
  unfit.seq_lens[2] = 10;        // query_len 20 > seq_len 10
  reference::HostChunk bad_tokens = good;
  bad_tokens.scalars.num_tokens = 65;  // past tokens_bucket
  reference::HostChunk bad_qsl = good;
  bad_qsl.query_start_loc[1] = 30;     // no longer ascending
  bad_qsl.query_start_loc[2] = 25;
  reference::HostChunk bad_m = good;
  bad_m.scalars.n_rows = bad_m.scalars.m_rows + 1;
  c.chunks = {unfit, bad_tokens, bad_qsl, bad_m, good};
  run_combine_case(c);
}

TEST_CASE("combine refuses bad arguments before anything runs", "[gpu][combine]") {
  GuardedArray<std::int32_t> ints(1024);
  GuardedArray<StepStatus> status(1);
  CombineIndicesArgs a;
  a.topk_indices = ints.get();
  a.top_k = 512;
  a.compress_ratio = 4;
  a.window = 128;
  a.chunk = ChunkArrays{reinterpret_cast<const ChunkScalars*>(ints.get()), ints.get(), ints.get(), ints.get()};
  a.tokens_bucket = 16;
  a.requests_bucket = 4;
  a.combined = ints.get();
  a.combined_width = 640;
  a.lens = ints.get();
  a.status = status.get();
  CombineIndices::can_implement(a);
  CombineIndicesArgs bad = a;
  bad.combined_width = 636;
  CHECK_THROWS_AS(CombineIndices::can_implement(bad), spg::InvalidArgument);
  bad = a;
  bad.compress_ratio = 2;
  CHECK_THROWS_AS(CombineIndices::can_implement(bad), spg::InvalidArgument);
  bad = a;
  bad.compress_ratio = 1;  // top_k must be 0 then
  CHECK_THROWS_AS(CombineIndices::can_implement(bad), spg::InvalidArgument);
  bad = a;
  bad.window = 0;
  CHECK_THROWS_AS(CombineIndices::can_implement(bad), spg::InvalidArgument);
  bad = a;
  bad.topk_indices = nullptr;
  CHECK_THROWS_AS(CombineIndices::can_implement(bad), spg::InvalidArgument);
  bad = a;
  bad.combined = ints.get() + 1;
  CHECK_THROWS_AS(CombineIndices::can_implement(bad), spg::InvalidArgument);
}
