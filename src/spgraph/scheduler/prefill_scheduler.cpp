// Chunked prefill scheduling and block accounting: see prefill_scheduler.hpp.
#include "spgraph/scheduler/prefill_scheduler.hpp"

#include <algorithm>
#include <sstream>

#include "spgraph/core/error.hpp"

namespace spg::scheduler {

void SchedulerConfig::validate() const {
  SPG_EXPECTS(max_num_batched_tokens >= 1,
              "max_num_batched_tokens = " << max_num_batched_tokens << " must be at least 1");
  SPG_EXPECTS(max_tokens_per_request >= 0,
              "max_tokens_per_request = " << max_tokens_per_request << " must be at least 0 (0: no cap)");
  SPG_EXPECTS(max_chunks_per_step >= 0,
              "max_chunks_per_step = " << max_chunks_per_step << " must be at least 0 (0: no cap)");
}

std::string SchedulerConfig::describe() const {
  std::ostringstream os;
  os << "budget " << max_num_batched_tokens << " tokens/step, ";
  if (max_tokens_per_request > 0) {
    os << "at most " << max_tokens_per_request << " tokens per request per step, ";
  } else {
    os << "no per-request cap, ";
  }
  if (max_chunks_per_step > 0) {
    os << "at most " << max_chunks_per_step << " chunks per step";
  } else {
    os << "chunks per step bounded by the budget";
  }
  return os.str();
}

int StepPlan::num_tokens() const noexcept {
  int n = 0;
  for (const ChunkPlan& c : chunks) {
    n += c.num_tokens;
  }
  return n;
}

const graphs::StepInput& StepPlan::input() const {
  request_inputs_.clear();
  std::int64_t last_id = -1;
  for (const ChunkPlan& c : chunks) {
    const graphs::ChunkInput& in = c.input();
    for (std::size_t b = 0; b < in.requests.size(); ++b) {
      const graphs::RequestInput& r = in.requests[b];
      // A request continues from one chunk into the next only as the last piece of the one and
      // the first of the other (chunk_split.hpp): merging neighbours restores the request.
      if (b == 0 && !request_inputs_.empty() && c.request_ids[b] == last_id) {
        graphs::RequestInput& whole = request_inputs_.back();
        const int query_len = whole.query_len + r.query_len;
        whole = r;
        whole.query_len = query_len;
      } else {
        request_inputs_.push_back(r);
      }
      last_id = c.request_ids[b];
    }
  }
  input_.requests = request_inputs_;
  return input_;
}

namespace {
const model::PipelineConfig& validated(const model::PipelineConfig& pipeline) {
  pipeline.validate();
  return pipeline;
}
}  // namespace

PrefillScheduler::PrefillScheduler(const model::PipelineConfig& pipeline, const SchedulerConfig& config)
    : kinds_(scheduler::cache_kinds(validated(pipeline))),
      config_(config),
      max_requests_(pipeline.max_requests),
      max_tokens_(pipeline.max_tokens),
      max_model_len_(pipeline.max_model_len),
      window_(pipeline.window()),
      limits_{pipeline.max_requests, pipeline.max_tokens, config.max_chunks_per_step} {
  config_.validate();
  for (const CacheKind& k : kinds_) {
    const char* field = k.is_swa() ? "cache.swa_blocks" : "cache.compressed_blocks";
    const int need = k.blocks_for(max_model_len_);
    SPG_EXPECTS(need <= k.num_blocks, field << " = " << k.num_blocks << " cannot hold one request of max_model_len = "
                                            << max_model_len_ << " tokens: its cache of ratio " << k.ratio
                                            << " needs " << need << " blocks");
    // Slots are int32 on the device.
    SPG_EXPECTS(static_cast<std::int64_t>(k.num_blocks) * k.rows_per_block <= INT32_MAX,
                field << " = " << k.num_blocks << " times " << k.rows_per_block
                      << " rows per block overflows an int32 slot id");
    allocators_.emplace_back(k.num_blocks);
  }
  promised_.assign(kinds_.size(), 0);
}

const BlockAllocator& PrefillScheduler::allocator(std::size_t kind) const {
  SPG_EXPECTS(kind < allocators_.size(), "kind = " << kind << " must be below " << allocators_.size());
  return allocators_[kind];
}

int PrefillScheduler::promised_blocks(std::size_t kind) const {
  SPG_EXPECTS(kind < promised_.size(), "kind = " << kind << " must be below " << promised_.size());
  return promised_[kind];
}

void PrefillScheduler::submit(const Request& request) {
  SPG_EXPECTS(request.prompt_len >= 1 && request.prompt_len <= max_model_len_,
              "request " << request.id << ": prompt_len = " << request.prompt_len << " is outside [1, max_model_len = "
                         << max_model_len_ << "]");
  SPG_EXPECTS(request.arrival_step >= next_step_, "request " << request.id << ": arrival_step = "
                                                             << request.arrival_step << " is before the next step "
                                                             << next_step_);
  SPG_EXPECTS(!live_ids_.contains(request.id), "request id " << request.id << " is already queued or running");
  const auto at = std::upper_bound(pending_.begin(), pending_.end(), request.arrival_step,
                                   [](std::int64_t a, const Request& r) { return a < r.arrival_step; });
  pending_.insert(at, request);
  live_ids_.insert(request.id);
}

void PrefillScheduler::submit(std::span<const Request> requests) {
  for (const Request& r : requests) {
    submit(r);
  }
}

graphs::SplitCursor PrefillScheduler::cursor(const StepPlan& plan) const noexcept {
  graphs::SplitCursor at;
  at.chunks = static_cast<int>(plan.chunks.size());
  if (!plan.chunks.empty()) {
    at.requests = plan.chunks.back().num_requests;
    at.tokens = plan.chunks.back().num_tokens;
  }
  return at;
}

bool PrefillScheduler::has_room(const StepPlan& plan, int budget_left) const noexcept {
  if (budget_left <= 0) {
    return false;
  }
  const bool may_open = config_.max_chunks_per_step == 0 ||
                        static_cast<int>(plan.chunks.size()) < config_.max_chunks_per_step;
  return may_open || !graphs::chunk_full(limits_, cursor(plan));
}

bool PrefillScheduler::fits(const detail::RequestState& state) const noexcept {
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    if (state.footprint[k] > allocators_[k].free() - promised_[k]) {
      return false;
    }
  }
  return true;
}

