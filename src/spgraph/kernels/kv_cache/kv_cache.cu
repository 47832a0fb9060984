// Host side of the FP8 paged cache ops: argument checks and the launches (see kv_cache.hpp).
#include "spgraph/kernels/kv_cache/kv_cache.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "spgraph/core/device_info.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/kernels/alignment.hpp"
#include "spgraph/kernels/kv_cache/kv_cache_kernel.cuh"

namespace spg::kernels {

namespace {


void check_stride(int block_size, std::int64_t stride, const char* name) {
  const std::int64_t least = CacheLayout::min_block_stride(block_size);
  SPG_EXPECTS(stride >= least && stride % kKvRowBytes == 0,
              name << ".block_stride = " << stride << " must be a multiple of " << kKvRowBytes
                   << " of at least round_up(block_size * 584, 576) = " << least);
}

void check_layout(const CacheLayout& l, const char* name) {
  SPG_EXPECTS(l.block_size >= 1, name << ".block_size = " << l.block_size << " must be at least 1");
  SPG_EXPECTS(l.num_blocks >= 1, name << ".num_blocks = " << l.num_blocks << " must be at least 1");
  check_stride(l.block_size, l.block_stride, name);
  SPG_EXPECTS(l.capacity() <= std::numeric_limits<std::int32_t>::max(),
              name << " holds " << l.capacity() << " rows; slots are int32, at most 2^31 - 1");
}

void check_cache(const std::uint8_t* cache, const char* name) {
  SPG_EXPECTS(cache != nullptr, name << " is null");
  SPG_EXPECTS(aligned(cache, 16), name << " = " << static_cast<const void*>(cache) << " must be 16-byte aligned");
}

void check_chunk(const ChunkArrays& c, bool needs_gather_lens) {
  // chunk.scalars may be null: a standalone call (KvGatherArgs).
  SPG_EXPECTS(c.seq_lens != nullptr, "chunk.seq_lens is null");
  SPG_EXPECTS(!needs_gather_lens || c.gather_lens != nullptr, "chunk.gather_lens is null");
}

detail::PagedSource source(const std::uint8_t* cache, const CacheLayout& l, const std::int32_t* table, int stride) noexcept {
  return detail::PagedSource{cache, table, l.block_stride, l.block_size, l.num_blocks, stride};
}

}  // namespace

CacheLayout CacheLayout::make(int block_size, int num_blocks) {
  SPG_EXPECTS(block_size >= 1, "block_size = " << block_size << " must be at least 1");
  SPG_EXPECTS(num_blocks >= 1, "num_blocks = " << num_blocks << " must be at least 1");
  return CacheLayout{block_size, num_blocks, CacheLayout::min_block_stride(block_size)};
}

CacheLayout CacheLayout::make(int block_size, int num_blocks, std::int64_t block_stride) {
  CacheLayout l = make(block_size, num_blocks);
  check_stride(block_size, block_stride, "layout");
  l.block_stride = block_stride;
  return l;
}

void KvInsert::can_implement(const KvInsertArgs& a) {
  // rows_bucket = 0 is a call with no work (run() launches nothing): rows and slots may be null.
  const bool empty = a.rows_bucket == 0;
  SPG_EXPECTS(empty || a.rows != nullptr, "rows is null");
  SPG_EXPECTS(aligned(a.rows, 16), "rows = " << static_cast<const void*>(a.rows) << " must be 16-byte aligned");
  SPG_EXPECTS(empty || a.slot_mapping != nullptr, "slot_mapping is null");
  SPG_EXPECTS(a.rows_bucket >= 0 && a.rows_bucket <= (1 << 24),
              "rows_bucket = " << a.rows_bucket << " must be in [0, 2^24]");
  check_layout(a.layout, "layout");
  check_cache(a.cache, "cache");
  SPG_EXPECTS(a.row_offset == nullptr || aligned(a.row_offset, 4), "row_offset must be 4-byte aligned");
  SPG_EXPECTS(a.row_offset == nullptr || empty || a.source_rows >= a.rows_bucket,
              "source_rows = " << a.source_rows << " must be at least rows_bucket = " << a.rows_bucket
                               << " (row_offset is set)");
  if (a.derive != nullptr) {
    SPG_EXPECTS(a.block_table != nullptr, "block_table is null (derive is set)");
    SPG_EXPECTS(a.block_table_stride >= 1, "block_table_stride = " << a.block_table_stride << " must be at least 1");
    SPG_EXPECTS(a.query_start_loc != nullptr && a.seq_lens != nullptr && a.num_requests != nullptr,
                "query_start_loc, seq_lens and num_requests must not be null (derive is set)");
    SPG_EXPECTS(a.requests_bucket >= 1 && a.requests_bucket <= kMaxRequestsBucket,
                "requests_bucket = " << a.requests_bucket << " must be in [1, " << kMaxRequestsBucket << "]");
    SPG_EXPECTS(a.compress_ratio == 1 || a.compress_ratio == 4 || a.compress_ratio == 128,
                "compress_ratio = " << a.compress_ratio << " must be 1, 4 or 128 (derive is set)");
  }
}

cudaError_t KvInsert::run(const KvInsertArgs& a, cudaStream_t stream) noexcept {
  if (a.rows_bucket == 0) return cudaSuccess;  // no rows: nothing to launch
  const detail::InsertParams p{a.rows,
                               a.slot_mapping,
                               a.num_rows,
                               a.rows_bucket,
                               a.row_offset,
                               a.source_rows,
                               a.cache,
                               a.layout.block_stride,
                               a.layout.block_size,
                               a.layout.num_blocks,
                               a.status,
                               a.derive,
                               a.compress_ratio,
                               a.block_table,
                               a.block_table_stride,
                               a.query_start_loc,
                               a.seq_lens,
                               a.num_requests,
                               a.requests_bucket};
  constexpr int rows_per_cta = detail::kInsertThreads / detail::kWarpSize;
  const int grid = (a.rows_bucket + rows_per_cta - 1) / rows_per_cta;
  detail::kv_insert_kernel<<<grid, detail::kInsertThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

void KvGather::can_implement(const KvGatherArgs& a) {
  const int r = a.compress_ratio;
  SPG_EXPECTS(r == 1 || r == 4 || r == 128, "compress_ratio = " << r << " must be 1, 4 or 128");
  SPG_EXPECTS(a.part == GatherPart::window || r > 1,
              "part = compressed/both with compress_ratio = 1: an SWA-only layer has no compressed cache");
  // requests_bucket = 0 is a call with no work (run() launches nothing): the per-request arrays
  // (block tables, lengths, kv) may be empty, so null; the caches are still checked.
  const bool empty = a.requests_bucket == 0;
  SPG_EXPECTS(a.requests_bucket >= 0 && a.requests_bucket <= kMaxRequestsBucket,
              "requests_bucket = " << a.requests_bucket << " must be in [0, " << kMaxRequestsBucket << "]");
  const int least_rows = empty ? 0 : 1;
  const std::int64_t most_rows = std::numeric_limits<std::int32_t>::max() / std::max(a.requests_bucket, 1);
  SPG_EXPECTS(a.max_rows_per_request >= least_rows && a.max_rows_per_request <= most_rows,
              "max_rows_per_request = " << a.max_rows_per_request << " must be in [" << least_rows
                                        << ", (2^31 - 1) / requests_bucket = " << most_rows << "]");
  check_layout(a.layout, "layout");
  check_cache(a.cache, "cache");
  SPG_EXPECTS(empty || a.block_table != nullptr, "block_table is null");
  SPG_EXPECTS(a.block_table_stride >= least_rows,
              "block_table_stride = " << a.block_table_stride << " must be at least " << least_rows);
  if (a.part == GatherPart::both) {
    check_layout(a.window_layout, "window_layout");
    check_cache(a.window_cache, "window_cache");
    SPG_EXPECTS(empty || a.window_block_table != nullptr, "window_block_table is null (part = both)");
    SPG_EXPECTS(a.window_block_table_stride >= least_rows, "window_block_table_stride = " << a.window_block_table_stride
                                                                 << " must be at least " << least_rows << " (part = both)");
  }
  if (!empty) check_chunk(a.chunk, a.part != GatherPart::compressed);
  SPG_EXPECTS(empty || a.kv != nullptr, "kv is null");
  SPG_EXPECTS(aligned(a.kv, 16), "kv = " << static_cast<const void*>(a.kv) << " must be 16-byte aligned");
  if (a.chunk.scalars == nullptr) {
    SPG_EXPECTS(a.window_offset >= 0 && a.window_offset <= a.max_rows_per_request,
                "window_offset = " << a.window_offset << " must be in [0, max_rows_per_request = "
                                   << a.max_rows_per_request << "]");
  }
}

cudaError_t KvGather::run(const KvGatherArgs& a, cudaStream_t stream) noexcept {
  if (a.requests_bucket == 0) return cudaSuccess;  // no requests: nothing to launch
  detail::GatherParams p{};
  // A single-part launch reads `cache` through both sources; only the part's rows are counted.
  p.compressed = source(a.cache, a.layout, a.block_table, a.block_table_stride);
  p.window = a.part == GatherPart::both
                 ? source(a.window_cache, a.window_layout, a.window_block_table, a.window_block_table_stride)
                 : p.compressed;
  p.chunk = a.chunk;
  p.compress_ratio = a.compress_ratio;
  p.requests_bucket = a.requests_bucket;
  p.max_rows = a.max_rows_per_request;
  p.with_compressed = a.part != GatherPart::window;
  p.with_window = a.part != GatherPart::compressed;
  p.kv = a.kv;
  p.status = a.status;
  p.window_offset = a.window_offset;

  core::DeviceInfo info;
  cudaError_t status = core::current_device_info(info);
  if (status != cudaSuccess) return status;
  const int sms = info.sms;
  // A persistent grid: the real row count is only known on the device, so size by the static
  // bound and the SM count, whichever needs fewer CTAs.
  constexpr std::int64_t rows_per_cta_pass = std::int64_t{detail::kGatherWarps} * detail::kGatherRowsInFlight;
  const std::int64_t bound = std::int64_t{a.requests_bucket} * a.max_rows_per_request;
  const std::int64_t grid =
      std::max<std::int64_t>(1, std::min<std::int64_t>(std::int64_t{sms} * detail::kGatherCtasPerSm,
                                                       (bound + rows_per_cta_pass - 1) / rows_per_cta_pass));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(detail::kGatherThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = a.overlap_prologue ? 1 : 0;
  status = cudaLaunchKernelEx(&config, detail::kv_gather_kernel, p);
  if (status != cudaSuccess) return status;
  return cudaGetLastError();
}

}  // namespace spg::kernels
