// The launch plan of sparse MLA attention on the host (SparseMla::plan_for_sms, no device): the
// split cost model's predictions against the table-A rows it was fitted on, and the choices
// `automatic` makes with it (docs/benchmark_history.md, "Split top-k").
#include <cmath>
#include <cstdint>

#include "common/catch.hpp"
#include "common/sparse_mla_shape_args.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"
#include "spgraph/kernels/sparse_mla/split_cost.hpp"

namespace {

namespace k = spg::kernels;
using spg::test::mla::shape_only_args;

constexpr int kH200Sms = 132;

k::SparseMlaPlan automatic_plan(int s_q, int h_q, int topk, int d_qk = 512, int sms = kH200Sms) {
  k::SparseMlaArgs a = shape_only_args(8192, topk, s_q, h_q, d_qk);
  a.path = k::SparseMlaPath::automatic;
  return k::SparseMla::plan_for_sms(a, sms);
}

std::int64_t items_of(int s_q, int h_q) { return std::int64_t{s_q} * (h_q / 64); }
int pairs_of(int topk) { return (topk / 64 + 1) / 2; }

}  // namespace

TEST_CASE("sparse_mla plan: the split cost model reproduces the measured small rows", "[sparse_mla]") {
  // Sustained one-shot figures on the H200 (docs/benchmarks.md, table A, 3a348e4): the single pass
  // and the split slicings measured beside it. The model must land within 1.5 µs of each, or the
  // choice it makes on them is not grounded.
  struct Measured {
    int s_q, h_q, topk, pairs_per_slice;
    double us;
  };
  const Measured rows[] = {
      {16, 128, 1152, 9, 39.4}, {16, 128, 1152, 3, 27.8},  // single, 3 slices of 3 pairs
      {64, 128, 1152, 9, 41.4}, {64, 128, 1152, 5, 68.4},  // single, 2 slices (a second wave)
      {16, 64, 640, 5, 26.3},   {16, 64, 640, 1, 21.7},    // single, 5 slices of 1 pair
      {64, 64, 640, 5, 27.7},   {64, 64, 640, 3, 31.0},    // single, 2 slices
      {256, 64, 640, 5, 52.9},                             // single, 1.94 waves
  };
  for (const Measured& m : rows) {
    const double predicted =
        k::detail::split_time_us(items_of(m.s_q, m.h_q), pairs_of(m.topk), m.pairs_per_slice, kH200Sms, 512);
    INFO("h_q " << m.h_q << " topk " << m.topk << " s_q " << m.s_q << ", " << m.pairs_per_slice
                << " pairs per slice: predicted " << predicted << " us, measured " << m.us);
    CHECK(std::fabs(predicted - m.us) <= 1.5);
  }
  // The split-dv pass (two CTAs per item): what the model prices is its block against the single
  // pass's (split_dv_block), so that is what is checked, against the two measured in the same run
  // on five one-wave rows (2026-12-03, docs/benchmarks.md, "Round 15"): (dv - call) / (single -
  // call) within 0.05 of the model's.
  struct MeasuredDv {
    int s_q, h_q, topk;
    double single_us, dv_us;
  };
  const MeasuredDv dv_rows[] = {{16, 64, 640, 24.5, 22.4}, {16, 128, 1152, 36.2, 33.7}, {48, 64, 640, 26.6, 24.6},
                                {64, 64, 640, 25.3, 23.7}, {32, 128, 1152, 38.9, 36.6}};
  const k::detail::SplitCostModel model{};
  for (const MeasuredDv& m : dv_rows) {
    const std::int64_t items = items_of(m.s_q, m.h_q);
    const int pairs = pairs_of(m.topk);
    const double predicted = (k::detail::split_dv_time_us(items, pairs, kH200Sms, 512) - model.call_us) /
                             (k::detail::split_time_us(items, pairs, pairs, kH200Sms, 512) - model.call_us);
    const double measured = (m.dv_us - model.call_us) / (m.single_us - model.call_us);
    INFO("split dv: h_q " << m.h_q << " topk " << m.topk << " s_q " << m.s_q << ": block ratio predicted " << predicted
                          << ", measured " << measured);
    CHECK(std::fabs(predicted - measured) <= 0.05);
  }
  // The long rows are one slice at any SM count: more slices only add waves and partials.
  CHECK(k::detail::automatic_pairs_per_slice(items_of(4096, 128), pairs_of(1024), kH200Sms, 512) == pairs_of(1024));
}

