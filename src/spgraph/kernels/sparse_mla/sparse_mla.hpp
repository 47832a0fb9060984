// Stage 4 of a chunk: sparse MLA attention (prefill) on tensor cores.
//
// Every query token attends to the kv rows its `indices` name; all heads of a token share those
// rows (one kv head, MQA form). Semantics, masking rules and accuracy bars: docs/pipeline.md,
// "Sparse attention semantics". Per-step values (topk_length, num_tokens) are read from device
// memory and the launch shape depends on static arguments only, so one captured launch serves
// every step of its bucket.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "spgraph/model/cache_format.hpp"

namespace spg::kernels {

/// Width of the value part of a kv row and of an output row: the head dim.
inline constexpr int kSparseMlaDv = model::kHeadDim;
/// Query heads one CTA (or one persistent-CTA item) owns; h_q = 128 runs two per token.
inline constexpr int kSparseMlaHeadsPerCta = 64;
/// kv rows streamed through shared memory per step; topk must be a multiple of it.
inline constexpr int kSparseMlaBlockRows = 64;

/// @brief How the top-k range of a token is covered, and by which kernel.
///
/// `automatic` picks the wgmma single pass, the wgmma kernel over slices of the top-k range, or
/// the single pass with the value columns split over two CTAs per item, where a cost model
/// predicts the slices and their merge (or the column halves) faster by more than 1 µs: with
/// items = s_q * (h_q / 64) and pairs = ceil(topk / 128) (64-row blocks run in pairs), each slicing
/// into ceil(pairs / n) pairs is priced as waves of CTAs (a fixed cost per call and per later-wave
/// CTA, a cost per block) plus, when split, the merge's fixed cost and its partials' bytes
/// (kernels/sparse_mla/split_cost.hpp; constants and fit: docs/benchmark_history.md, "Split
/// top-k"); the column halves are priced as a single pass of twice the CTAs at 0.9 of its cost per
/// block. On 132 SMs it splits e.g. s_q 16 at topk >= 384, splits the columns of h_q 64 s_q 34-66
/// at topk 640 and keeps h_q 128 s_q >= 64 whole at topk 1152. The choice depends on the static
/// arguments and the SM count only.
enum class SparseMlaPath : std::int32_t {
  automatic = 0,    ///< single_pass, or split_topk where the cost model prices the slices faster
  single_pass = 1,  ///< the wgmma single pass (sm_90 only): one item per (token, 64 heads)
  split_topk = 2,   ///< the wgmma kernel over slices of the top-k range (sm_90 only) + a merge kernel
  /// The mma.sync single pass: persistent CTAs, each walking (token, 64 heads) items over the
  /// whole top-k range. Runs on any device the build targets; kept to cross-check the wgmma
  /// kernel and as its performance baseline.
  single_pass_mma = 3,
  split_topk_mma = 4,  ///< the mma.sync kernel over top-k slices + the merge kernel (any device)
  /// The wgmma single pass with each item's 512 value columns split over two CTAs (sm_90 only):
  /// both compute the item's scores and softmax, each runs P V for 256 columns and writes them;
  /// no workspace, no merge. Twice the CTAs at about three quarters of the tensor work each: it
  /// pays where the single pass leaves SMs idle (fewer items than half the SMs' count).
  split_dv = 5,
};

/// @brief The kernel(s) a plan launches.
enum class SparseMlaKernel : std::int32_t {
  /// Warp-specialized sm_90a kernel, one CTA per (token, 64 heads): a producer warpgroup gathers
  /// kv rows with cp.async into mbarrier-guarded buffers, two consumer warpgroups run Q K^T and
  /// P V on wgmma, blocks in pairs.
  wgmma_single_pass = 0,
  mma_single_pass = 1,   ///< persistent mma.sync kernel, whole top-k range per item
  mma_split_topk = 2,    ///< mma.sync partial kernel over top-k slices + merge kernel
  wgmma_split_topk = 3,  ///< the wgmma kernel, one CTA per (token, 64 heads, slice) + merge kernel
  wgmma_split_dv = 4,    ///< the wgmma kernel, two CTAs per (token, 64 heads), 256 value columns each
};

/// @brief Short name of a kernel ("wgmma", "wgmma-split", "wgmma-split-dv", "mma", "mma-split"),
/// for logs and benchmark tables.
constexpr const char* sparse_mla_kernel_name(SparseMlaKernel k) noexcept {
  switch (k) {
    case SparseMlaKernel::wgmma_single_pass: return "wgmma";
    case SparseMlaKernel::wgmma_split_topk: return "wgmma-split";
    case SparseMlaKernel::wgmma_split_dv: return "wgmma-split-dv";
    case SparseMlaKernel::mma_single_pass: return "mma";
    case SparseMlaKernel::mma_split_topk: return "mma-split";
  }
  return "?";
}

/// @brief Arguments of one sparse MLA call. All pointers are device memory.
struct SparseMlaArgs {
  /// [s_q, h_q, d_qk]: heads d_qk elements apart within a token, tokens q_token_stride apart
  const __nv_bfloat16* q{nullptr};
  const __nv_bfloat16* kv{nullptr};  ///< [s_kv, 1, d_qk], row stride kv_row_stride elements
  std::int64_t kv_row_stride{0};     ///< elements, >= d_qk and a multiple of 8
  int s_kv{0};
  const std::int32_t* indices{nullptr};      ///< [s_q, 1, topk]
  int topk{0};                               ///< a multiple of 64
  const std::int32_t* topk_length{nullptr};  ///< [s_q] or nullptr (then every j < topk counts)
  const float* attn_sink{nullptr};           ///< [h_q] or nullptr; may hold +-inf
  /// Device scalar or nullptr: tokens at or past *num_tokens are empty rows
  /// (out 0, max_logits -inf, lse +inf).
  const std::int32_t* num_tokens{nullptr};
  int s_q{0};
  int h_q{0};   ///< 64 or 128
  int d_qk{0};  ///< 512 or 576; the first 512 values of a kv row are its value part
  float sm_scale{0.0f};
  /// [s_q, h_q, 512]: heads 512 elements apart within a token, tokens out_token_stride apart
  __nv_bfloat16* out{nullptr};
  float* max_logits{nullptr};   ///< [s_q, h_q]
  float* lse{nullptr};          ///< [s_q, h_q], natural log, sink not included
  /// Elements between consecutive tokens of q; 0 means contiguous (h_q * d_qk). Otherwise at
  /// least h_q * d_qk and a multiple of 8 (16 bytes: what cp.async and the TMA need).
  std::int64_t q_token_stride{0};
  /// Elements between consecutive tokens of out; 0 means contiguous (h_q * 512). Otherwise at
  /// least h_q * 512 and a multiple of 8. max_logits and lse stay contiguous [s_q, h_q].
  std::int64_t out_token_stride{0};
  /// Device scalar or null: the call is a chunk of a step. Token t's rows of q, out, max_logits
  /// and lse are then row *token_offset + t, and tokens at or past *num_tokens (which must be set)
  /// write nothing: their rows are other chunks'. Null: rows from 0, padded tokens written empty.
  const std::int32_t* token_offset{nullptr};
  /// Rows of out (tokens), the extent of its TMA descriptor; 0 means s_q. At least s_q.
  std::int64_t out_rows{0};
  SparseMlaPath path{SparseMlaPath::automatic};
  /// split_topk / split_topk_mma only: number of top-k slices; 0 lets the shape choose.
  int num_splits{0};
};

/// @brief The launch plan that the static arguments (and the device's SM count) select.
struct SparseMlaPlan {
  bool split{false};      ///< true: partial kernel + merge kernel
  int num_splits{1};      ///< top-k slices per (token, 64 heads)
  int dv_parts{1};        ///< CTAs per (token, 64 heads, slice): 2 for wgmma_split_dv, else 1
  int blocks_per_split{0};///< 64-row blocks per slice
  SparseMlaKernel kernel{SparseMlaKernel::wgmma_single_pass};  ///< what run() launches
};

/// @brief One sparse MLA call prepared for repeated launches (SparseMla::initialize): its plan, the
///        kernels' parameters with the workspace carved, out's TMA descriptor encoded and the grids
///        sized, for the device current at initialize(). Copies share one immutable preparation.
class SparseMlaLaunch {
 public:
  SparseMlaLaunch() = default;  ///< empty: run() launches nothing
  [[nodiscard]] bool empty() const noexcept { return prepared_ == nullptr; }
  /// The plan it launches (a default plan when empty).
  [[nodiscard]] const SparseMlaPlan& plan() const noexcept;
  /// Launches the prepared kernel(s) on `stream` and nothing else: no device query, no planning,
  /// no descriptor encoding, no allocation, no sync; safe under capture. Launch on the device that
  /// was current at initialize(), while the buffers of its arguments live. Returns
  /// cudaGetLastError() after the launches; cudaErrorInvalidValue without launching when empty.
  [[nodiscard]] cudaError_t run(cudaStream_t stream) const noexcept;

