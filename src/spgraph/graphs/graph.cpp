// Graph, GraphExec and CaptureGuard: see graph.hpp.
#include "spgraph/graphs/graph.hpp"

#include <atomic>
#include <cstdio>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"

namespace spg::graphs {

using core::detail::report_release_failure;

namespace {
std::atomic<std::uint64_t> g_instantiations{0};  // GraphExec::instantiate() calls that succeeded
}  // namespace

Graph::~Graph() {
  if (handle_ != nullptr) report_release_failure("graph", cudaGraphDestroy(handle_));
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    if (handle_ != nullptr) report_release_failure("graph", cudaGraphDestroy(handle_));
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

std::size_t Graph::node_count() const {
  std::size_t n = 0;
  SPG_CUDA_TRY(cudaGraphGetNodes(handle_, nullptr, &n));
  return n;
}

GraphExec GraphExec::instantiate(const Graph& graph, cudaStream_t stream, unsigned long long flags) {
  SPG_EXPECTS(static_cast<bool>(graph), "GraphExec::instantiate: the graph is empty");
  cudaGraphExec_t exec = nullptr;
  SPG_CUDA_TRY(cudaGraphInstantiate(&exec, graph.get(), flags));
  GraphExec owned(exec);
  g_instantiations.fetch_add(1, std::memory_order_relaxed);
  SPG_CUDA_TRY(cudaGraphUpload(exec, stream));
  return owned;
}

std::uint64_t GraphExec::instantiations() noexcept { return g_instantiations.load(std::memory_order_relaxed); }

GraphExec::~GraphExec() {
  if (handle_ != nullptr) report_release_failure("graph exec", cudaGraphExecDestroy(handle_));
}

GraphExec& GraphExec::operator=(GraphExec&& o) noexcept {
  if (this != &o) {
    if (handle_ != nullptr) report_release_failure("graph exec", cudaGraphExecDestroy(handle_));
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

CaptureGuard::CaptureGuard(cudaStream_t stream) : stream_(stream) {
  SPG_EXPECTS_AS(StateError, stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread,
                 "CaptureGuard: the default stream cannot be captured; record on a spg::core::Stream");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SPG_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
  SPG_EXPECTS_AS(StateError, status == cudaStreamCaptureStatusNone,
                 "CaptureGuard: the stream is already capturing (status " << static_cast<int>(status) << ")");
  SPG_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  active_ = true;
}

CaptureGuard::~CaptureGuard() {
  if (!active_) return;
  // Abandon the capture: end it (an invalidated capture ends with an error we expect) and drop
  // whatever graph came out, then clear the sticky last error so the next call starts clean.
  cudaGraph_t partial = nullptr;
  (void)cudaStreamEndCapture(stream_, &partial);
  if (partial != nullptr) (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();
}

Graph CaptureGuard::finish() {
  SPG_EXPECTS_AS(StateError, active_, "CaptureGuard::finish: called twice");
  active_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t status = cudaStreamEndCapture(stream_, &g);
  if (status != cudaSuccess) {
    if (g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    SPG_CUDA_TRY(status);
  }
  return Graph(g);
}

ConditionalNode add_conditional_node(cudaGraph_t graph, const cudaGraphNode_t* after, cudaGraphConditionalHandle handle,
                                     cudaGraphConditionalNodeType type, unsigned size) {
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = type;
  params.conditional.size = size;
  ConditionalNode c;
  SPG_CUDA_TRY(cudaGraphAddNode(&c.node, graph, after, nullptr, after != nullptr ? 1 : 0, &params));
  c.bodies = params.conditional.phGraph_out;
  return c;
}

}  // namespace spg::graphs