TEST_CASE("sparse_mla plan: automatic runs the fastest measured path of each small shape", "[sparse_mla]") {
  // Every path the sweep of 2026-12-03 timed on the H200 (docs/benchmarks.md, "Round 16"; records
  // in docs/results/runs/h200-2026-12-03-bb351fc-small-sweep.json): s_kv 8192, topk 640 (h_q 64)
  // or 1152 (h_q 128), sustained one-shot µs, the median of three copies of the row. S = the single
  // pass, V = the split-dv pass, T = top-k slices of `blocks` blocks each. The plan `automatic`
  // makes must be one of the measured ones and within 1 µs (the model's margin) of the fastest.
  enum Kind { S, T, V };
  struct Measured {
    int s_q, h_q;
    Kind kind;
    int blocks;  ///< blocks per slice (T only)
    double us;
  };
  const Measured sweep[] = {
      {8, 64, V, 0, 23.4}, {8, 64, S, 0, 24.9}, {8, 64, T, 1, 21.2}, {8, 64, T, 2, 18.4}, {8, 64, T, 3, 20.2},
      {8, 64, T, 4, 20.0}, {8, 64, T, 5, 22.4}, {16, 64, V, 0, 23.5}, {16, 64, S, 0, 24.5}, {16, 64, T, 2, 19.2},
      {16, 64, T, 3, 20.3}, {16, 64, T, 4, 20.1}, {16, 64, T, 5, 22.7}, {24, 64, V, 0, 23.2}, {24, 64, S, 0, 25.2},
      {24, 64, T, 2, 21.6}, {24, 64, T, 3, 22.7}, {24, 64, T, 4, 20.8}, {24, 64, T, 5, 23.7}, {32, 64, V, 0, 23.5},
      {32, 64, S, 0, 25.4}, {32, 64, T, 2, 30.5}, {32, 64, T, 3, 24.1}, {32, 64, T, 4, 22.4}, {32, 64, T, 5, 24.6},
      {48, 64, V, 0, 24.8}, {48, 64, S, 0, 26.7}, {48, 64, T, 2, 36.9}, {48, 64, T, 3, 38.2}, {48, 64, T, 4, 32.6},
      {48, 64, T, 5, 26.5}, {64, 64, V, 0, 23.8}, {64, 64, S, 0, 25.6}, {64, 64, T, 2, 49.4}, {64, 64, T, 3, 41.5},
      {64, 64, T, 4, 36.6}, {64, 64, T, 5, 28.9}, {96, 64, V, 0, 40.1}, {96, 64, S, 0, 26.6}, {96, 64, T, 5, 46.3},
      {128, 64, V, 0, 41.8}, {128, 64, S, 0, 27.7}, {128, 64, T, 5, 53.0}, {192, 64, V, 0, 59.4}, {192, 64, S, 0, 46.0},
      {192, 64, T, 5, 79.0}, {256, 64, V, 0, 78.7}, {256, 64, S, 0, 50.5}, {256, 64, T, 5, 103.1}, {8, 128, V, 0, 34.0},
      {8, 128, S, 0, 36.2}, {8, 128, T, 3, 23.4}, {8, 128, T, 4, 21.8}, {8, 128, T, 5, 23.6}, {8, 128, T, 6, 23.3},
      {8, 128, T, 9, 28.4}, {16, 128, V, 0, 35.0}, {16, 128, S, 0, 37.9}, {16, 128, T, 4, 34.6}, {16, 128, T, 5, 26.7},
      {16, 128, T, 6, 26.5}, {16, 128, T, 9, 29.5}, {24, 128, V, 0, 35.0}, {24, 128, S, 0, 37.8}, {24, 128, T, 4, 41.2},
      {24, 128, T, 5, 43.8}, {24, 128, T, 6, 42.2}, {24, 128, T, 9, 32.1}, {24, 128, T, 10, 30.9}, {32, 128, V, 0, 35.8},
      {32, 128, S, 0, 38.8}, {32, 128, T, 4, 56.3}, {32, 128, T, 5, 48.5}, {32, 128, T, 6, 44.5}, {32, 128, T, 9, 35.0},
      {32, 128, T, 10, 33.3}, {48, 128, V, 0, 63.2}, {48, 128, S, 0, 39.1}, {48, 128, T, 4, 78.2}, {48, 128, T, 5, 70.8},
      {48, 128, T, 6, 67.6}, {48, 128, T, 9, 59.2}, {64, 128, V, 0, 64.1}, {64, 128, S, 0, 39.7}, {64, 128, T, 4, 98.7},
      {64, 128, T, 5, 93.1}, {64, 128, T, 6, 75.9}, {64, 128, T, 9, 65.2}, {96, 128, V, 0, 94.4}, {96, 128, S, 0, 70.1},
      {96, 128, T, 9, 97.2}, {128, 128, V, 0, 126.0}, {128, 128, S, 0, 76.0}, {128, 128, T, 9, 127.1}, {192, 128, V, 0, 188.3},
      {192, 128, S, 0, 114.1}, {192, 128, T, 9, 184.5}, {256, 128, V, 0, 251.4}, {256, 128, S, 0, 149.0}, {256, 128, T, 9, 241.3},
  };
  for (const int h_q : {64, 128}) {
    for (const int s_q : {8, 16, 24, 32, 48, 64, 96, 128, 192, 256}) {
      const k::SparseMlaPlan plan = automatic_plan(s_q, h_q, h_q == 64 ? 640 : 1152);
      const Kind kind = plan.kernel == k::SparseMlaKernel::wgmma_split_dv    ? V
                        : plan.kernel == k::SparseMlaKernel::wgmma_split_topk ? T
                                                                              : S;
      const int blocks = kind == T ? plan.blocks_per_split : 0;
      double fastest = 1e30;
      double chosen = -1.0;
      for (const Measured& m : sweep) {
        if (m.s_q != s_q || m.h_q != h_q) continue;
        fastest = std::fmin(fastest, m.us);
        if (m.kind == kind && m.blocks == blocks) chosen = m.us;
      }
      const char* const names[] = {"the single pass", "top-k slices", "the split-dv pass"};
      INFO("h_q " << h_q << " s_q " << s_q << ": automatic runs " << names[kind] << " (" << blocks
                  << " blocks a slice), measured " << chosen << " us; the fastest measured " << fastest << " us");
      REQUIRE(chosen > 0.0);  // a plan the sweep did not time
      CHECK(chosen - fastest <= 1.0);
    }
  }
}

