// Steps: see step.hpp and docs/graphs.md, "Steps".
#include "spgraph/graphs/step.hpp"

#include <string>

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/pipeline.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"

namespace spg::graphs {

namespace {

StepSplit refuse(RunStatus status, int request, const char* field, const char* reason) noexcept {
  StepSplit s;
  s.status = status;
  s.bad_request = request;
  s.bad_field = field;
  s.bad_reason = reason;
  return s;
}

/// Records into `graph` by stream capture (the graph may already hold nodes; the capture starts
/// after `after`, or from none of them). The capture is ended on every path.
template <class Record>
void capture_into(cudaGraph_t graph, cudaStream_t stream, Record&& record, const cudaGraphNode_t* after = nullptr) {
  SPG_CUDA_TRY(cudaStreamBeginCaptureToGraph(stream, graph, after, nullptr, after != nullptr ? 1 : 0,
                                             cudaStreamCaptureModeThreadLocal));
  const cudaError_t recorded = record();
  cudaGraph_t out = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &out);
  SPG_CUDA_TRY(recorded);
  SPG_CUDA_TRY(ended);
}

/// The one node of a graph that holds exactly one.
cudaGraphNode_t only_node(cudaGraph_t graph) {
  std::size_t n = 1;
  cudaGraphNode_t node = nullptr;
  SPG_CUDA_TRY(cudaGraphGetNodes(graph, &node, &n));
  SPG_EXPECTS_AS(StateError, n == 1, "step graph: expected one node, the capture made " << n);
  return node;
}

std::size_t nodes_of(cudaGraph_t g) {
  std::size_t n = 0;
  SPG_CUDA_TRY(cudaGraphGetNodes(g, nullptr, &n));
  return n;
}

}  // namespace

StepLayout StepLayout::make(const model::PipelineConfig& config, int max_step_requests, int max_step_tokens) {
  SPG_EXPECTS(max_step_requests >= 1 && max_step_requests <= kMaxStepRequests,
              "max_step_requests = " << max_step_requests << " must be in [1, " << kMaxStepRequests << "]");
  SPG_EXPECTS(max_step_tokens >= 1 && max_step_tokens <= kMaxStepTokens,
              "max_step_tokens = " << max_step_tokens << " must be in [1, " << kMaxStepTokens << "]");
  StepLayout l;
  l.max_requests = max_step_requests;
  l.max_tokens = max_step_tokens;
  l.max_chunks = max_split_chunks(max_step_requests, max_step_tokens, config.max_tokens);
  l.header_words = kernels::StepStateWords::header_words(l.max_chunks);
  l.chunk_words = ChunkMetaLayout::make(config).words;
  return l;
}

void plan_step_slots(memory::PoolPlan& plan, const StepLayout& layout) {
  if (layout.max_chunks == 0) return;
  for (const char* staging : slots::kStepStaging) {
    plan.add(memory::SlotSpec{staging, layout.bytes(), 256, memory::MemoryKind::pinned_host,
                              "int32 (step staging: header, " + std::to_string(layout.max_chunks) + " chunk blocks)"});
  }
  plan.add(memory::SlotSpec{slots::kStepState, static_cast<std::size_t>(layout.header_words) * 4, 256,
                            memory::MemoryKind::device, "int32 (step state)"});
  plan.add(memory::SlotSpec{slots::kStepMeta, layout.meta_bytes(), 256, memory::MemoryKind::device,
                            "int32 (step blocks: " + std::to_string(layout.max_chunks) + " chunk blocks)"});
}

StepSplitter::StepSplitter(const model::PipelineConfig& config, const StepLayout& layout)
    : limits_{config.max_requests, config.max_tokens, 0},
      layout_(layout),
      pieces_(static_cast<std::size_t>(layout.max_requests + layout.max_chunks)),
      piece_request_(pieces_.size()),
      chunk_begin_(static_cast<std::size_t>(layout.max_chunks) + 1) {}

StepSplit StepSplitter::split(const StepInput& step) noexcept {
  if (step.requests.size() > static_cast<std::size_t>(layout_.max_requests)) {
    return refuse(RunStatus::no_bucket, -1, "step.requests", "more requests than max_step_requests");
  }
  std::int64_t tokens = 0;
  for (std::size_t i = 0; i < step.requests.size(); ++i) {
    const RequestInput& r = step.requests[i];
    const int b = static_cast<int>(i);
    if (r.query_len < 1) return refuse(RunStatus::bad_chunk, b, "query_len", "must be at least 1 in a step");
    if (r.seq_len < r.query_len) return refuse(RunStatus::bad_chunk, b, "seq_len", "is below query_len");
    tokens += r.query_len;
  }
  if (tokens > layout_.max_tokens) {
    return refuse(RunStatus::no_bucket, -1, "step.tokens", "more tokens than max_step_tokens, the rows the layer buffers hold");
  }
  SplitCursor at;
  std::size_t n = 0;
  for (std::size_t i = 0; i < step.requests.size(); ++i) {
    const RequestInput& r = step.requests[i];
    int left = r.query_len;
    int end = r.seq_len - r.query_len;
    while (left > 0) {
      const ChunkPiece p = next_piece(limits_, at, left, left < r.query_len);
      advance(at, p);
      // max_chunks bounds every split of a step within the maxima (chunk_split.hpp): a guard, not a case.
      if (at.chunks > layout_.max_chunks || n >= pieces_.size()) {
        return refuse(RunStatus::no_bucket, static_cast<int>(i), "step", "splits into more chunks than planned");
      }
      if (p.new_chunk) chunk_begin_[static_cast<std::size_t>(at.chunks - 1)] = static_cast<int>(n);
      end += p.tokens;
      RequestInput& piece = pieces_[n];
      piece = r;
      piece.query_len = p.tokens;
      piece.seq_len = end;
      piece_request_[n] = static_cast<int>(i);
      ++n;
      left -= p.tokens;
    }
  }
  chunk_begin_[static_cast<std::size_t>(at.chunks)] = static_cast<int>(n);
  StepSplit s;
  s.chunks = at.chunks;
  return s;
}

