// A chunk from Python as the executor's graphs::ChunkInput, read into storage sized once for the
// config, so Executor.run allocates nothing per call on the C++ side.
//
// A chunk is a scheduler plan (spgraph.ChunkPlan: spans into the plan, nothing converted) or any
// object (a spgraph.Chunk, a dict, a namedtuple) with per-request `query_lens` (or
// `query_start_loc`), `seq_lens`, `swa_block_table`, and optionally `compressed_block_tables`
// ({ratio: table}), `swa_slots` and `compressed_slots` ({ratio: slots}). Lengths are lists of
// ints or 1-D integer host arrays; a block table is a 2-D host array [>= requests, width] or a
// list of per-request lists/arrays. int32 arrays with contiguous rows are read in place; lists and
// int64 arrays are converted, and only the entries the encoder reads are (the window's SWA
// blocks, a request's compressed blocks): see graphs::ChunkEncoder::write. NumPy arrays are read
// through the buffer protocol, other host arrays (CPU tensors) through DLPack. docs/python.md,
// "The executor".
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/model/pipeline_config.hpp"
#include "spgraph/scheduler/chunk_plan.hpp"

namespace spg::python {

/// @brief A scheduler chunk as Python holds it (spgraph.ChunkPlan): the plan and whether a run
///        hands the executor its insert slot mappings (true) or lets the device derive them.
struct PlannedChunk {
  scheduler::ChunkPlan plan;
  bool slot_lists{false};
};

/// @brief A scheduler step as Python holds it (spgraph.StepPlan): its chunks as spgraph.ChunkPlan
///        objects (owning their plans), in the order they run.
struct PlannedStep {
  std::int64_t step{0};
  nanobind::list chunks;
  std::vector<std::int64_t> started;
  std::vector<std::int64_t> finished;
  int num_tokens{0};
};

/// @brief The caller's host arrays a read() took (through the buffer protocol or DLPack), held
///        until release(): the ChunkInput may point into them. Storage reserved once.
class HeldArrays {
 public:
  explicit HeldArrays(std::size_t capacity);
  ~HeldArrays() { release(); }
  HeldArrays(const HeldArrays&) = delete;
  HeldArrays& operator=(const HeldArrays&) = delete;
  /// A free Py_buffer slot for PyObject_GetBuffer (nullptr when every slot is taken).
  Py_buffer* slot() noexcept { return used_ < capacity_ ? &buffers_[used_] : nullptr; }
  /// The slot just filled by a successful PyObject_GetBuffer.
  void taken() noexcept { ++used_; }
  void keep(nanobind::ndarray<nanobind::ro>&& a) { arrays_.push_back(std::move(a)); }
  void release() noexcept;

 private:
  std::unique_ptr<Py_buffer[]> buffers_;
  std::size_t capacity_;
  std::size_t used_{0};
  std::vector<nanobind::ndarray<nanobind::ro>> arrays_;
};

class ChunkReader {
 public:
  /// A reader of chunks (up to config.max_requests requests).
  explicit ChunkReader(const model::PipelineConfig& config) : ChunkReader(config, config.max_requests, false) {}
  /// A reader of up to `max_requests` requests: of chunks, or with `step` of whole steps
  /// (read_step; messages then name "step.<field>").
  ChunkReader(const model::PipelineConfig& config, int max_requests, bool step);

  /// The chunk as a ChunkInput over this reader's storage, the plan's vectors or the caller's
  /// int32 arrays (held until the next read() or release()). A chunk of more than max_requests
  /// requests reads as max_requests + 1 unread requests (the encoder's no_bucket); a slot list
  /// longer than any chunk can need is cut one past that bound (still refused by the encoder).
  /// @throws nb::type_error / nb::value_error for a chunk that cannot be read (a missing field,
  ///         a non-integer, an entry past int32, device memory, query_lens and seq_lens of
  ///         different lengths, fewer block-table rows than requests).
  const graphs::ChunkInput& read(nanobind::handle chunk);
  /// A step (a step reader only): the same forms as read() takes, or a spgraph.StepPlan (its
  /// chunks' pieces merged back into requests, as scheduler::StepPlan::input() merges them), as
  /// the executor's StepInput over this reader's storage. A step carries no slot lists (the device
  /// derives the insert slots): swa_slots / compressed_slots are refused. A step of more than
  /// max_requests requests reads as max_requests + 1 unread requests (the split's "step.requests").
  /// @throws as read(), and nb::value_error for slot lists.
  const graphs::StepInput& read_step(nanobind::handle step);
  /// Drops the references to the caller's arrays.
  void release() noexcept { held_.release(); }

 private:
  void read_plan(const PlannedChunk& chunk);
  void read_planned_step(const PlannedStep& step);
  void read_table(nanobind::handle table, const char* what, int ratio, int requests);
  void read_slots(nanobind::handle slots, const char* what, int ratio, std::vector<std::int32_t>& storage,
                  std::span<const std::int32_t>& out);

  const char* what_;  // "chunk" or "step": the root of every field a message names
  bool step_;
  int max_requests_;
  int max_model_len_;
  int window_;
  int swa_block_size_;
  int block_tokens_;
  std::size_t swa_width_;         // SWA block ids a request can need
  std::size_t compressed_width_;  // compressed block ids a request can need (any ratio)
  std::vector<graphs::RequestInput> requests_;                 // max_requests + 1
  std::vector<std::int32_t> lens_[2];                          // query_lens, seq_lens: max_requests + 1
  std::vector<std::int32_t> swa_tables_;                       // max_requests x swa_width_
  std::vector<std::int32_t> compressed_tables_[graphs::kNumRatios];  // max_requests x compressed_width_
  std::vector<std::int32_t> swa_slots_;                        // max_tokens + 1
  std::vector<std::int32_t> compressed_slots_[graphs::kNumRatios];   // compressed_slot_capacity(r) + 1
  HeldArrays held_;                                            // arrays read (in place or not)
  graphs::ChunkInput input_;
  graphs::StepInput step_input_;
};

}  // namespace spg::python