TEST_CASE("sparse_mla plan: automatic takes the cost model's slicing", "[sparse_mla]") {
  SECTION("table A's small rows on 132 SMs") {
    const k::SparseMlaPlan h128_16 = automatic_plan(16, 128, 1152);
    CHECK(h128_16.kernel == k::SparseMlaKernel::wgmma_split_topk);
    CHECK(h128_16.blocks_per_split == 6);  // 3 pairs
    CHECK(h128_16.num_splits == 3);
    const k::SparseMlaPlan h64_16 = automatic_plan(16, 64, 640);
    CHECK(h64_16.kernel == k::SparseMlaKernel::wgmma_split_topk);
    CHECK(h64_16.blocks_per_split == 2);
    CHECK(h64_16.num_splits == 5);
    // 64 tokens of 64 heads leave half of the SMs idle: the value columns split over two CTAs.
    const k::SparseMlaPlan h64_64 = automatic_plan(64, 64, 640);
    CHECK(h64_64.kernel == k::SparseMlaKernel::wgmma_split_dv);
    CHECK(h64_64.dv_parts == 2);
    CHECK_FALSE(h64_64.split);
    CHECK(h64_64.num_splits == 1);
    // The two shapes measured beside them (docs/benchmarks.md, "Round 15"): 48 tokens of 64 heads
    // split the columns (24.6 µs against 26.6 single), 32 tokens of 128 heads take two top-k
    // slices (36.1 against 36.6 split dv and 38.9 single).
    CHECK(automatic_plan(48, 64, 640).kernel == k::SparseMlaKernel::wgmma_split_dv);
    const k::SparseMlaPlan h128_32 = automatic_plan(32, 128, 1152);
    CHECK(h128_32.kernel == k::SparseMlaKernel::wgmma_split_topk);
    CHECK(h128_32.num_splits == 2);
    // What the GPU correctness grid expects of its s_q 62 cases (test_sparse_mla.cpp).
    for (const int d_qk : {512, 576})
      for (const int topk : {128, 256, 384, 512}) {
        INFO("d_qk " << d_qk << " topk " << topk);
        CHECK((automatic_plan(62, 64, topk, d_qk).kernel == k::SparseMlaKernel::wgmma_split_dv) == (topk >= 384));
        CHECK(automatic_plan(62, 128, topk, d_qk).kernel == k::SparseMlaKernel::wgmma_single_pass);
      }
    for (const k::SparseMlaPlan& plan : {automatic_plan(64, 128, 1152), automatic_plan(256, 128, 1152), automatic_plan(256, 64, 640)}) {
      CHECK(plan.kernel == k::SparseMlaKernel::wgmma_single_pass);
      CHECK_FALSE(plan.split);
      CHECK(plan.num_splits == 1);
      CHECK(plan.dv_parts == 1);
    }
  }
  SECTION("the value columns are split only where the model prices it under both the single pass and the slices") {
    for (const int s_q : {1, 3, 8, 16, 24, 32, 48, 64, 66, 67, 100, 130}) {
      for (const int h_q : {64, 128}) {
        for (const int topk : {128, 256, 384, 640, 1152, 2048}) {
          for (const int d_qk : {512, 576}) {
            const k::SparseMlaPlan plan = automatic_plan(s_q, h_q, topk, d_qk);
            const std::int64_t items = items_of(s_q, h_q);
            const int pairs = pairs_of(topk);
            const double dv = k::detail::split_dv_time_us(items, pairs, kH200Sms, d_qk);
            const double single = k::detail::split_time_us(items, pairs, pairs, kH200Sms, d_qk);
            const int pps = k::detail::automatic_pairs_per_slice(items, pairs, kH200Sms, d_qk);
            const double sliced = k::detail::split_time_us(items, pairs, pps, kH200Sms, d_qk);
            INFO("s_q " << s_q << " h_q " << h_q << " topk " << topk << " d_qk " << d_qk << ": split dv " << dv
                        << " us, single " << single << ", slices " << sliced);
            const bool dv_taken = plan.kernel == k::SparseMlaKernel::wgmma_split_dv;
            CHECK(dv_taken == (dv < single - 1.0 && dv < sliced - 1.0));
            CHECK(plan.dv_parts == (dv_taken ? 2 : 1));
            if (dv_taken) CHECK_FALSE(plan.split);
            // Twice the CTAs of a wave or more never pays: the split halves only idle SMs' worth.
            if (2 * items > kH200Sms) CHECK_FALSE(dv_taken);
          }
        }
      }
    }
  }
  SECTION("a split is taken only where the model saves more than its margin") {
    // s_q 1 (items 1 or 2): topk 256 (2 pairs) stays whole, topk 384 (3 pairs) splits.
    for (const int h_q : {64, 128}) {
      INFO("h_q " << h_q);
      CHECK_FALSE(automatic_plan(1, h_q, 256).split);
      CHECK(automatic_plan(1, h_q, 384).split);
      CHECK(automatic_plan(1, h_q, 128).num_splits == 1);
    }
    // Each choice against the model: no slicing it considers prices lower than the one taken.
    for (const int s_q : {1, 3, 8, 16, 32, 48, 64, 100, 130}) {
      for (const int h_q : {64, 128}) {
        for (const int topk : {128, 384, 640, 1152, 2048, 8320}) {
          const k::SparseMlaPlan plan = automatic_plan(s_q, h_q, topk);
          const int pairs = pairs_of(topk);
          const int pps = plan.split ? plan.blocks_per_split / 2 : pairs;
          INFO("s_q " << s_q << " h_q " << h_q << " topk " << topk << ": " << plan.num_splits << " slices of " << pps
                      << " pairs");
          if (plan.kernel == k::SparseMlaKernel::wgmma_split_dv) continue;  // its own section
          REQUIRE(plan.blocks_per_split % 2 == 0);  // whole pairs
          CHECK(plan.num_splits == (pairs + pps - 1) / pps);
          const double taken = k::detail::split_time_us(items_of(s_q, h_q), pairs, pps, kH200Sms, 512);
          const double single = k::detail::split_time_us(items_of(s_q, h_q), pairs, pairs, kH200Sms, 512);
          if (plan.split) CHECK(taken < single - 1.0);
          for (int other = 1; other <= pairs; ++other) {
            if (std::int64_t{items_of(s_q, h_q)} * ((pairs + other - 1) / other) > 4 * kH200Sms) continue;
            CHECK(k::detail::split_time_us(items_of(s_q, h_q), pairs, other, kH200Sms, 512) >=
                  (other == pairs || !plan.split ? single - 1.0 : taken) - 1e-9);
          }
        }
      }
    }
  }
  SECTION("the SM count moves the choice") {
    // 64 tokens of 64 heads fill half of 132 SMs (no split pays) but a quarter of 264.
    CHECK_FALSE(automatic_plan(64, 64, 640, 512, 132).split);
    CHECK(automatic_plan(16, 64, 640, 512, 132).split);
    CHECK_FALSE(automatic_plan(16, 64, 640, 512, 16).split);  // one wave of items already
  }
  SECTION("s_q 0 plans the single pass") {
    const k::SparseMlaPlan plan = automatic_plan(0, 128, 1152);
    CHECK_FALSE(plan.split);
    CHECK(plan.num_splits == 1);
  }
}

