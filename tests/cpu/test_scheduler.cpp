// PrefillScheduler: properties over seeded random arrival traces, checked by an independent model
// (budget and chunk limits, each token once and in order, block tables and slot mappings from the
// formulas of docs/pipeline.md, no block shared or leaked, FIFO, waiting only for blocks), then
// hand-worked cases and bucket choice.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/model/pipeline_config.hpp"
#include "spgraph/scheduler/chunk_plan.hpp"
#include "spgraph/scheduler/prefill_scheduler.hpp"

using spg::model::LayerConfig;
using spg::model::PipelineConfig;
using spg::scheduler::ChunkPlan;
using spg::scheduler::PrefillScheduler;
using spg::scheduler::Request;
using spg::scheduler::SchedulerConfig;
using spg::scheduler::StepPlan;

namespace {

LayerConfig layer(int ratio, int window) {
  LayerConfig l;
  l.window = window;
  l.compress_ratio = ratio;
  l.top_k = ratio == 1 ? 0 : (ratio == 4 ? 1024 : 512);
  return l;
}

// The model's own view of one cache kind, written from docs/pipeline.md rather than from CacheKind.
struct KindModel {
  int ratio;
  int positions_per_block;
  int total;
  int rows_per_block() const { return positions_per_block / ratio; }
  int blocks(int seq_len) const {
    const int rows = seq_len / ratio;
    return (rows + rows_per_block() - 1) / rows_per_block();
  }
};

std::vector<KindModel> kinds_of(const PipelineConfig& p) {
  std::vector<KindModel> k{{1, p.cache.swa_block_size, p.cache.swa_blocks}};
  for (const int r : {4, 128}) {
    const bool present =
        std::any_of(p.layers.begin(), p.layers.end(), [r](const LayerConfig& l) { return l.compress_ratio == r; });
    if (present) {
      k.push_back({r, p.cache.block_tokens, p.cache.compressed_blocks});
    }
  }
  return k;
}

struct Coverage {
  long waited_for_blocks = 0;   // steps where the head of the queue waited for blocks with budget left
  long multi_chunk_steps = 0;
  long split_requests = 0;      // a request continued from one chunk into the next within a step
  long full_r_chunks = 0;       // chunks holding R requests
  long reused_blocks = 0;       // a block owned by a second request after the first finished
  long tokens = 0;
};

struct ReqModel {
  Request req;
  int rank = 0;  // FIFO order: arrival, then submission
  int prefilled = 0;
  std::int64_t first_step = -1;
  std::int64_t finish_step = -1;
  std::vector<std::vector<std::int32_t>> tables;  // per kind, latest seen
};

// Runs `trace` to completion and checks every step against the model; returns the steps taken.
std::int64_t run_and_check(const PipelineConfig& pipeline, const SchedulerConfig& sc, const std::vector<Request>& trace,
                           Coverage& cov) {
  PrefillScheduler sched(pipeline, sc);
  const std::vector<KindModel> kinds = kinds_of(pipeline);
  const int R = pipeline.max_requests;
  const int T = pipeline.max_tokens;
  const int W = pipeline.layers.front().window;
  const int cap = sc.max_tokens_per_request > 0 ? sc.max_tokens_per_request : std::numeric_limits<int>::max();
  REQUIRE(sched.cache_kinds().size() == kinds.size());
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    REQUIRE(sched.cache_kinds()[k].ratio == kinds[k].ratio);
  }

