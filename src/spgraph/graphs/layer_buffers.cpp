// Layer buffers and the checks of the caller's bindings: see layer_buffers.hpp.
#include "spgraph/graphs/layer_buffers.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/kernels/alignment.hpp"

namespace spg::graphs {

using model::LayerConfig;
using model::PipelineConfig;

const char* layer_buffer_name(LayerBuffer b) noexcept {
  switch (b) {
    case LayerBuffer::q: return "q";
    case LayerBuffer::topk_indices: return "topk_indices";
    case LayerBuffer::k_rows: return "k_rows";
    case LayerBuffer::compressed_k_rows: return "compressed_k_rows";
    case LayerBuffer::swa_cache: return "swa_cache";
    case LayerBuffer::compressed_cache: return "compressed_cache";
    case LayerBuffer::attn_sink: return "attn_sink";
    case LayerBuffer::out: return "out";
    case LayerBuffer::lse: return "lse";
    case LayerBuffer::max_logits: return "max_logits";
  }
  return "?";
}

bool layer_uses(const LayerConfig& layer, LayerBuffer b, bool insert) noexcept {
  const bool compressed = layer.compress_ratio > 1;
  switch (b) {
    case LayerBuffer::topk_indices:
    case LayerBuffer::compressed_cache: return compressed;
    case LayerBuffer::k_rows: return insert;
    case LayerBuffer::compressed_k_rows: return insert && compressed;
    case LayerBuffer::attn_sink: return layer.attn_sink;
    default: return true;
  }
}

std::size_t required_rows(const PipelineConfig& config, const LayerConfig& layer, LayerBuffer b,
                          const StepBounds& step) noexcept {
  if (b == LayerBuffer::compressed_k_rows) {
    const int chunk = ChunkMetaLayout::compressed_slot_capacity(config, layer.compress_ratio);
    const int whole = step.tokens > 0 ? max_new_compressed_rows(step.tokens, step.requests, layer.compress_ratio) : 0;
    return static_cast<std::size_t>(std::max(chunk, whole));
  }
  return static_cast<std::size_t>(std::max(config.max_tokens, step.tokens));
}

kernels::CacheLayout required_cache(const PipelineConfig& config, const LayerConfig& layer, LayerBuffer b) {
  if (b == LayerBuffer::compressed_cache) {
    return kernels::CacheLayout::make(config.cache.block_tokens / layer.compress_ratio, config.cache.compressed_blocks);
  }
  return kernels::CacheLayout::make(config.cache.swa_block_size, config.cache.swa_blocks);
}

namespace {

/// A bound buffer's byte range and what a step does to it.
struct Range {
  std::size_t layer;
  LayerBuffer buffer;
  std::uintptr_t begin;
  std::uintptr_t end;
  enum Use { read, written, persistent } use;
};

std::string where(std::size_t layer, LayerBuffer b) {
  return "buffers[" + std::to_string(layer) + "]." + layer_buffer_name(b);
}

template <class T, class Extents>
std::string describe(const cuda::std::mdspan<T, Extents, cuda::std::layout_stride>& v) {
  std::ostringstream os;
  os << "extents [";
  for (std::size_t i = 0; i < v.rank(); ++i) os << (i ? ", " : "") << v.extent(i);
  os << "], strides [";
  for (std::size_t i = 0; i < v.rank(); ++i) os << (i ? ", " : "") << v.stride(i);
  os << ']';
  return os.str();
}


/// 128-bit sizes, for spans whose 64-bit arithmetic could wrap (a GCC/Clang extension).
__extension__ typedef unsigned __int128 WideSize;

/// Most bytes a bound buffer may span: far past any device's memory, far below where a span's
/// arithmetic (64-bit extents times strides) could wrap.
constexpr std::uint64_t kMaxSpanBytes = std::uint64_t{1} << 48;

/// The byte range of a bound buffer, from its exact size: refused when the size passes
/// kMaxSpanBytes or the range wraps the address space (a size computed in 64 bits could have
/// wrapped to a small one and escaped the overlap checks).
Range checked_range(const std::string& name, std::uintptr_t begin, WideSize bytes, std::size_t layer,
                    LayerBuffer b, Range::Use use) {
  SPG_EXPECTS(bytes <= kMaxSpanBytes && begin <= UINTPTR_MAX - static_cast<std::uintptr_t>(bytes),
              name << " spans " << (bytes <= kMaxSpanBytes ? std::to_string(static_cast<std::uint64_t>(bytes)) : std::string("more than 2^48"))
                   << " B from " << reinterpret_cast<const void*>(begin)
                   << ": a bound buffer must span at most 2^48 bytes and not wrap the address space");
  return Range{layer, b, begin, begin + static_cast<std::uintptr_t>(bytes), use};
}

/// A row-indexed buffer [rows, inner...]: at least `rows` rows of exactly `inner` (innermost
/// contiguous, the middle extents packed); the row stride `row_stride` exactly, or (0) any
/// multiple of 8 elements at least the row's size.
template <class T, std::size_t Rank>
void check_rows(const DeviceView<T, Rank>& v, const std::string& name, std::size_t rows,
                const std::array<std::size_t, Rank - 1>& inner, std::size_t row_stride, std::vector<Range>& ranges,
                std::size_t layer, LayerBuffer b, Range::Use use) {
  SPG_EXPECTS(kernels::aligned(v.data_handle(), 16),
              name << " = " << static_cast<const void*>(v.data_handle()) << " must be 16-byte aligned");
  SPG_EXPECTS(v.extent(0) >= rows, name << ": " << describe(v) << " has " << v.extent(0) << " rows; it needs at least "
                                        << rows << " (the config's largest bucket, or with steps the largest step)");
  std::size_t packed = 1;
  for (std::size_t i = Rank - 1; i >= 1; --i) {
    SPG_EXPECTS(v.extent(i) == inner[i - 1],
                name << ": " << describe(v) << ": extent " << i << " = " << v.extent(i) << " must be " << inner[i - 1]);
    SPG_EXPECTS(v.stride(i) == packed, name << ": " << describe(v) << ": stride " << i << " = " << v.stride(i)
                                            << " must be " << packed << " (contiguous within a row)");
    packed *= inner[i - 1];
  }
  if (row_stride != 0) {
    SPG_EXPECTS(v.stride(0) == row_stride,
                name << ": " << describe(v) << ": row stride " << v.stride(0) << " must be " << row_stride << " (contiguous)");
  } else {
    SPG_EXPECTS(v.stride(0) >= packed && v.stride(0) % 8 == 0 && v.stride(0) * sizeof(T) < (std::size_t{1} << 40),
                name << ": " << describe(v) << ": token stride " << v.stride(0) << " must be a multiple of 8 elements"
                     << " (16 bytes) of at least " << packed << ", below 2^40 bytes");
  }
  // The span in 128 bits (extents and strides are arbitrary 64-bit values); span_bytes(v), which
  // the kernels' bounds rest on, is then exact.
  WideSize span = 1;
  for (std::size_t i = 0; i < Rank; ++i) span += static_cast<WideSize>(v.extent(i) - 1) * v.stride(i);
  ranges.push_back(checked_range(name, reinterpret_cast<std::uintptr_t>(v.data_handle()), span * sizeof(T), layer, b, use));
}

void check_cache(const PagedCache& c, const kernels::CacheLayout& want, const std::string& name,
                 std::vector<Range>& ranges, std::size_t layer, LayerBuffer b) {
  SPG_EXPECTS(kernels::aligned(c.data, 16), name << ".data = " << static_cast<const void*>(c.data) << " must be 16-byte aligned");
  SPG_EXPECTS(c.layout.block_size == want.block_size,
              name << ".layout.block_size = " << c.layout.block_size << " must be " << want.block_size
                   << " (the config's rows per block)");
  SPG_EXPECTS(c.layout.num_blocks == want.num_blocks,
              name << ".layout.num_blocks = " << c.layout.num_blocks << " must be " << want.num_blocks
                   << " (the config's cache.swa_blocks / cache.compressed_blocks)");
  SPG_EXPECTS(c.layout.block_stride >= want.block_stride && c.layout.block_stride % kernels::kKvRowBytes == 0,
              name << ".layout.block_stride = " << c.layout.block_stride << " must be a multiple of "
                   << kernels::kKvRowBytes << " of at least " << want.block_stride);
  const WideSize bytes =
      static_cast<WideSize>(c.layout.num_blocks) * static_cast<std::uint64_t>(c.layout.block_stride);
  ranges.push_back(checked_range(name, reinterpret_cast<std::uintptr_t>(c.data), bytes, layer, b, Range::persistent));
}

/// Every bound buffer of every layer, checked for shape; the ranges they span.
std::vector<Range> check_shapes(const PipelineConfig& config, const std::vector<LayerBuffers>& buffers, bool insert,
                                const StepBounds& step) {
  std::vector<Range> ranges;
  SPG_EXPECTS(buffers.empty() || buffers.size() == config.layers.size(),
              "buffers holds " << buffers.size() << " entries; it must be empty or hold one per layer ("
                               << config.layers.size() << ")");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const LayerBuffers& b = buffers[i];
    const LayerConfig& l = config.layers[i];
    const auto h = static_cast<std::size_t>(l.h_q);
    auto rows = [&](LayerBuffer which) { return required_rows(config, l, which, step); };
    // A buffer is given when it has data or extents; given without data is a null binding.
    auto used = [&](LayerBuffer which, const void* data, bool has_extents) {
      const bool is_bound = data != nullptr;
      SPG_EXPECTS(is_bound || !has_extents,
                  where(i, which) << " has extents but its data pointer is null (leave it empty to have the pool "
                                     "plan it)");
      SPG_EXPECTS(!is_bound || layer_uses(l, which, insert),
                  where(i, which) << " is bound but layer " << i << " (" << l.label() << ") does not use it"
                                  << (which == LayerBuffer::k_rows || which == LayerBuffer::compressed_k_rows
                                          ? " (the executor records no insert stage)"
                                          : ""));
      return is_bound;
    };
    using B = LayerBuffer;
    if (used(B::q, b.q.data_handle(), b.q.size() != 0)) {
      check_rows<__nv_bfloat16, 3>(b.q, where(i, B::q), rows(B::q), {h, static_cast<std::size_t>(l.d_qk)}, 0, ranges,
                                   i, B::q, Range::read);
    }
    if (used(B::topk_indices, b.topk_indices.data_handle(), b.topk_indices.size() != 0)) {
      const auto k = static_cast<std::size_t>(l.top_k);
      check_rows<std::int32_t, 2>(b.topk_indices, where(i, B::topk_indices), rows(B::topk_indices), {k}, k, ranges, i,
                                  B::topk_indices, Range::read);
    }
    for (const B kb : {B::k_rows, B::compressed_k_rows}) {
      const DeviceView<__nv_bfloat16, 2>& v = kb == B::k_rows ? b.k_rows : b.compressed_k_rows;
      if (used(kb, v.data_handle(), v.size() != 0)) {
        check_rows<__nv_bfloat16, 2>(v, where(i, kb), rows(kb), {std::size_t{model::kHeadDim}}, model::kHeadDim,
                                     ranges, i, kb, Range::read);
      }
    }
    for (const B cb : {B::swa_cache, B::compressed_cache}) {
      const PagedCache& c = cb == B::swa_cache ? b.swa_cache : b.compressed_cache;
      if (used(cb, c.data, c.layout.num_blocks != 0)) check_cache(c, required_cache(config, l, cb), where(i, cb), ranges, i, cb);
    }
    if (used(B::attn_sink, b.attn_sink.data_handle(), b.attn_sink.size() != 0)) {
      const std::string name = where(i, B::attn_sink);
      SPG_EXPECTS(kernels::aligned(b.attn_sink.data_handle(), 16), name << " must be 16-byte aligned");
      SPG_EXPECTS(b.attn_sink.extent(0) == h && b.attn_sink.stride(0) == 1,
                  name << ": " << describe(b.attn_sink) << " must be [" << h << "] contiguous (h_q sinks)");
      ranges.push_back(checked_range(name, reinterpret_cast<std::uintptr_t>(b.attn_sink.data_handle()), h * 4, i,
                                     B::attn_sink, Range::read));
    }
    if (used(B::out, b.out.data_handle(), b.out.size() != 0)) {
      check_rows<__nv_bfloat16, 3>(b.out, where(i, B::out), rows(B::out), {h, static_cast<std::size_t>(l.d_v)}, 0,
                                   ranges, i, B::out, Range::written);
    }
    for (const B sb : {B::lse, B::max_logits}) {
      const DeviceView<float, 2>& v = sb == B::lse ? b.lse : b.max_logits;
      if (used(sb, v.data_handle(), v.size() != 0)) check_rows<float, 2>(v, where(i, sb), rows(sb), {h}, h, ranges, i, sb, Range::written);
    }
  }
  return ranges;
}

/// Whether layers a and b are ever run by one step: some program holds both (a layer and itself: always).
bool share_a_program(const std::vector<std::vector<int>>& programs, std::size_t a, std::size_t b) {
  if (a == b) return true;
  for (const auto& p : programs) {
    bool has_a = false;
    bool has_b = false;
    for (int l : p) {
      has_a |= static_cast<std::size_t>(l) == a;
      has_b |= static_cast<std::size_t>(l) == b;
    }
    if (has_a && has_b) return true;
  }
  return false;
}

void check_overlaps(const std::vector<Range>& ranges, const std::vector<std::vector<int>>& programs) {
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      const Range& a = ranges[i];
      const Range& b = ranges[j];
      if (a.begin >= b.end || b.begin >= a.end) continue;
      // Caches persist across steps, so they may share memory with nothing; a buffer a step
      // writes may not share it with any buffer of a layer the same step runs. Inputs may alias.
      const bool cache = a.use == Range::persistent || b.use == Range::persistent;
      const bool written = a.use == Range::written || b.use == Range::written;
      const bool hazard = cache || (written && share_a_program(programs, a.layer, b.layer));
      SPG_EXPECTS(!hazard, where(a.layer, a.buffer)
                               << " [" << reinterpret_cast<const void*>(a.begin) << ", +" << (a.end - a.begin)
                               << " B) overlaps " << where(b.layer, b.buffer) << " ["
                               << reinterpret_cast<const void*>(b.begin) << ", +" << (b.end - b.begin) << " B): "
                               << (cache ? "a cache must not share memory with any other buffer"
                                         : "a buffer a step writes must not share memory with another buffer of "
                                           "a layer the same program runs"));
    }
  }
}