  struct Prepared;  // defined by the launcher (sparse_mla.cu)

 private:
  friend struct SparseMla;
  explicit SparseMlaLaunch(std::shared_ptr<const Prepared> prepared) noexcept : prepared_(std::move(prepared)) {}
  std::shared_ptr<const Prepared> prepared_;
};

/// The op, in CUTLASS's order: can_implement(args) -> workspace_bytes(args) -> initialize(args,
/// workspace) once -> SparseMlaLaunch::run(stream) per launch. run(args, workspace, stream) does
/// all of it in one call (plan, descriptor and launch on every call), for one-off launches.
struct SparseMla {
  /// @brief Checks the arguments against what the kernels implement. s_q = 0 is a call with no
  ///        work (run() launches nothing and returns cudaSuccess): its arrays may then be null
  ///        and s_kv 0; every other argument is checked as for any call.
  /// @throws InvalidArgument naming the first argument out of bounds: a null pointer, h_q not 64
  ///         or 128, d_qk not 512 or 576, topk not a positive multiple of 64, s_q < 0, s_kv < 1,
  ///         kv_row_stride < d_qk or not a multiple of 8, q_token_stride / out_token_stride
  ///         neither 0 nor at least the contiguous size (h_q * d_qk, h_q * 512) or not a multiple
  ///         of 8, any of the three strides at 2^40 bytes or more (the TMA bound on a tensor map's
  ///         strides), q/kv/out not 16-byte aligned, a
  ///         non-finite sm_scale, num_splits outside [0, topk / 64],
  ///         more than 2^31 - 1 output rows (s_q * h_q) or more than 2^31 - 1 work items.
  static void can_implement(const SparseMlaArgs& args);