  std::map<std::int64_t, ReqModel> model;
  {
    std::vector<std::size_t> order(trace.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return trace[a].arrival_step < trace[b].arrival_step; });
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Request& r = trace[order[i]];
      ReqModel m;
      m.req = r;
      m.rank = static_cast<int>(i);
      m.tables.resize(kinds.size());
      model.emplace(r.id, m);
    }
  }
  sched.submit(trace);

  // owner[k][block]: the request holding it, -1 when free; last_owner spots reuse.
  std::vector<std::vector<std::int64_t>> owner(kinds.size()), last_owner(kinds.size());
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    owner[k].assign(static_cast<std::size_t>(kinds[k].total), -1);
    last_owner[k].assign(static_cast<std::size_t>(kinds[k].total), -1);
  }
  std::vector<int> owned(kinds.size(), 0);  // blocks with an owner, per kind
  std::vector<std::int64_t> finished_last_step;
  long total_tokens = 0;
  std::int64_t max_arrival = 0;
  for (const Request& r : trace) {
    total_tokens += r.prompt_len;
    max_arrival = std::max(max_arrival, r.arrival_step);
  }
  const std::int64_t step_bound = max_arrival + total_tokens + 2;

  std::int64_t s = 0;
  for (; !sched.done(); ++s) {
    REQUIRE(s <= step_bound);  // liveness: every request finishes
    const StepPlan plan = sched.schedule();
    REQUIRE(plan.step == s);

    // The scheduler returned the blocks of last step's finished requests before forming this one.
    for (const std::int64_t id : finished_last_step) {
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        for (const std::int32_t b : model.at(id).tables[k]) {
          REQUIRE(owner[k][static_cast<std::size_t>(b)] == id);
          owner[k][static_cast<std::size_t>(b)] = -1;
          --owned[k];
        }
      }
    }
    finished_last_step.clear();

    // Eligible and unfinished before the step, with what each still needs.
    std::map<std::int64_t, int> before;  // id -> prefilled before the step
    for (const auto& [id, m] : model) {
      if (m.req.arrival_step <= s && m.prefilled < m.req.prompt_len) before[id] = m.prefilled;
    }

    std::map<std::int64_t, int> served;
    std::vector<std::int64_t> started;
    std::int64_t prev_chunk_last = -1;
    REQUIRE((sc.max_chunks_per_step == 0 || static_cast<int>(plan.chunks.size()) <= sc.max_chunks_per_step));
    cov.multi_chunk_steps += plan.chunks.size() > 1 ? 1 : 0;
    for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
      const ChunkPlan& ch = plan.chunks[c];
      const int n = ch.num_requests;
      REQUIRE(n >= 1);
      REQUIRE(n <= R);
      REQUIRE(ch.num_tokens >= 1);
      REQUIRE(ch.num_tokens <= T);
      REQUIRE(ch.window == W);
      // A chunk is closed only when full, so every chunk but the last holds R requests or T tokens.
      if (c + 1 < plan.chunks.size()) REQUIRE((n == R || ch.num_tokens == T));
      cov.full_r_chunks += n == R ? 1 : 0;
      REQUIRE(ch.request_ids.size() == static_cast<std::size_t>(n));
      REQUIRE(ch.query_lens.size() == static_cast<std::size_t>(n));
      REQUIRE(ch.seq_lens.size() == static_cast<std::size_t>(n));
      REQUIRE(ch.gather_lens.size() == static_cast<std::size_t>(n));
      REQUIRE(ch.query_start_loc.size() == static_cast<std::size_t>(n + 1));
      REQUIRE(ch.query_start_loc[0] == 0);
      REQUIRE(ch.query_start_loc[static_cast<std::size_t>(n)] == ch.num_tokens);
      REQUIRE(ch.caches.size() == kinds.size());
      if (ch.request_ids.front() == prev_chunk_last) ++cov.split_requests;
      prev_chunk_last = ch.request_ids.back();

      std::vector<std::vector<std::int32_t>> want_slots(kinds.size()), want_rows(kinds.size()),
          want_tokens(kinds.size()), want_row_start(kinds.size(), std::vector<std::int32_t>{0});
      int n_rows[2] = {0, 0};  // for kinds[1], kinds[2]
      int max_gather = 0;
      for (int b = 0; b < n; ++b) {
        const auto ub = static_cast<std::size_t>(b);
        const std::int64_t id = ch.request_ids[ub];
        REQUIRE(std::count(ch.request_ids.begin(), ch.request_ids.end(), id) == 1);
        REQUIRE(model.contains(id));
        ReqModel& m = model.at(id);
        REQUIRE(m.req.arrival_step <= s);
        const int q = ch.query_lens[ub];
        REQUIRE(q >= 1);
        REQUIRE(ch.query_start_loc[ub + 1] - ch.query_start_loc[ub] == q);
        const int prefix = ch.seq_lens[ub] - q;
        REQUIRE(prefix == m.prefilled);  // in order, each token once
        const int seq = ch.seq_lens[ub];
        REQUIRE(seq <= m.req.prompt_len);
        REQUIRE(ch.gather_lens[ub] == std::min(seq, q + W - 1));
        max_gather = std::max(max_gather, seq < q + W - 1 ? seq : q + W - 1);
        if (m.first_step < 0) {
          m.first_step = s;
          started.push_back(id);
        }
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          const KindModel& km = kinds[k];
          const std::vector<std::int32_t>& table = ch.caches[k].block_tables.at(ub);
          REQUIRE(static_cast<int>(table.size()) == km.blocks(seq));
          std::vector<std::int32_t>& seen = m.tables[k];
          REQUIRE(table.size() >= seen.size());
          for (std::size_t i = 0; i < table.size(); ++i) {
            const std::int32_t blk = table[i];
            REQUIRE(blk >= 0);
            REQUIRE(blk < km.total);
            if (i < seen.size()) {
              REQUIRE(blk == seen[i]);  // a request's blocks never move
            } else {
              // Newly given: must have been free (never two live owners, never twice in a table).
              REQUIRE(owner[k][static_cast<std::size_t>(blk)] == -1);
              REQUIRE(sched.allocator(k).is_in_use(blk));
              owner[k][static_cast<std::size_t>(blk)] = id;
              ++owned[k];
              if (last_owner[k][static_cast<std::size_t>(blk)] >= 0) ++cov.reused_blocks;
              last_owner[k][static_cast<std::size_t>(blk)] = id;
            }
          }
          seen = table;
          // Insert-stage rows: each position p of this piece that completes a row.
          const int rpb = km.rows_per_block();
          for (int p = prefix; p < seq; ++p) {
            if ((p + 1) % km.ratio != 0) continue;
            const int row = (p + 1) / km.ratio - 1;
            want_slots[k].push_back(table[static_cast<std::size_t>(row / rpb)] * rpb + row % rpb);
            want_rows[k].push_back(row);
            want_tokens[k].push_back(ch.query_start_loc[ub] + (p - prefix));
          }
          want_row_start[k].push_back(static_cast<std::int32_t>(want_slots[k].size()));
          if (k > 0) n_rows[k - 1] = std::max(n_rows[k - 1], seq / km.ratio);
        }
        m.prefilled = seq;
        served[id] += q;
        if (m.prefilled == m.req.prompt_len) m.finish_step = s;
      }
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        const auto& cp = ch.caches[k];
        REQUIRE(cp.ratio == kinds[k].ratio);
        REQUIRE(cp.slot_mapping == want_slots[k]);
        REQUIRE(cp.rows == want_rows[k]);
        REQUIRE(cp.row_tokens == want_tokens[k]);
        REQUIRE(cp.row_start_loc == want_row_start[k]);
        // The staging block holds T / r + R compressed slots per chunk.
        if (k > 0) REQUIRE(cp.num_new_rows() <= T / kinds[k].ratio + R);
        const int ratio = kinds[k].ratio;
        const int want_n = k == 0 ? 0 : n_rows[k - 1];
        REQUIRE(ch.n_rows(ratio) == want_n);
        REQUIRE(ch.m_rows(ratio) == want_n + max_gather);
      }
    }

    // Step limits.
    int step_tokens = 0;
    for (const auto& [id, q] : served) {
      step_tokens += q;
      REQUIRE(q <= cap);
    }
    REQUIRE(step_tokens == plan.num_tokens());
    REQUIRE(step_tokens <= sc.max_num_batched_tokens);
    cov.tokens += step_tokens;

    // started / finished lists.
    std::vector<std::int64_t> finished;
    for (const auto& [id, m] : model) {
      if (m.finish_step == s) finished.push_back(id);
    }
    std::vector<std::int64_t> got_finished = plan.finished;
    std::sort(got_finished.begin(), got_finished.end());
    REQUIRE(got_finished == finished);
    std::vector<std::int64_t> got_started = plan.started;
    std::sort(got_started.begin(), got_started.end());
    std::sort(started.begin(), started.end());
    REQUIRE(got_started == started);

    // FIFO: a request gets tokens only after every earlier eligible one got all it could.
    std::vector<const ReqModel*> eligible;
    for (const auto& [id, p] : before) eligible.push_back(&model.at(id));
    std::sort(eligible.begin(), eligible.end(), [](const ReqModel* a, const ReqModel* b) { return a->rank < b->rank; });
    bool someone_short = false;  // an earlier eligible request got less than it could
    for (const ReqModel* m : eligible) {
      const int got = served.contains(m->req.id) ? served.at(m->req.id) : 0;
      if (got > 0) REQUIRE_FALSE(someone_short);
      const int full = std::min(m->req.prompt_len - before.at(m->req.id), cap);
      if (got < full) someone_short = true;
    }

    // Blocks: the model's count equals the allocator's, and admission never over-promises.
    std::vector<int> promised(kinds.size(), 0);
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      for (const auto& [id, m] : model) {
        if (m.first_step >= 0 && m.finish_step < 0) {
          promised[k] += kinds[k].blocks(m.req.prompt_len) - kinds[k].blocks(m.prefilled);
        }
      }
      const auto& alloc = sched.allocator(k);
      REQUIRE(alloc.in_use() + alloc.free() == alloc.total());
      REQUIRE(alloc.in_use() == owned[k]);
      REQUIRE(sched.promised_blocks(k) == promised[k]);
      REQUIRE(owned[k] + promised[k] <= kinds[k].total);
    }

    // Waiting only for blocks: with budget and chunk room left, every running request got all it
    // could and the first eligible request still unstarted cannot be promised its whole prompt.
    const bool chunk_room = sc.max_chunks_per_step == 0 ||
                            static_cast<int>(plan.chunks.size()) < sc.max_chunks_per_step ||
                            (plan.chunks.back().num_requests < R && plan.chunks.back().num_tokens < T);
    if (step_tokens < sc.max_num_batched_tokens && chunk_room) {
      for (const ReqModel* m : eligible) {
        if (m->first_step >= 0) {
          const int got = served.contains(m->req.id) ? served.at(m->req.id) : 0;
          REQUIRE(got == std::min(m->req.prompt_len - before.at(m->req.id), cap));
        }
      }
      const auto head = std::find_if(eligible.begin(), eligible.end(),
                                     [](const ReqModel* m) { return m->first_step < 0; });
      if (head != eligible.end()) {
        bool blocked = false;
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          blocked = blocked || kinds[k].blocks((*head)->req.prompt_len) > kinds[k].total - owned[k] - promised[k];
        }
        REQUIRE(blocked);
        ++cov.waited_for_blocks;
      }
    }
    finished_last_step = finished;
  }

  // Every request finished, admission in FIFO order, and all blocks come back.
  std::vector<const ReqModel*> by_rank;
  for (const auto& [id, m] : model) {
    REQUIRE(m.prefilled == m.req.prompt_len);
    REQUIRE(m.finish_step >= 0);
    by_rank.push_back(&m);
  }
  std::sort(by_rank.begin(), by_rank.end(), [](const ReqModel* a, const ReqModel* b) { return a->rank < b->rank; });
  for (std::size_t i = 1; i < by_rank.size(); ++i) {
    REQUIRE(by_rank[i - 1]->first_step <= by_rank[i]->first_step);
  }
  const StepPlan tail = sched.schedule();
  REQUIRE(tail.chunks.empty());
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    REQUIRE(sched.allocator(k).in_use() == 0);
    REQUIRE(sched.promised_blocks(k) == 0);
  }
  return s;
}

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const spg::Error& e) {
    return e.what();
  }
  return "no error";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("random traces: limits, order, blocks and slots hold at every step", "[scheduler]") {
  Coverage cov;
  for (std::uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1)); };
    const int windows[] = {1, 8, 64, 128};
    const int W = windows[pick(0, 3)];
    PipelineConfig p;
    p.max_requests = pick(1, 5);
    p.max_tokens = pick(8, 160);
    p.max_model_len = pick(64, 1200);
    switch (pick(0, 3)) {
      case 0: p.layers = {layer(1, W)}; break;
      case 1: p.layers = {layer(4, W)}; break;
      case 2: p.layers = {layer(128, W), layer(1, W)}; break;
      default: p.layers = {layer(4, W), layer(128, W), layer(1, W), layer(4, W)}; break;
    }
    const int block_sizes[] = {1, 4, 16, 64};
    p.cache.swa_block_size = block_sizes[pick(0, 3)];
    p.cache.block_tokens = 128 * pick(1, 2);
    // Pools from exactly one longest request to three, so that requests often wait for blocks.
    const int swa_need = (p.max_model_len + p.cache.swa_block_size - 1) / p.cache.swa_block_size;
    const int comp_need = (p.max_model_len / 4 + p.cache.block_tokens / 4 - 1) / (p.cache.block_tokens / 4);
    p.cache.swa_blocks = swa_need + pick(0, 2 * swa_need);
    const int c128_need = p.max_model_len / p.cache.block_tokens + 1;
    p.cache.compressed_blocks = std::max(comp_need, c128_need) + pick(0, 2 * comp_need);

    SchedulerConfig sc;
    sc.max_num_batched_tokens = pick(0, 9) == 0 ? pick(1, 8) : pick(1, 3 * p.max_tokens);
    sc.max_tokens_per_request = pick(0, 2) == 0 ? pick(1, p.max_tokens) : 0;
    sc.max_chunks_per_step = pick(0, 2) == 0 ? pick(1, 3) : 0;

    std::vector<Request> trace(static_cast<std::size_t>(pick(1, 30)));
    const bool burst = pick(0, 3) == 0;
    for (std::size_t i = 0; i < trace.size(); ++i) {
      trace[i].id = static_cast<std::int64_t>(i) * 7 + 3;
      trace[i].prompt_len = pick(0, 3) == 0 ? pick(1, 40) : pick(1, p.max_model_len);
      trace[i].arrival_step = burst ? 0 : pick(0, 40);
    }
    INFO("seed " << seed << ": R " << p.max_requests << ", T " << p.max_tokens << ", max_model_len "
                 << p.max_model_len << ", W " << W << ", " << sc.describe());
    run_and_check(p, sc, trace, cov);
  }
  // The traces reached the interesting cases.
  CHECK(cov.waited_for_blocks > 0);
  CHECK(cov.multi_chunk_steps > 0);
  CHECK(cov.split_requests > 0);
  CHECK(cov.full_r_chunks > 0);
  CHECK(cov.reused_blocks > 0);
}