/// cuMemGetAddressRange, taken from the driver through the runtime (spgraph does not link libcuda).
PFN_cuMemGetAddressRange_v3020 address_range_query() noexcept {
  static const PFN_cuMemGetAddressRange_v3020 query = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found);
    return status == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn)
               : nullptr;
  }();
  return query;
}

void check_resident(const Range& r, int device) {
  const std::string name = where(r.layer, r.buffer);
  for (const std::uintptr_t p : {r.begin, r.end - 1}) {
    cudaPointerAttributes attr{};
    const cudaError_t status = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(p));
    if (status == cudaErrorInvalidValue) (void)cudaGetLastError();
    SPG_EXPECTS(status == cudaSuccess && attr.type == cudaMemoryTypeDevice && attr.device == device,
                name << ": byte " << (p - r.begin) << " of its " << (r.end - r.begin) << " B at "
                     << reinterpret_cast<const void*>(p) << " is not device memory of device " << device
                     << " (cudaPointerGetAttributes: " << cudaGetErrorName(status) << ", type "
                     << static_cast<int>(attr.type) << "); bind memory from cudaMalloc or a framework's device allocator");
  }
  // Where the driver names the allocation, the whole span must lie inside it.
  if (const auto query = address_range_query(); query != nullptr) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    if (query(&base, &size, static_cast<CUdeviceptr>(r.begin)) == CUDA_SUCCESS) {
      SPG_EXPECTS(r.end <= base + size, name << " spans " << (r.end - r.begin) << " B from "
                                             << reinterpret_cast<const void*>(r.begin)
                                             << " but its allocation ends " << (base + size - r.begin)
                                             << " B after that address: the buffer is too small for its extents");
    }
  }
}

}  // namespace

void check_binding_shapes(const PipelineConfig& config, const std::vector<LayerBuffers>& buffers,
                          const std::vector<std::vector<int>>& programs, bool insert, const StepBounds& step) {
  check_overlaps(check_shapes(config, buffers, insert, step), programs);
}

void check_bindings(const PipelineConfig& config, const std::vector<LayerBuffers>& buffers,
                    const std::vector<std::vector<int>>& programs, bool insert, const StepBounds& step) {
  const std::vector<Range> ranges = check_shapes(config, buffers, insert, step);
  check_overlaps(ranges, programs);
  if (ranges.empty()) return;
  int device = 0;
  SPG_CUDA_TRY(cudaGetDevice(&device));
  for (const Range& r : ranges) check_resident(r, device);
}

}  // namespace spg::graphs