ChunkPlan PrefillScheduler::empty_chunk() const {
  ChunkPlan chunk;
  chunk.window = window_;
  chunk.query_start_loc.push_back(0);
  chunk.caches.resize(kinds_.size());
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    chunk.caches[k].ratio = kinds_[k].ratio;
    chunk.caches[k].row_start_loc.push_back(0);
  }
  return chunk;
}

void PrefillScheduler::append_piece(ChunkPlan& chunk, const detail::RequestState& state, int query_len) const {
  const int prefix = state.prefilled;
  const int seq_len = prefix + query_len;
  const int token0 = chunk.num_tokens;
  chunk.request_ids.push_back(state.request.id);
  chunk.query_lens.push_back(query_len);
  chunk.seq_lens.push_back(seq_len);
  chunk.gather_lens.push_back(graphs::gather_len(seq_len, query_len, window_));
  chunk.num_tokens += query_len;
  chunk.num_requests += 1;
  chunk.query_start_loc.push_back(chunk.num_tokens);

  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    const CacheKind& kind = kinds_[k];
    ChunkCachePlan& cache = chunk.caches[k];
    const auto& blocks = state.blocks[k];
    cache.block_tables.emplace_back(blocks.begin(), blocks.begin() + kind.blocks_for(seq_len));
    const std::vector<std::int32_t>& table = cache.block_tables.back();
    // Rows completed by positions prefix .. seq_len - 1: row i ends at position (i + 1) * r - 1.
    for (int i = kind.rows(prefix); i < kind.rows(seq_len); ++i) {
      cache.slot_mapping.push_back(kind.slot(table, i));
      cache.rows.push_back(i);
      cache.row_tokens.push_back(token0 + (i + 1) * kind.ratio - 1 - prefix);
    }
    cache.row_start_loc.push_back(static_cast<std::int32_t>(cache.slot_mapping.size()));
  }
}