ChunkInput StepSplitter::chunk(int c) const noexcept {
  const auto begin = static_cast<std::size_t>(chunk_begin_[static_cast<std::size_t>(c)]);
  const auto end = static_cast<std::size_t>(chunk_begin_[static_cast<std::size_t>(c) + 1]);
  ChunkInput in;
  in.requests = std::span<const RequestInput>(pieces_.data() + begin, end - begin);
  return in;
}

StepStager::StepStager(const model::PipelineConfig& config, const StepLayout& layout, const BucketSet& buckets,
                       ChunkEncoder& encoder)
    : layout_(layout),
      bucket_set_(buckets),
      encoder_(encoder),
      splitter_(config, layout),
      checks_(static_cast<std::size_t>(layout.max_chunks)),
      buckets_(static_cast<std::size_t>(layout.max_chunks)) {}

StepCheck StepStager::check(const StepInput& step, int ratio_mask) noexcept {
  StepCheck out;
  chunks_ = 0;
  const StepSplit split = splitter_.split(step);
  if (split.status != RunStatus::ok) {
    out.status = split.status;
    out.bad_request = split.bad_request;
    out.bad_field = split.bad_field;
    out.bad_reason = split.bad_reason;
    return out;
  }
  out.chunks = split.chunks;
  // The step's block-table entries are scattered over the caller's memory: ask for all of them
  // before the checks wait on the first.
  for (int c = 0; c < split.chunks; ++c) encoder_.prefetch(splitter_.chunk(c), ratio_mask);
  for (int c = 0; c < split.chunks; ++c) {
    ChunkCheck& checked = checks_[static_cast<std::size_t>(c)];
    checked = encoder_.check(splitter_.chunk(c), ratio_mask);
    int bucket = -1;
    if (checked.status == RunStatus::ok) {
      bucket = bucket_set_.lookup(checked.requests, checked.tokens);
      if (bucket < 0) checked.status = RunStatus::no_bucket;
    }
    if (checked.status != RunStatus::ok) {
      out.status = checked.status;
      out.bad_chunk = c;
      out.bad_request = checked.bad_request < 0 ? -1 : splitter_.request_of(c, checked.bad_request);
      out.bad_field = checked.bad_field;
      out.bad_reason = checked.bad_reason;
      return out;
    }
    buckets_[static_cast<std::size_t>(c)] = bucket;
  }
  chunks_ = split.chunks;
  return out;
}

void StepStager::write(int ratio_mask, std::int32_t* block) const noexcept {
  ChunkRows rows;  // chunk c's rows follow chunk c - 1's in the step's buffers
  // The leading full chunks (their bucket's T the largest) run on the largest bucket, in the step
  // graph's first loop; the first chunk that is not full ends that run (chunks keep their order:
  // a request's later piece reads the cache rows its earlier one inserts).
  const int t_max = bucket_set_.t_buckets().back();
  int fast = 0;
  for (int c = 0; c < chunks_; ++c) {
    const ChunkCheck& checked = checks_[static_cast<std::size_t>(c)];
    encoder_.write(splitter_.chunk(c), checked, ratio_mask, block + layout_.chunk_offset(c), rows);
    rows = rows.next(checked);
    int bucket = buckets_[static_cast<std::size_t>(c)];
    if (fast == c && bucket_set_.t_of(bucket) == t_max) {
      bucket = fast_bucket();
      ++fast;
    }
    block[kernels::StepStateWords::buckets + c] = bucket;
  }
  block[kernels::StepStateWords::count] = chunks_;
  block[kernels::StepStateWords::fast] = fast;
}

std::size_t StepGraph::node_count() const {
  std::size_t n = nodes_of(graph.get()) + nodes_of(fast_loop_body) + nodes_of(loop_body);
  for (cudaGraph_t b : bucket_bodies) n += nodes_of(b);
  return n;
}