TEST_CASE("sparse_mla plan: rows go to L2 ahead of their use only while the kv rows fit their share of L2", "[sparse_mla]") {
  // H200: 50 MiB of L2. Table A's rows (issue 15 rounds 19, 20): kv at s_kv 8192 is 8 MiB (d_qk 512)
  // or 9 MiB (576); at 32768 and more, 32-151 MiB. The L2 probe (bench --s-kv) found the next
  // wave's Q prefetch ahead up to 12 MiB, even at 16 MiB, behind from 20 MiB; the kv gathers'
  // 256-byte prefetch ahead at 8 MiB, even or behind from 12 MiB.
  constexpr std::int64_t kL2 = 50LL << 20;
  const auto q_rows = [](std::int64_t s_kv, std::int64_t stride) {
    return k::detail::kv_rows_fit_l2(s_kv, stride, kL2, k::detail::kQRowsPrefetchL2Share);
  };
  const auto kv_hint = [](std::int64_t s_kv, std::int64_t stride) {
    return k::detail::kv_rows_fit_l2(s_kv, stride, kL2, k::detail::kKvL2PrefetchL2Share);
  };
  CHECK(q_rows(8192, 512));
  CHECK(q_rows(8192, 576));
  CHECK(q_rows(12288, 576));
  CHECK(q_rows(16384, 512));
  CHECK_FALSE(q_rows(20480, 512));
  CHECK_FALSE(q_rows(24576, 512));
  CHECK_FALSE(q_rows(32768, 512));
  CHECK_FALSE(q_rows(131072, 576));
  CHECK(kv_hint(8192, 512));
  CHECK(kv_hint(8192, 576));
  CHECK_FALSE(kv_hint(12288, 512));
  CHECK_FALSE(kv_hint(16384, 512));
  CHECK_FALSE(kv_hint(32768, 512));
  CHECK_FALSE(kv_hint(65536, 512));
  // The bounds: s_kv * stride * 2 bytes <= L2 / share, a padded row stride counted whole.
  CHECK(q_rows(kL2 / 6 / 640, 640));
  CHECK_FALSE(q_rows(kL2 / 6 / 640 + 1, 640));
  CHECK(kv_hint(kL2 / 10 / 640, 640));
  CHECK_FALSE(kv_hint(kL2 / 10 / 640 + 1, 640));
  // L2 size not known: prefetch
  CHECK(k::detail::kv_rows_fit_l2(1 << 20, 512, 0, k::detail::kQRowsPrefetchL2Share));
  CHECK(k::detail::kv_rows_fit_l2(1 << 20, 512, 0, k::detail::kKvL2PrefetchL2Share));
}