TEST_CASE("V4 default program: 64K prompts through 2K chunks", "[scheduler]") {
  PipelineConfig p = PipelineConfig::v4_default();
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 8192;
  const std::vector<Request> trace = {{0, 65536, 0}, {1, 1000, 0}, {2, 65536, 1}, {3, 30000, 2}, {4, 4097, 3}};
  Coverage cov;
  const std::int64_t steps = run_and_check(p, sc, trace, cov);
  CHECK(cov.tokens == 65536 + 1000 + 65536 + 30000 + 4097);
  CHECK(steps == (cov.tokens + 8191) / 8192);  // the budget is filled every step
}

TEST_CASE("hand-worked chunk: slots, rows and N/M from the formulas", "[scheduler]") {
  PipelineConfig p;
  p.max_requests = 2;
  p.max_tokens = 64;
  p.max_model_len = 128;
  p.layers = {layer(4, 128)};
  p.cache.swa_block_size = 16;
  p.cache.block_tokens = 128;  // 32 compressed rows per block
  p.cache.swa_blocks = 16;
  p.cache.compressed_blocks = 4;
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 64;
  PrefillScheduler sched(p, sc);
  sched.submit(std::vector<Request>{{10, 100, 0}, {11, 20, 0}});

  const StepPlan s0 = sched.schedule();
  REQUIRE(s0.chunks.size() == 1);
  const ChunkPlan& c0 = s0.chunks[0];
  CHECK(c0.request_ids == std::vector<std::int64_t>{10});
  CHECK(c0.seq_lens == std::vector<std::int32_t>{64});
  CHECK(c0.gather_lens == std::vector<std::int32_t>{64});
  CHECK(c0.cache(1).block_tables[0] == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(c0.cache(1).slot_mapping.size() == 64);
  CHECK(c0.cache(1).slot_mapping[63] == 63);
  CHECK(c0.cache(4).block_tables[0] == std::vector<std::int32_t>{0});
  CHECK(c0.cache(4).rows == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  CHECK(c0.cache(4).row_tokens[0] == 3);
  CHECK(c0.cache(4).row_tokens[15] == 63);
  CHECK(s0.started == std::vector<std::int64_t>{10});
  CHECK(s0.finished.empty());
  CHECK(sched.num_waiting() == 1);  // 11 had no budget left, not no blocks

  const StepPlan s1 = sched.schedule();
  REQUIRE(s1.chunks.size() == 1);
  const ChunkPlan& c1 = s1.chunks[0];
  CHECK(c1.request_ids == std::vector<std::int64_t>{10, 11});
  CHECK(c1.query_lens == std::vector<std::int32_t>{36, 20});
  CHECK(c1.query_start_loc == std::vector<std::int32_t>{0, 36, 56});
  CHECK(c1.seq_lens == std::vector<std::int32_t>{100, 20});
  CHECK(c1.gather_lens == std::vector<std::int32_t>{100, 20});
  CHECK(c1.cache(1).block_tables[0] == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(c1.cache(1).block_tables[1] == std::vector<std::int32_t>{7, 8});
  CHECK(c1.cache(1).slot_mapping[0] == 64);       // position 64 -> block 4, offset 0
  CHECK(c1.cache(1).slot_mapping[36] == 7 * 16);  // request 11, position 0
  CHECK(c1.cache(1).slot_mapping[55] == 8 * 16 + 3);
  // Request 10 completes rows 16..24 (positions 67 .. 99), request 11 rows 0..4 in block 1.
  CHECK(c1.cache(4).rows == std::vector<std::int32_t>{16, 17, 18, 19, 20, 21, 22, 23, 24, 0, 1, 2, 3, 4});
  CHECK(c1.cache(4).slot_mapping ==
        std::vector<std::int32_t>{16, 17, 18, 19, 20, 21, 22, 23, 24, 32, 33, 34, 35, 36});
  CHECK(c1.cache(4).row_tokens == std::vector<std::int32_t>{3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55});
  CHECK(c1.cache(4).row_start_loc == std::vector<std::int32_t>{0, 9, 14});
  CHECK(c1.n_rows(4) == 25);
  CHECK(c1.m_rows(4) == 125);
  CHECK(c1.n_rows(1) == 0);
  CHECK(c1.m_rows(1) == 100);
  CHECK_THROWS_AS(c1.cache(128), spg::InvalidArgument);
  CHECK(s1.finished == std::vector<std::int64_t>{10, 11});
  CHECK(sched.done());
  CHECK(sched.allocator(0).in_use() == 9);  // held until the next schedule()

  const StepPlan s2 = sched.schedule();
  CHECK(s2.chunks.empty());
  CHECK(sched.allocator(0).in_use() == 0);
  CHECK(sched.allocator(1).in_use() == 0);
}

TEST_CASE("a request waits for blocks at the head of the queue, then reuses freed blocks", "[scheduler]") {
  PipelineConfig p;
  p.max_requests = 4;
  p.max_tokens = 256;
  p.max_model_len = 128;
  p.layers = {layer(1, 128)};
  p.cache.swa_block_size = 16;
  p.cache.swa_blocks = 9;  // one 128-token request (8 blocks) and one block more
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 512;
  PrefillScheduler sched(p, sc);
  sched.submit(std::vector<Request>{{1, 128, 0}, {2, 128, 0}, {3, 1, 0}});

  const StepPlan s0 = sched.schedule();
  REQUIRE(s0.chunks.size() == 1);
  // 2 does not fit; 3 would, but must not overtake it.
  CHECK(s0.chunks[0].request_ids == std::vector<std::int64_t>{1});
  const std::vector<std::int32_t> first = s0.chunks[0].cache(1).block_tables[0];
  CHECK(sched.num_waiting() == 2);

  const StepPlan s1 = sched.schedule();
  REQUIRE(s1.chunks.size() == 1);
  CHECK(s1.chunks[0].request_ids == std::vector<std::int64_t>{2, 3});
  std::vector<std::int32_t> second = s1.chunks[0].cache(1).block_tables[0];
  std::sort(second.begin(), second.end());
  CHECK(second == first);  // request 1's blocks, reused
  CHECK(s1.chunks[0].cache(1).block_tables[1] == std::vector<std::int32_t>{8});
  CHECK(sched.done());
}

TEST_CASE("a long prompt continues across the chunks of one step, and across steps", "[scheduler]") {
  PipelineConfig p;
  p.max_requests = 4;
  p.max_tokens = 64;
  p.max_model_len = 1024;
  p.layers = {layer(4, 16)};
  p.cache.swa_block_size = 64;
  p.cache.swa_blocks = 16;
  p.cache.compressed_blocks = 8;
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 200;

  SECTION("chunks bounded by the budget") {
    PrefillScheduler sched(p, sc);
    sched.submit(Request{5, 150, 0});
    const StepPlan s = sched.schedule();
    REQUIRE(s.chunks.size() == 3);
    CHECK(s.chunks[0].seq_lens == std::vector<std::int32_t>{64});
    CHECK(s.chunks[1].seq_lens == std::vector<std::int32_t>{128});
    CHECK(s.chunks[2].seq_lens == std::vector<std::int32_t>{150});
    CHECK(s.chunks[2].gather_lens == std::vector<std::int32_t>{22 + 15});
    CHECK(s.finished == std::vector<std::int64_t>{5});
  }
  SECTION("at most two chunks per step") {
    sc.max_chunks_per_step = 2;
    PrefillScheduler sched(p, sc);
    sched.submit(Request{5, 150, 0});
    const StepPlan s0 = sched.schedule();
    REQUIRE(s0.chunks.size() == 2);
    CHECK(s0.num_tokens() == 128);
    const StepPlan s1 = sched.schedule();
    REQUIRE(s1.chunks.size() == 1);
    CHECK(s1.chunks[0].query_lens == std::vector<std::int32_t>{22});
    CHECK(s1.chunks[0].seq_lens == std::vector<std::int32_t>{150});
  }
  SECTION("a per-request cap shares the step") {
    sc.max_num_batched_tokens = 64;
    sc.max_tokens_per_request = 20;
    PrefillScheduler sched(p, sc);
    sched.submit(std::vector<Request>{{1, 50, 0}, {2, 50, 0}, {3, 50, 0}, {4, 50, 0}});
    const StepPlan s0 = sched.schedule();
    REQUIRE(s0.chunks.size() == 1);
    CHECK(s0.chunks[0].query_lens == std::vector<std::int32_t>{20, 20, 20, 4});
  }
}

TEST_CASE("requests wait for their arrival step", "[scheduler]") {
  PipelineConfig p;
  p.max_model_len = 4096;
  p.layers = {layer(1, 128)};
  PrefillScheduler sched(p, SchedulerConfig{});
  sched.submit(Request{1, 10, 3});
  for (int s = 0; s < 3; ++s) {
    const StepPlan plan = sched.schedule();
    CHECK(plan.step == s);
    CHECK(plan.chunks.empty());
  }
  CHECK(sched.schedule().num_tokens() == 10);
  CHECK(sched.done());
}

TEST_CASE("bad requests and configs are rejected with the value and its bounds", "[scheduler]") {
  PipelineConfig p;
  p.max_model_len = 4096;
  p.layers = {layer(4, 128), layer(128, 128)};
  PrefillScheduler sched(p, SchedulerConfig{});

  const std::string too_long = error_of([&] { sched.submit(Request{7, 5000, 0}); });
  CHECK(has(too_long, "request 7"));
  CHECK(has(too_long, "prompt_len = 5000"));
  CHECK(has(too_long, "max_model_len = 4096"));
  CHECK_THROWS_AS(sched.submit(Request{7, 0, 0}), spg::InvalidArgument);
  sched.submit(Request{7, 10, 0});
  CHECK(has(error_of([&] { sched.submit(Request{7, 10, 0}); }), "already queued"));
  (void)sched.schedule();
  CHECK(has(error_of([&] { sched.submit(Request{8, 10, 0}); }), "arrival_step = 0 is before the next step 1"));
  sched.submit(Request{7, 10, 1});  // 7 finished, so its id may come back

  PipelineConfig small = p;
  small.cache.swa_blocks = 63;  // 4096 tokens need 64 blocks of 64
  const std::string pool = error_of([&] { PrefillScheduler s(small, SchedulerConfig{}); });
  CHECK(has(pool, "cache.swa_blocks = 63"));
  CHECK(has(pool, "needs 64 blocks"));

  SchedulerConfig zero;
  zero.max_num_batched_tokens = 0;
  CHECK(has(error_of([&] { PrefillScheduler s(p, zero); }), "max_num_batched_tokens = 0"));
  PipelineConfig empty = p;
  empty.layers.clear();
  CHECK_THROWS_AS(PrefillScheduler(empty, SchedulerConfig{}), spg::InvalidArgument);
}