std::size_t StepGraph::expected_nodes(std::span<const Pipeline* const> bodies) noexcept {
  std::size_t n = 7;  // head, two WHILEs, tail; next_fast; next, SWITCH
  // A body is the chunk's layers: its pipeline's launches less the chunk graph's stage-in.
  for (const Pipeline* p : bodies) n += static_cast<std::size_t>(p->kernel_launches() - 1);
  if (!bodies.empty()) n += static_cast<std::size_t>(bodies.back()->kernel_launches() - 1);  // the first loop's
  return n;
}

StepGraph build_step_graph(const kernels::StepLoopArgs& args, std::span<const Pipeline* const> bodies,
                           cudaStream_t stream) {
  kernels::StepLoop::can_implement(args);
  SPG_EXPECTS(!bodies.empty(), "build_step_graph: no bucket bodies");
  StepGraph out;
  cudaGraph_t top = nullptr;
  SPG_CUDA_TRY(cudaGraphCreate(&top, 0));
  out.graph = Graph(top);

  kernels::StepConditionals cond;
  cond.set = true;
  // Every handle belongs to the top graph: a handle may drive a conditional node in its graph or
  // in any graph below it, and head and the loops' next kernels set them.
  SPG_CUDA_TRY(cudaGraphConditionalHandleCreate(&cond.fast_loop, top, 0, 0));
  SPG_CUDA_TRY(cudaGraphConditionalHandleCreate(&cond.loop, top, 0, 0));
  SPG_CUDA_TRY(cudaGraphConditionalHandleCreate(&cond.select, top, 0, 0));
  capture_into(top, stream, [&] { return kernels::StepLoop::run_head(args, cond, stream); });
  const cudaGraphNode_t head = only_node(top);

  // The first loop: the leading chunks the host put on the largest bucket, no SWITCH (a SWITCH
  // costs a chunk about 5 us of GPU time: docs/benchmarks.md, the loop probe).
  const ConditionalNode fast = add_conditional_node(top, &head, cond.fast_loop, cudaGraphCondTypeWhile, 1);
  out.fast_loop_body = fast.bodies[0];
  capture_into(out.fast_loop_body, stream, [&] { return kernels::StepLoop::run_next_fast(args, cond, stream); });
  const cudaGraphNode_t next_fast = only_node(out.fast_loop_body);
  const Pipeline* largest = bodies.back();
  capture_into(out.fast_loop_body, stream, [&] { return largest->record_layers(stream); }, &next_fast);

  const ConditionalNode loop = add_conditional_node(top, &fast.node, cond.loop, cudaGraphCondTypeWhile, 1);
  out.loop_body = loop.bodies[0];

  capture_into(out.loop_body, stream, [&] { return kernels::StepLoop::run_next(args, cond, stream); });
  const cudaGraphNode_t next = only_node(out.loop_body);

  const ConditionalNode select = add_conditional_node(out.loop_body, &next, cond.select, cudaGraphCondTypeSwitch,
                                                      static_cast<unsigned>(bodies.size()));
  // tail, after the loop: releases the staging block once the whole step has run.
  capture_into(top, stream, [&] { return kernels::StepLoop::run_tail(args, stream); }, &loop.node);
  for (std::size_t b = 0; b < bodies.size(); ++b) {
    cudaGraph_t body = select.bodies[b];
    out.bucket_bodies.push_back(body);
    const Pipeline* p = bodies[b];
    capture_into(body, stream, [&] { return p->record_layers(stream); });
  }
  return out;
}

cudaError_t record_step_eager(const kernels::StepLoopArgs& args, std::span<const Pipeline* const> bodies,
                              std::span<const int> chunk_buckets, cudaStream_t stream) noexcept {
  const kernels::StepConditionals none{};
  cudaError_t e = kernels::StepLoop::run_head(args, none, stream);
  for (std::size_t c = 0; c < chunk_buckets.size() && e == cudaSuccess; ++c) {
    e = kernels::StepLoop::run_next(args, none, stream);
    if (e == cudaSuccess) e = bodies[static_cast<std::size_t>(chunk_buckets[c])]->record_layers(stream);
  }
  return e == cudaSuccess ? kernels::StepLoop::run_tail(args, stream) : e;
}

Graph build_flat_step_graph(const kernels::StepLoopArgs& args, const Pipeline& largest, int chunks,
                            cudaStream_t stream) {
  kernels::StepLoop::can_implement(args);
  SPG_EXPECTS(chunks >= 1 && chunks <= args.max_chunks,
              "build_flat_step_graph: chunks = " << chunks << " must be in [1, " << args.max_chunks << "]");
  cudaGraph_t raw = nullptr;
  SPG_CUDA_TRY(cudaGraphCreate(&raw, 0));
  Graph out(raw);
  // The eager step's launches (no conditional handles to set), every chunk on `largest`, the one
  // body of the list.
  const Pipeline* const body[1] = {&largest};
  const std::vector<int> on_body(static_cast<std::size_t>(chunks), 0);
  capture_into(raw, stream, [&] { return record_step_eager(args, body, on_body, stream); });
  return out;
}

std::size_t flat_step_nodes(const Pipeline& largest, int chunks) noexcept {
  return 2 + static_cast<std::size_t>(chunks) * static_cast<std::size_t>(largest.kernel_launches());
}

}  // namespace spg::graphs
