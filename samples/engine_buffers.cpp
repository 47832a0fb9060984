// See engine_buffers.hpp.
#include "samples/engine_buffers.hpp"

namespace spg::samples {

template <class T>
T* EngineBuffers::allocate(std::size_t elems) {
  owned_.emplace_back(elems * sizeof(T));
  bytes_ += elems * sizeof(T);
  return static_cast<T*>(owned_.back().data());
}

EngineBuffers::EngineBuffers(const model::PipelineConfig& config, bool insert, const graphs::StepBounds& step) {
  using graphs::LayerBuffer;
  for (const model::LayerConfig& l : config.layers) {
    const std::size_t T = graphs::required_rows(config, l, LayerBuffer::q, step);  // a chunk's or a step's tokens
    graphs::LayerBuffers b;
    const auto h = static_cast<std::size_t>(l.h_q);
    const auto d = static_cast<std::size_t>(l.d_qk);
    b.q = graphs::contiguous_view<__nv_bfloat16, 3>(allocate<__nv_bfloat16>(T * h * d), {T, h, d});
    if (graphs::layer_uses(l, LayerBuffer::topk_indices, insert)) {
      const auto k = static_cast<std::size_t>(l.top_k);
      b.topk_indices = graphs::contiguous_view<std::int32_t, 2>(allocate<std::int32_t>(T * k), {T, k});
    }
    for (const LayerBuffer kb : {LayerBuffer::k_rows, LayerBuffer::compressed_k_rows}) {
      if (!graphs::layer_uses(l, kb, insert)) continue;
      const std::size_t rows = graphs::required_rows(config, l, kb, step);
      auto v = graphs::contiguous_view<__nv_bfloat16, 2>(allocate<__nv_bfloat16>(rows * 512), {rows, std::size_t{512}});
      (kb == LayerBuffer::k_rows ? b.k_rows : b.compressed_k_rows) = v;
    }
    for (const LayerBuffer cb : {LayerBuffer::swa_cache, LayerBuffer::compressed_cache}) {
      if (!graphs::layer_uses(l, cb, insert)) continue;
      graphs::PagedCache& c = cb == LayerBuffer::swa_cache ? b.swa_cache : b.compressed_cache;
      c.layout = graphs::required_cache(config, l, cb);
      c.data = allocate<std::uint8_t>(c.layout.bytes());
    }
    if (l.attn_sink) b.attn_sink = graphs::contiguous_view<float, 1>(allocate<float>(h), {h});
    b.out = graphs::contiguous_view<__nv_bfloat16, 3>(allocate<__nv_bfloat16>(T * h * 512), {T, h, std::size_t{512}});
    b.lse = graphs::contiguous_view<float, 2>(allocate<float>(T * h), {T, h});
    b.max_logits = graphs::contiguous_view<float, 2>(allocate<float>(T * h), {T, h});
    bindings_.push_back(b);
  }
}

}  // namespace spg::samples