int PrefillScheduler::serve(detail::RequestState& state, StepPlan& plan, int budget_left) {
  int want = std::min(state.request.prompt_len - state.prefilled, budget_left);
  if (config_.max_tokens_per_request > 0) {
    want = std::min(want, config_.max_tokens_per_request);
  }

  // Cut the request's tokens into pieces by the one split rule (src/spgraph/graphs/chunk_split.hpp): the
  // rest of the open chunk, then fresh chunks.
  pieces_.clear();
  graphs::SplitCursor at = cursor(plan);
  int take = 0;
  while (take < want) {
    const graphs::ChunkPiece p = graphs::next_piece(limits_, at, want - take, take > 0);
    if (p.tokens == 0) {
      break;  // the cap on chunks per step
    }
    graphs::advance(at, p);
    pieces_.push_back(p);
    take += p.tokens;
  }

  // All kinds at once for the whole step; admission promised these blocks, so this cannot fail.
  const int seq_end = state.prefilled + take;
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    const int need = kinds_[k].blocks_for(seq_end) - static_cast<int>(state.blocks[k].size());
    const bool given = need <= promised_[k] && allocators_[k].try_allocate(need, state.blocks[k]);
    SPG_EXPECTS_AS(StateError, given,
                   "request " << state.request.id << " needs " << need << " blocks of ratio " << kinds_[k].ratio
                              << " beyond its promise: the scheduler's block accounting is broken");
    promised_[k] -= need;
  }

  for (const graphs::ChunkPiece& p : pieces_) {
    if (p.new_chunk) {
      plan.chunks.push_back(empty_chunk());
    }
    append_piece(plan.chunks.back(), state, p.tokens);
    state.prefilled += p.tokens;
  }
  return take;
}

StepPlan PrefillScheduler::schedule() {
  for (detail::RequestState& done_state : retired_) {
    for (std::size_t k = 0; k < kinds_.size(); ++k) {
      allocators_[k].release(done_state.blocks[k]);
    }
  }
  retired_.clear();

  StepPlan plan;
  plan.step = next_step_;
  int budget_left = config_.max_num_batched_tokens;

  // Running requests arrived before every waiting one, so serving them first is FIFO.
  for (detail::RequestState& state : running_) {
    if (!has_room(plan, budget_left)) {
      break;
    }
    budget_left -= serve(state, plan, budget_left);
  }
  while (!pending_.empty() && pending_.front().arrival_step <= plan.step && has_room(plan, budget_left)) {
    detail::RequestState state;
    state.request = pending_.front();
    state.blocks.resize(kinds_.size());
    for (const CacheKind& k : kinds_) {
      state.footprint.push_back(k.blocks_for(state.request.prompt_len));
    }
    // Head-of-line: a request that does not fit blocks the queue, so nothing overtakes it.
    if (!fits(state)) {
      break;
    }
    for (std::size_t k = 0; k < kinds_.size(); ++k) {
      promised_[k] += state.footprint[k];
    }
    pending_.pop_front();
    plan.started.push_back(state.request.id);
    running_.push_back(std::move(state));
    budget_left -= serve(running_.back(), plan, budget_left);
  }

  // Finished requests keep their blocks until the next call, while this step's plans refer to them.
  auto keep = running_.begin();
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->prefilled == it->request.prompt_len) {
      plan.finished.push_back(it->request.id);
      live_ids_.erase(it->request.id);
      retired_.push_back(std::move(*it));
    } else {
      if (keep != it) {
        *keep = std::move(*it);
      }
      ++keep;
    }
  }
  running_.erase(keep, running_.end());
  ++next_step_;
  return plan;
}

}  // namespace spg::scheduler
