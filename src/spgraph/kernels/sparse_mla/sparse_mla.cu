// Host side of sparse MLA attention: argument checks, the path and kernel choice, and the
// launches of the wgmma or mma.sync kernel, single pass or over top-k slices + merge (see
// sparse_mla.hpp).
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"

#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "spgraph/core/device_info.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/kernels/alignment.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla_kernel.cuh"
#include "spgraph/kernels/sparse_mla/sparse_mla_wgmma_kernel.cuh"
#include "spgraph/kernels/sparse_mla/split_cost.hpp"

namespace spg::kernels {

namespace {

constexpr std::size_t kWorkspaceAlign = 256;


std::size_t round_up(std::size_t v, std::size_t a) noexcept { return (v + a - 1) / a * a; }

// The wgmma kernel is built for sm_90a only (wgmma, setmaxnreg).
bool runs_wgmma(const core::DeviceInfo& info) noexcept { return info.major == 9 && info.minor == 0; }

// Slices per (token, 64 heads) for split_topk / split_topk_mma with num_splits 0: enough items
// for one wave of one CTA per SM (the kernels' shared memory allows one), never more than `units`.
int filling_splits(std::int64_t items, int units, int sms) noexcept {
  if (items <= 0 || items >= sms) return 1;  // s_q = 0: no items, nothing to split
  return static_cast<int>(std::min<std::int64_t>(sms / items, units));
}

SparseMlaPlan make_plan(const SparseMlaArgs& a, int sms) noexcept {
  const int blocks = a.topk / kSparseMlaBlockRows;
  const int pairs = (blocks + 1) / 2;
  const std::int64_t items = std::int64_t{a.s_q} * (a.h_q / kSparseMlaHeadsPerCta);
  SparseMlaPlan plan;
  int per_split = blocks;  // 64-row blocks per slice
  switch (a.path) {
    case SparseMlaPath::single_pass:
      plan.kernel = SparseMlaKernel::wgmma_single_pass;
      break;
    case SparseMlaPath::single_pass_mma:
      plan.kernel = SparseMlaKernel::mma_single_pass;
      break;
    case SparseMlaPath::split_dv:
      plan.kernel = SparseMlaKernel::wgmma_split_dv;
      plan.dv_parts = 2;
      break;
    case SparseMlaPath::split_topk:
    case SparseMlaPath::split_topk_mma: {
      plan.split = true;
      plan.kernel = a.path == SparseMlaPath::split_topk ? SparseMlaKernel::wgmma_split_topk
                                                        : SparseMlaKernel::mma_split_topk;
      const int n = a.num_splits > 0 ? a.num_splits : std::max(2, filling_splits(items, blocks, sms));
      per_split = (blocks + n - 1) / n;
      break;
    }
    case SparseMlaPath::automatic:
    default: {
      // The wgmma kernel runs the blocks of an item in pairs, so slices hold whole pairs; how many
      // per slice is the cost model's choice (split_cost.hpp), and the column halves are priced
      // against it and the single pass.
      const int pairs_per_split = detail::automatic_pairs_per_slice(items, pairs, sms, a.d_qk);
      if (detail::automatic_split_dv(items, pairs, pairs_per_split, sms, a.d_qk)) {
        plan.kernel = SparseMlaKernel::wgmma_split_dv;
        plan.dv_parts = 2;
        break;
      }
      plan.split = pairs_per_split < pairs;
      plan.kernel = plan.split ? SparseMlaKernel::wgmma_split_topk : SparseMlaKernel::wgmma_single_pass;
      if (plan.split) per_split = 2 * pairs_per_split;
      break;
    }
  }
  plan.blocks_per_split = std::clamp(per_split, 1, std::max(blocks, 1));
  plan.num_splits = (blocks + plan.blocks_per_split - 1) / plan.blocks_per_split;
  return plan;
}

bool is_wgmma(SparseMlaKernel k) noexcept {
  return k == SparseMlaKernel::wgmma_single_pass || k == SparseMlaKernel::wgmma_split_topk ||
         k == SparseMlaKernel::wgmma_split_dv;
}

std::size_t partial_o_bytes(const SparseMlaArgs& a, const SparseMlaPlan& plan) noexcept {
  const std::size_t rows = static_cast<std::size_t>(a.s_q) * static_cast<std::size_t>(a.h_q);
  return round_up(rows * static_cast<std::size_t>(plan.num_splits) * kSparseMlaDv * sizeof(float), kWorkspaceAlign);
}

std::size_t plan_workspace(const SparseMlaArgs& a, const SparseMlaPlan& plan) noexcept {
  if (!plan.split) return 0;
  const std::size_t rows = static_cast<std::size_t>(a.s_q) * static_cast<std::size_t>(a.h_q);
  return partial_o_bytes(a, plan) +
         round_up(rows * static_cast<std::size_t>(plan.num_splits) * sizeof(float2), kWorkspaceAlign);
}

/// A launch of `grid` x `threads` with programmatic stream serialization: the kernel may start
/// before the stream's previous kernel completes, and waits for it (griddepcontrol.wait) before
/// it reads any input. `attribute` must outlive the launch call.
cudaLaunchConfig_t early_start_config(unsigned grid, int threads, int smem, cudaStream_t stream,
                                      cudaLaunchAttribute& attribute) noexcept {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<std::size_t>(smem);
  config.stream = stream;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// The wgmma or the mma.sync kernel (each runs single passes and split slices alike) for one d_qk,
// the wgmma one also with the value columns split (kSplitDv): its launch, and its shared-memory
// opt-in, made once per device.
template <int D, bool kWgmma, bool kSplitDv = false>
struct AttentionKernel {
  static_assert(kWgmma || !kSplitDv, "only the wgmma kernel splits the value columns");
  static constexpr int kSmem = kWgmma ? detail::WgmmaSmem<D>::kAlloc : detail::MlaSmem<D>::kBytes;

  static cudaError_t allow_smem(const core::DeviceInfo& info) noexcept {
    static std::atomic<std::uint64_t> smem_allowed{0};
    const void* kernel = kWgmma ? reinterpret_cast<const void*>(&detail::sparse_mla_wgmma_kernel<D, kSplitDv>)
                                : reinterpret_cast<const void*>(&detail::sparse_mla_kernel<D>);
    return core::allow_dynamic_smem_once(kernel, kSmem, info, smem_allowed);
  }

  static cudaError_t launch(const detail::SparseMlaParams& p, const CUtensorMap& out_map, unsigned grid,
                            cudaStream_t stream) noexcept {
    if constexpr (kWgmma) {
      // Programmatic dependent launch: the kernel reads no input before griddepcontrol.wait, so
      // its CTAs may be placed (and their barriers set up) while the previous kernel finishes.
      cudaLaunchAttribute attribute{};
      const cudaLaunchConfig_t config = early_start_config(grid, detail::kWgmmaThreads, kSmem, stream, attribute);
      const cudaError_t status = cudaLaunchKernelEx(&config, detail::sparse_mla_wgmma_kernel<D, kSplitDv>, p, out_map);
      if (status != cudaSuccess) return status;
    } else {
      detail::sparse_mla_kernel<D><<<grid, detail::kMlaThreads, kSmem, stream>>>(p);
    }
    return cudaGetLastError();
  }
};

/// cuTensorMapEncodeTiled, taken from the driver through the runtime once (spgraph does not link
/// libcuda); null where the driver does not provide it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() noexcept {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return status == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

/// A bf16 array [tokens][h_q heads][cols] (heads `cols` elements apart, tokens `token_stride`
/// apart) as a 3-D tensor {cols, h_q, tokens} for the wgmma kernel's TMA boxes of 64 columns of
/// 64 heads of one token, to or from 128B-swizzled panels: out's stores (cols 512), and under the
/// A/B switch SPGRAPH_WGMMA_Q_TMA q's loads (cols d_qk). Host-only work (no device call), so it
/// can run during capture.
cudaError_t encode_head_panels_map(CUtensorMap& map, const __nv_bfloat16* base, int cols, int h_q, std::int64_t tokens,
                                   std::int64_t token_stride) noexcept {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(h_q), static_cast<cuuint64_t>(tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * sizeof(__nv_bfloat16),
                                 static_cast<cuuint64_t>(token_stride) * sizeof(__nv_bfloat16)};
  const cuuint32_t box[3] = {64, 64, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(base), dims, strides,
                            box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/// TMA strides must stay below 2^40 bytes (cuTensorMapEncodeTiled).
constexpr std::int64_t kTmaStrideBytesLimit = std::int64_t{1} << 40;

/// A token stride as the kernels read it: 0 (contiguous) becomes the contiguous size.
std::int64_t resolved_stride(std::int64_t stride, std::int64_t contiguous) noexcept {
  return stride == 0 ? contiguous : stride;
}

/// Checks one token stride (q or out): 0, or at least the contiguous size, a multiple of 8
/// elements (16 bytes) and below the TMA bound.
void check_token_stride(const char* name, std::int64_t stride, std::int64_t contiguous) {
  if (stride == 0) return;
  SPG_EXPECTS(stride >= contiguous, name << " = " << stride << " must be 0 (contiguous) or at least " << contiguous
                                         << " (h_q times the row length)");
  SPG_EXPECTS(stride % 8 == 0, name << " = " << stride << " must be a multiple of 8 elements (16 bytes)");
  SPG_EXPECTS(stride < kTmaStrideBytesLimit / 2, name << " = " << stride << " elements must be below 2^39 (2^40 bytes, "
                                                      << "the TMA bound on a tensor map's strides)");
}

}  // namespace

void SparseMla::can_implement(const SparseMlaArgs& a) {
  // s_q = 0 is a call with no work (run() launches nothing): its arrays may be empty, so null.
  const bool empty = a.s_q == 0;
  SPG_EXPECTS(empty || a.q != nullptr, "q is null");
  SPG_EXPECTS(empty || a.kv != nullptr, "kv is null");
  SPG_EXPECTS(empty || a.indices != nullptr, "indices is null");
  SPG_EXPECTS(empty || a.out != nullptr, "out is null");
  SPG_EXPECTS(empty || a.max_logits != nullptr, "max_logits is null");
  SPG_EXPECTS(empty || a.lse != nullptr, "lse is null");
  SPG_EXPECTS(a.h_q == 64 || a.h_q == 128, "h_q = " << a.h_q << " must be 64 or 128");
  SPG_EXPECTS(a.d_qk == 512 || a.d_qk == 576, "d_qk = " << a.d_qk << " must be 512 or 576");
  SPG_EXPECTS(a.topk >= kSparseMlaBlockRows && a.topk % kSparseMlaBlockRows == 0,
              "topk = " << a.topk << " must be a positive multiple of " << kSparseMlaBlockRows);
  SPG_EXPECTS(a.s_q >= 0, "s_q = " << a.s_q << " must be at least 0");
  SPG_EXPECTS(a.s_kv >= (empty ? 0 : 1), "s_kv = " << a.s_kv << " must be at least " << (empty ? 0 : 1));
  SPG_EXPECTS(a.kv_row_stride >= a.d_qk && a.kv_row_stride % 8 == 0,
              "kv_row_stride = " << a.kv_row_stride << " must be >= d_qk = " << a.d_qk << " and a multiple of 8");
  SPG_EXPECTS(a.kv_row_stride < kTmaStrideBytesLimit / 2,
              "kv_row_stride = " << a.kv_row_stride
                                 << " elements must be below 2^39 (2^40 bytes, the TMA bound on a tensor map's strides)");
  check_token_stride("q_token_stride", a.q_token_stride, std::int64_t{a.h_q} * a.d_qk);
  check_token_stride("out_token_stride", a.out_token_stride, std::int64_t{a.h_q} * kSparseMlaDv);
  SPG_EXPECTS(aligned(a.q, 16), "q = " << static_cast<const void*>(a.q) << " must be 16-byte aligned");
  SPG_EXPECTS(aligned(a.kv, 16), "kv = " << static_cast<const void*>(a.kv) << " must be 16-byte aligned");
  SPG_EXPECTS(aligned(a.out, 16), "out = " << static_cast<const void*>(a.out) << " must be 16-byte aligned");
  SPG_EXPECTS(aligned(a.indices, 4), "indices must be 4-byte aligned");
  SPG_EXPECTS(aligned(a.max_logits, 4) && aligned(a.lse, 4), "max_logits and lse must be 4-byte aligned");
  SPG_EXPECTS(std::isfinite(a.sm_scale), "sm_scale = " << a.sm_scale << " must be finite");
  SPG_EXPECTS(a.token_offset == nullptr || (a.num_tokens != nullptr && aligned(a.token_offset, 4)),
              "token_offset must be 4-byte aligned, and num_tokens set with it (a chunk of a step)");
  SPG_EXPECTS(a.out_rows == 0 || (a.out_rows >= a.s_q && a.out_rows <= std::numeric_limits<std::int32_t>::max()),
              "out_rows = " << a.out_rows << " must be 0 (s_q) or in [s_q = " << a.s_q << ", 2^31 - 1]");
  SPG_EXPECTS(a.path == SparseMlaPath::automatic || a.path == SparseMlaPath::single_pass ||
                  a.path == SparseMlaPath::split_topk || a.path == SparseMlaPath::single_pass_mma ||
                  a.path == SparseMlaPath::split_topk_mma || a.path == SparseMlaPath::split_dv,
              "path = " << static_cast<int>(a.path) << " is not a SparseMlaPath");
  SPG_EXPECTS(a.num_splits >= 0 && a.num_splits <= a.topk / kSparseMlaBlockRows,
              "num_splits = " << a.num_splits << " must be in [0, topk / 64 = " << a.topk / kSparseMlaBlockRows << "]");
  const bool single = a.path == SparseMlaPath::single_pass || a.path == SparseMlaPath::single_pass_mma;
  // Work items (CTAs of the wgmma kernel) at most: the split-dv pass has two per (token, 64 heads).
  const std::int64_t max_splits = single ? 1 : std::max(2, a.topk / kSparseMlaBlockRows);
  const std::int64_t items = std::int64_t{a.s_q} * (a.h_q / kSparseMlaHeadsPerCta) * max_splits;
  SPG_EXPECTS(std::int64_t{a.s_q} * a.h_q <= std::numeric_limits<std::int32_t>::max(),
              "s_q = " << a.s_q << " with h_q = " << a.h_q << " makes more than 2^31 - 1 output rows");
  SPG_EXPECTS(items <= std::numeric_limits<std::int32_t>::max(),
              "s_q = " << a.s_q << " with h_q = " << a.h_q << " and up to " << max_splits
                       << " top-k slices (or two value-column halves) makes " << items
                       << " work items, more than 2^31 - 1");
}

SparseMlaPlan SparseMla::plan(const SparseMlaArgs& args) {
  core::DeviceInfo info;
  SPG_CUDA_TRY(core::current_device_info(info));
  const SparseMlaPlan plan = make_plan(args, info.sms);
  SPG_EXPECTS(!is_wgmma(plan.kernel) || runs_wgmma(info),
              "path = " << static_cast<int>(args.path) << " selects the " << sparse_mla_kernel_name(plan.kernel)
                        << " kernel, which needs a compute capability 9.0 device; this one is " << info.major << "."
                        << info.minor << " (choose path single_pass_mma or split_topk_mma)");
  return plan;
}

SparseMlaPlan SparseMla::plan_for_sms(const SparseMlaArgs& args, int sms) noexcept { return make_plan(args, sms); }

std::size_t SparseMla::workspace_bytes(const SparseMlaArgs& args) { return plan_workspace(args, plan(args)); }

/// Everything the launches of one call need, built once.
struct SparseMlaLaunch::Prepared {
  SparseMlaPlan plan;
  detail::SparseMlaParams params{};
  CUtensorMap out_map{};  // the single pass's TMA stores of out; the other kernels ignore it
  unsigned grid{0};
  detail::SparseMlaMergeParams merge{};
  unsigned merge_grid{0};
  cudaError_t (*allow_smem)(const core::DeviceInfo&) noexcept {nullptr};
  cudaError_t (*attention)(const detail::SparseMlaParams&, const CUtensorMap&, unsigned, cudaStream_t) noexcept {nullptr};
};

namespace {

/// Builds the launches of `a` on the device `info` describes (the plan, the kernels' parameters,
/// out's descriptor, the grids, the kernel); launches nothing. Returns what run() returns for an
/// impossible call: cudaErrorInvalidValue (workspace), cudaErrorInvalidDevice (a wgmma kernel off
/// compute capability 9.0), cudaErrorNotSupported / cudaErrorInvalidValue (out's descriptor).
cudaError_t prepare(const SparseMlaArgs& a, void* workspace, const core::DeviceInfo& info,
                    SparseMlaLaunch::Prepared& out) noexcept {
  const int sms = info.sms;
  const SparseMlaPlan plan = make_plan(a, sms);
  if (a.s_q == 0) {  // no tokens: nothing to launch (FlashMLA asserts here); grid 0 marks it
    out.plan = plan;
    return cudaSuccess;
  }
  if (plan.split && (workspace == nullptr || !aligned(workspace, kWorkspaceAlign))) return cudaErrorInvalidValue;
  if (is_wgmma(plan.kernel) && !runs_wgmma(info)) return cudaErrorInvalidDevice;
  out.plan = plan;

  detail::SparseMlaParams& p = out.params;
  p = detail::SparseMlaParams{};
  p.q = a.q;
  p.kv = a.kv;
  p.kv_row_stride = a.kv_row_stride;
  p.s_kv = a.s_kv;
  p.indices = a.indices;
  p.topk = a.topk;
  p.topk_length = a.topk_length;
  p.attn_sink = a.attn_sink;
  p.num_tokens = a.num_tokens;
  p.s_q = a.s_q;
  p.h_q = a.h_q;
  p.scale_log2 = a.sm_scale * detail::kLog2e;
  p.out = a.out;
  p.max_logits = a.max_logits;
  p.lse = a.lse;
  p.num_splits = plan.num_splits;
  p.blocks_per_split = plan.blocks_per_split;
  p.write_partials = plan.split;
  p.q_token_stride = resolved_stride(a.q_token_stride, std::int64_t{a.h_q} * a.d_qk);
  p.out_token_stride = resolved_stride(a.out_token_stride, std::int64_t{a.h_q} * kSparseMlaDv);
  p.token_offset = a.token_offset;
  out.out_map = CUtensorMap{};
  p.dv_parts = plan.dv_parts;
  // The whole of out (a step's rows too): a chunk of a step adds its row offset to the coordinate.
  const std::int64_t out_rows = a.out_rows == 0 ? a.s_q : a.out_rows;
  if (plan.kernel == SparseMlaKernel::wgmma_single_pass || plan.kernel == SparseMlaKernel::wgmma_split_dv) {
    const cudaError_t status = encode_head_panels_map(out.out_map, a.out, kSparseMlaDv, a.h_q, out_rows, p.out_token_stride);
    if (status != cudaSuccess) return status;
  }
#ifdef SPGRAPH_WGMMA_Q_TMA
  if (is_wgmma(plan.kernel)) {
    // A/B switch (issue 15 round 23): q's rows taken as out's (a step's q and out have the same).
    const cudaError_t status = encode_head_panels_map(p.q_map, a.q, a.d_qk, a.h_q, out_rows, p.q_token_stride);
    if (status != cudaSuccess) return status;
  }
#endif
  if (plan.split) {
    auto* base = static_cast<unsigned char*>(workspace);
    p.part_o = reinterpret_cast<float*>(base);
    p.part_ml = reinterpret_cast<float2*>(base + partial_o_bytes(a, plan));
  }
  // can_implement bounds the number of items by 2^31 - 1.
  const std::int64_t items = std::int64_t{a.s_q} * (a.h_q / kSparseMlaHeadsPerCta) * plan.num_splits * plan.dv_parts;
  p.num_items = static_cast<int>(items);
  // wgmma: one CTA per item on a 1-D grid (the designs measured against it: docs/benchmark_history.md).
  // One CTA fits an SM, so the CTA that takes an SM after this one is about `sms` items on: each CTA
  // prefetches that CTA's Q rows into L2. mma.sync: persistent CTAs, one per SM (the shared memory
  // admits one), each walking a stride of items.
  const bool wgmma = is_wgmma(plan.kernel);
  out.grid = static_cast<unsigned>(wgmma ? items : std::min<std::int64_t>(items, sms));
  p.q_prefetch_ahead = sms;  // a grid of at most `sms` CTAs has no next item: the kernel checks
  // Where the kv rows outgrow a share of L2, neither the next wave's Q rows nor 256 bytes a kv
  // miss go to L2 ahead of their use (issue 15 rounds 19 and 20).
  p.prefetch_q_rows = detail::kv_rows_fit_l2(a.s_kv, a.kv_row_stride, info.l2_bytes, detail::kQRowsPrefetchL2Share);
  p.kv_l2_prefetch = detail::kv_rows_fit_l2(a.s_kv, a.kv_row_stride, info.l2_bytes, detail::kKvL2PrefetchL2Share);
#ifdef SPGRAPH_WGMMA_KV_PERSIST
  {
    std::size_t set_aside = 0;
    if (const cudaError_t status = cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize); status != cudaSuccess)
      return status;
    // createpolicy.fractional takes a fraction in (0, 1]: with nothing set aside, 1 (evict-last
    // then acts as normal, as without the switch).
    const double kv_bytes = static_cast<double>(a.s_kv) * static_cast<double>(a.kv_row_stride) * 2.0;
    p.kv_persist_fraction =
        set_aside == 0 ? 1.0f : static_cast<float>(std::min(1.0, static_cast<double>(set_aside) / kv_bytes));
  }
#endif
#ifdef SPGRAPH_WGMMA_NO_Q_PREFETCH
  p.q_prefetch_ahead = 0;  // A/B switch (issue 15 round 11): no next-wave Q prefetch
#endif
#ifdef SPGRAPH_WGMMA_Q_ROWS_PREFETCH
  // A/B switch (issue 15 round 19): =1 (or bare) the Q rows prefetched at every s_kv, =0 at none
  p.prefetch_q_rows = SPGRAPH_WGMMA_Q_ROWS_PREFETCH != 0;
#endif
#ifdef SPGRAPH_WGMMA_KV_L2_PREFETCH
  // A/B switch (issue 15 round 20): =1 (or bare) the kv gathers' 256-byte prefetch at every s_kv, =0 at none
  p.kv_l2_prefetch = SPGRAPH_WGMMA_KV_L2_PREFETCH != 0;
#endif
  const auto pick = [&](auto wgmma_tag, auto split_dv_tag) {
    constexpr bool kWgmma = decltype(wgmma_tag)::value;
    constexpr bool kSplitDv = decltype(split_dv_tag)::value;
    if (a.d_qk == 512) {
      out.allow_smem = &AttentionKernel<512, kWgmma, kSplitDv>::allow_smem;
      out.attention = &AttentionKernel<512, kWgmma, kSplitDv>::launch;
    } else {
      out.allow_smem = &AttentionKernel<576, kWgmma, kSplitDv>::allow_smem;
      out.attention = &AttentionKernel<576, kWgmma, kSplitDv>::launch;
    }
  };
  if (plan.kernel == SparseMlaKernel::wgmma_split_dv) {
    pick(std::true_type{}, std::true_type{});
  } else if (wgmma) {
    pick(std::true_type{}, std::false_type{});
  } else {
    pick(std::false_type{}, std::false_type{});
  }

  detail::SparseMlaMergeParams& m = out.merge;
  m = detail::SparseMlaMergeParams{};
  out.merge_grid = 0;
  if (plan.split) {
    m.part_o = p.part_o;
    m.part_ml = p.part_ml;
    m.attn_sink = a.attn_sink;
    m.num_splits = plan.num_splits;
    m.s_q = a.s_q;
    m.h_q = a.h_q;
    m.out = a.out;
    m.out_token_stride = p.out_token_stride;
    m.max_logits = a.max_logits;
    m.lse = a.lse;
    m.token_offset = a.token_offset;
    m.num_tokens = a.num_tokens;
    constexpr int rows_per_cta = detail::kMlaMergeThreads / 32;
    const std::int64_t rows = std::int64_t{a.s_q} * a.h_q;
    out.merge_grid = static_cast<unsigned>((rows + rows_per_cta - 1) / rows_per_cta);
  }
  return cudaSuccess;
}

cudaError_t launch_prepared(const SparseMlaLaunch::Prepared& l, cudaStream_t stream) noexcept {
  if (l.grid == 0) return cudaSuccess;  // s_q = 0
  const cudaError_t status = l.attention(l.params, l.out_map, l.grid, stream);
  if (status != cudaSuccess || !l.plan.split) return status;
  // The merge waits for the partials (griddepcontrol.wait) before it reads them, so it may be
  // placed on the SMs the partial kernel leaves idle while that one runs.
  cudaLaunchAttribute attribute{};
  const cudaLaunchConfig_t config = early_start_config(l.merge_grid, detail::kMlaMergeThreads, 0, stream, attribute);
  const cudaError_t merge_status = cudaLaunchKernelEx(&config, detail::sparse_mla_merge_kernel, l.merge);
  if (merge_status != cudaSuccess) return merge_status;
  return cudaGetLastError();
}

}  // namespace

const SparseMlaPlan& SparseMlaLaunch::plan() const noexcept {
  static const SparseMlaPlan none{};
  return prepared_ != nullptr ? prepared_->plan : none;
}

cudaError_t SparseMlaLaunch::run(cudaStream_t stream) const noexcept {
  if (prepared_ == nullptr) return cudaErrorInvalidValue;
  return launch_prepared(*prepared_, stream);
}

SparseMlaLaunch SparseMla::initialize(const SparseMlaArgs& a, void* workspace) {
  can_implement(a);
  const SparseMlaPlan planned = plan(a);  // refuses a wgmma kernel off compute capability 9.0
  SPG_EXPECTS(!planned.split || (workspace != nullptr && aligned(workspace, kWorkspaceAlign)),
              "workspace = " << workspace << " must be non-null and " << kWorkspaceAlign << "-byte aligned, holding "
                             << plan_workspace(a, planned) << " bytes: the plan splits the top-k range into "
                             << planned.num_splits << " slices");
  core::DeviceInfo info;
  SPG_CUDA_TRY(core::current_device_info(info));
  std::shared_ptr<SparseMlaLaunch::Prepared> prepared(new SparseMlaLaunch::Prepared{});
  SPG_CUDA_TRY(prepare(a, workspace, info, *prepared));
  if (prepared->allow_smem != nullptr) SPG_CUDA_TRY(prepared->allow_smem(info));  // null: s_q = 0
  return SparseMlaLaunch(std::move(prepared));
}

cudaError_t SparseMla::run(const SparseMlaArgs& a, void* workspace, cudaStream_t stream) noexcept {
  if (a.s_q == 0) return cudaSuccess;  // no tokens: nothing to launch, not even the device query
  core::DeviceInfo info;
  cudaError_t status = core::current_device_info(info);
  if (status != cudaSuccess) return status;
  SparseMlaLaunch::Prepared prepared;
  status = prepare(a, workspace, info, prepared);
  if (status != cudaSuccess) return status;
  status = prepared.allow_smem(info);
  if (status != cudaSuccess) return status;
  return launch_prepared(prepared, stream);
}

#ifdef SPGRAPH_WGMMA_TIMELINE
cudaError_t read_wgmma_timeline(WgmmaTimelineRecord* dst, std::size_t count) noexcept {
  count = std::min<std::size_t>(count, kWgmmaTimelineCtas);
  return cudaMemcpyFromSymbol(dst, detail::g_wgmma_timeline, count * sizeof(WgmmaTimelineRecord));
}
cudaError_t clear_wgmma_timeline(cudaStream_t stream) noexcept {
  void* records = nullptr;
  const cudaError_t status = cudaGetSymbolAddress(&records, detail::g_wgmma_timeline);
  if (status != cudaSuccess) return status;
  return cudaMemsetAsync(records, 0, sizeof(detail::g_wgmma_timeline), stream);
}
#endif

}  // namespace spg::kernels