  /// @brief The plan run() will launch for these arguments on the current device.
  /// @throws CudaError when the device cannot be queried.
  /// @throws InvalidArgument when the plan's kernel is a wgmma kernel and the current device is
  ///         not compute capability 9.0 (there is no silent fallback: choose single_pass_mma or
  ///         split_topk_mma explicitly there).
  static SparseMlaPlan plan(const SparseMlaArgs& args);

  /// @brief The plan for these arguments on a device of `sms` SMs: what plan() returns there,
  ///        computed on the host alone (no device query, no check of the device's capability).
  static SparseMlaPlan plan_for_sms(const SparseMlaArgs& args, int sms) noexcept;

  /// @brief Workspace run() needs: the split-top-k partials (fp32), 0 for the single passes.
  /// @throws CudaError, InvalidArgument as plan().
  static std::size_t workspace_bytes(const SparseMlaArgs& args);

  /// @brief Prepares the call for repeated launches: checks the arguments (can_implement), plans
  ///        on the current device (plan), carves `workspace` (workspace_bytes(args) bytes, 256-byte
  ///        aligned; may be null when that is 0), builds the kernels' parameters and grids, encodes
  ///        out's TMA descriptor (the wgmma single pass) and raises the kernel's shared-memory limit
  ///        on the device. The launch keeps the argument's pointers, not the arguments.
  /// @throws InvalidArgument as can_implement and plan, or for a null or misaligned workspace
  ///         where the plan needs one; CudaError when the device cannot be queried or configured,
  ///         the driver lacks cuTensorMapEncodeTiled or it rejects out's descriptor.
  static SparseMlaLaunch initialize(const SparseMlaArgs& args, void* workspace);

  /// @brief Launches the kernel(s) of plan(args) on `stream`; allocates, syncs and validates
  ///        nothing (call can_implement and plan first), so it can be captured. `workspace` must
  ///        hold workspace_bytes(args) bytes, 256-byte aligned. Returns cudaGetLastError() after
  ///        the launches, or without launching: cudaErrorInvalidDevice when the plan's kernel is
  ///        a wgmma kernel and the device is not compute capability 9.0, cudaErrorNotSupported
  ///        when the driver does not provide cuTensorMapEncodeTiled (the wgmma single pass writes
  ///        out with TMA stores), cudaErrorInvalidValue when it rejects out's tensor map.
  static cudaError_t run(const SparseMlaArgs& args, void* workspace, cudaStream_t stream) noexcept;
};

}  // namespace spg::kernels
