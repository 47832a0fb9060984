// The buffers of one layer of the pipeline, as typed views over device memory: what an engine
// binds (its own caches and tensors) and what the executor hands back for every buffer, bound or
// planned in its pool. docs/memory.md, "Engine-owned buffers", states the contract.
#pragma once

#include <cuda_bf16.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cuda/std/array>
#include <cuda/std/mdspan>
#include <vector>

#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::graphs {

/// @brief A strided view of device memory (elements, any strides): a bound buffer or a pool slot.
///        A default-constructed view (null data) is "unbound".
template <class T, std::size_t Rank>
using DeviceView = cuda::std::mdspan<T, cuda::std::dextents<std::size_t, Rank>, cuda::std::layout_stride>;

/// @brief A view with explicit strides (in elements): strided_view(q, {T, h, d}, {stride, d, 1}).
template <class T, std::size_t Rank>
[[nodiscard]] DeviceView<T, Rank> strided_view(T* data, const std::array<std::size_t, Rank>& extents,
                                               const std::array<std::size_t, Rank>& strides) {
  cuda::std::array<std::size_t, Rank> e{};
  cuda::std::array<std::size_t, Rank> s{};
  for (std::size_t i = 0; i < Rank; ++i) {
    e[i] = extents[i];
    s[i] = strides[i];
  }
  using Mapping = typename cuda::std::layout_stride::template mapping<cuda::std::dextents<std::size_t, Rank>>;
  return DeviceView<T, Rank>(data, Mapping(cuda::std::dextents<std::size_t, Rank>(e), s));
}

/// @brief A row-major view: the last extent is contiguous.
template <class T, std::size_t Rank>
[[nodiscard]] DeviceView<T, Rank> contiguous_view(T* data, const std::array<std::size_t, Rank>& extents) {
  std::array<std::size_t, Rank> strides{};
  std::size_t s = 1;
  for (std::size_t i = Rank; i-- > 0;) {
    strides[i] = s;
    s *= extents[i];
  }
  return strided_view<T, Rank>(data, extents, strides);
}

/// @brief Bytes a view spans from its data pointer (0 for an empty view).
template <class T, class Extents>
[[nodiscard]] std::size_t span_bytes(const cuda::std::mdspan<T, Extents, cuda::std::layout_stride>& v) noexcept {
  return v.mapping().required_span_size() * sizeof(T);
}

/// @brief A paged V4 FP8 cache in device memory: `layout.num_blocks` blocks of `layout.block_size`
///        rows, `layout.block_stride` bytes apart (a multiple of 576, at least the rows' data and
///        scale rows; docs/pipeline.md, "FP8 paged KV cache"). Null data: unbound.
struct PagedCache {
  std::uint8_t* data{nullptr};
  kernels::CacheLayout layout{};
  [[nodiscard]] std::size_t bytes() const noexcept { return layout.bytes(); }
};

/// @brief Every buffer the pipeline reads or writes for one layer (T = max_tokens, R = max_requests).
///
/// As a binding (ExecutorOptions::buffers), a member with data is the caller's, used in place for
/// the executor's whole life (its address must stay valid and fixed, as for any captured graph);
/// a member left empty is planned in the executor's pool. As returned by Executor::layer(), every
/// buffer the layer uses has data. Rows may exceed T; a chunk run alone uses its first T_bucket,
/// a step's chunk its own rows of the step's (required_rows: with steps the buffers hold a step).
struct LayerBuffers {
  DeviceView<__nv_bfloat16, 3> q;                  ///< [>= T, h_q, d_qk]; token stride >= h_q * d_qk, a multiple of 8
  DeviceView<std::int32_t, 2> topk_indices;        ///< [>= T, top_k], contiguous (r > 1)
  DeviceView<__nv_bfloat16, 2> k_rows;             ///< [>= T, 512], contiguous (insert stage)
  DeviceView<__nv_bfloat16, 2> compressed_k_rows;  ///< [>= T / r + R, 512], contiguous (insert stage, r > 1)
  PagedCache swa_cache;                            ///< the layer's SWA cache
  PagedCache compressed_cache;                     ///< the layer's compressed cache (r > 1)
  DeviceView<float, 1> attn_sink;                  ///< [h_q] (layers with a sink)
  DeviceView<__nv_bfloat16, 3> out;                ///< [>= T, h_q, 512]; token stride >= h_q * 512, a multiple of 8
  DeviceView<float, 2> lse;                        ///< [>= T, h_q], contiguous
  DeviceView<float, 2> max_logits;                 ///< [>= T, h_q], contiguous
};

