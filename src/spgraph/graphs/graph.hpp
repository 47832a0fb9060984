// RAII for CUDA graphs: a captured Graph, its instantiated GraphExec, and the CaptureGuard that
// never leaves a stream stuck in capture mode.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

namespace spg::graphs {

/// @brief Owns a cudaGraph_t (the captured, not yet instantiated, graph).
class Graph {
 public:
  Graph() = default;
  explicit Graph(cudaGraph_t g) noexcept : handle_(g) {}
  ~Graph();
  Graph(Graph&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  [[nodiscard]] cudaGraph_t get() const noexcept { return handle_; }
  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != nullptr; }
  /// Number of nodes (kernels, copies, memsets) in the graph.
  [[nodiscard]] std::size_t node_count() const;

 private:
  cudaGraph_t handle_{nullptr};
};

/// @brief Owns a cudaGraphExec_t; only made by instantiating a Graph.
class GraphExec {
 public:
  GraphExec() = default;
  /// Instantiates and uploads `graph` to `stream` so that the first launch pays no upload.
  /// `flags`: cudaGraphInstantiateFlag* (0 for a graph the host launches).
  /// @throws CudaError when instantiation or upload fails.
  static GraphExec instantiate(const Graph& graph, cudaStream_t stream, unsigned long long flags = 0);
  /// Graphs instantiate() has instantiated in this process so far: what shows that a replay path
  /// captures and instantiates nothing (it stays unchanged across run() calls after warm-up).
  [[nodiscard]] static std::uint64_t instantiations() noexcept;
  ~GraphExec();
  GraphExec(GraphExec&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;

  [[nodiscard]] cudaGraphExec_t get() const noexcept { return handle_; }
  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != nullptr; }
  /// The replay path: one launch, no checks beyond the returned status.
  [[nodiscard]] cudaError_t launch(cudaStream_t stream) const noexcept { return cudaGraphLaunch(handle_, stream); }

 private:
  explicit GraphExec(cudaGraphExec_t e) noexcept : handle_(e) {}
  cudaGraphExec_t handle_{nullptr};
};

/// @brief A conditional node added to a graph, and its body graphs (owned by the node).
struct ConditionalNode {
  cudaGraphNode_t node{nullptr};
  cudaGraph_t* bodies{nullptr};  ///< `size` of them (one for IF / WHILE, one per branch for SWITCH)
};

/// Adds a conditional node of `type` over `handle` (created on `graph` or a graph above it) to
/// `graph`, after `after` (first in the graph when null). @throws CudaError.
[[nodiscard]] ConditionalNode add_conditional_node(cudaGraph_t graph, const cudaGraphNode_t* after,
                                                   cudaGraphConditionalHandle handle,
                                                   cudaGraphConditionalNodeType type, unsigned size);

/// @brief Begins a thread-local capture on a stream and ends it on every exit path.
///
/// `finish()` ends the capture and returns the graph; if the guard is destroyed first (an
/// exception, an early return) it ends the capture and discards the half-made graph, so the
/// stream is usable again.
class CaptureGuard {
 public:
  /// @throws StateError for the legacy default stream (it cannot be captured) or a stream
  ///         already capturing; CudaError when the capture cannot begin.
  explicit CaptureGuard(cudaStream_t stream);
  ~CaptureGuard();
  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;

  /// Ends the capture. @throws CudaError if anything recorded during the capture failed.
  [[nodiscard]] Graph finish();

 private:
  cudaStream_t stream_;
  bool active_{false};
};

}  // namespace spg::graphs