/// @brief The buffers of a layer, by name (the binding's messages and the pool's slots use these).
enum class LayerBuffer { q, topk_indices, k_rows, compressed_k_rows, swa_cache, compressed_cache, attn_sink, out, lse, max_logits };
inline constexpr LayerBuffer kLayerBuffers[] = {LayerBuffer::q,          LayerBuffer::topk_indices,
                                                LayerBuffer::k_rows,     LayerBuffer::compressed_k_rows,
                                                LayerBuffer::swa_cache,  LayerBuffer::compressed_cache,
                                                LayerBuffer::attn_sink,  LayerBuffer::out,
                                                LayerBuffer::lse,        LayerBuffer::max_logits};
[[nodiscard]] const char* layer_buffer_name(LayerBuffer b) noexcept;
/// Whether the layer has buffer `b`: topk and the compressed buffers need r > 1, the sink
/// attn_sink, the K rows the insert stage.
[[nodiscard]] bool layer_uses(const model::LayerConfig& layer, LayerBuffer b, bool insert) noexcept;
/// @brief The largest step run(StepInput) takes (ExecutorOptions::max_step_requests Q and
///        max_step_tokens S): a step's chunks read and write their rows of step-sized buffers, so
///        the row-indexed buffers hold a whole step too. {0, 0}: no steps.
struct StepBounds {
  int requests{0};
  int tokens{0};
};
/// Rows of a row-indexed buffer: max(T, S) for the per-token buffers, max(T / r + R, S / r + Q)
/// for compressed_k_rows (the most rows a chunk, or a step, completes).
[[nodiscard]] std::size_t required_rows(const model::PipelineConfig& config, const model::LayerConfig& layer,
                                        LayerBuffer b, const StepBounds& step = {}) noexcept;
/// The cache a layer needs: (swa_block_size, swa_blocks) or (block_tokens / r, compressed_blocks),
/// at the smallest block stride.
[[nodiscard]] kernels::CacheLayout required_cache(const model::PipelineConfig& config,
                                                  const model::LayerConfig& layer, LayerBuffer b);

/// @brief Whether a view or cache has data (a binding's "bound").
template <class T, class Extents>
[[nodiscard]] bool bound(const cuda::std::mdspan<T, Extents, cuda::std::layout_stride>& v) noexcept {
  return v.data_handle() != nullptr;
}
[[nodiscard]] inline bool bound(const PagedCache& c) noexcept { return c.data != nullptr; }

/// @brief Checks the caller's bindings against the config before anything is allocated: one
///        LayerBuffers per layer (or none), each bound buffer non-null, 16-byte aligned, of the
///        config's extents and the kernels' strides, used by its layer, not overlapping another
///        bound buffer where that is a hazard (a cache with any other buffer; a buffer a step
///        writes with any other of a layer in the same program), and device memory of the
///        current device covering its whole span. The host-only checks all run before the first
///        CUDA call.
/// @throws InvalidArgument naming the layer, the buffer, what it got and what it needs; CudaError
///         when the device cannot be asked.
void check_bindings(const model::PipelineConfig& config, const std::vector<LayerBuffers>& buffers,
                    const std::vector<std::vector<int>>& programs, bool insert, const StepBounds& step = {});

/// @brief The same host-only checks, without the device-residency one (for planning tools and tests).
void check_binding_shapes(const model::PipelineConfig& config, const std::vector<LayerBuffers>& buffers,
                          const std::vector<std::vector<int>>& programs, bool insert, const StepBounds& step = {});

/// @brief The workspaces every layer of a step shares (pool slots), as typed views.
struct StepWorkspace {
  DeviceView<__nv_bfloat16, 3> kv;              ///< [R, M_max, 512]: the gathered rows, request b at row b * M
  DeviceView<std::int32_t, 2> combined_indices; ///< [T, max combined width]: the attention's index rows
  DeviceView<std::int32_t, 1> combined_lens;    ///< [T]: the attention's per-token lengths (top-k + window)
};

}  // namespace spg::graphs
