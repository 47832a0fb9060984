// Device code of the FP8 paged cache ops: the insert (quantize) and gather (dequantize) kernels.
//
// Both map one warp to one 512-value row so that every lane owns 32 bytes of the bf16 row:
// lanes 0-27 hold 16 NoPE values (16 e4m3 bytes, a quarter of a 64-value tile), lanes 28-31 hold
// 16 RoPE values (32 bf16 bytes). Every global access is 16 bytes wide and a warp's accesses to a
// row are contiguous. Format: docs/pipeline.md, "FP8 paged KV cache".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "spgraph/kernels/chunk.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::kernels::detail {

inline constexpr int kWarpSize = 32;
inline constexpr int kNopeLanes = kKvNopeDim / 16;  // 28 lanes of 16 e4m3 values
inline constexpr int kInsertThreads = 256;
inline constexpr int kGatherThreads = 256;  // >= kMaxRequestsBucket: one thread per request in the prologue
inline constexpr int kGatherWarps = kGatherThreads / kWarpSize;
static_assert(kGatherThreads >= kMaxRequestsBucket);
// 72 registers a thread; on the H200 3 CTAs an SM ran 1-2% faster than 4 (at 64 registers).
inline constexpr int kGatherCtasPerSm = 3;
/// Rows a warp loads before it converts the first: enough bytes in flight to cover DRAM latency.
inline constexpr int kGatherRowsInFlight = 4;

/// One paged cache as the gather kernel reads it.
struct PagedSource {
  const std::uint8_t* cache;
  const std::int32_t* block_table;
  std::int64_t block_stride;
  int block_size;
  int num_blocks;
  int block_table_stride;
};

struct InsertParams {
  const __nv_bfloat16* rows;
  const std::int32_t* slot_mapping;
  const std::int32_t* num_rows;
  int rows_bucket;
  const std::int32_t* row_offset;  // null: 0
  std::int64_t source_rows;
  std::uint8_t* cache;
  std::int64_t block_stride;
  int block_size;
  int num_blocks;
  StepStatus* status;
  // Derived slots (KvInsertArgs): derive null means slot_mapping always.
  const std::int32_t* derive;
  int compress_ratio;
  const std::int32_t* block_table;
  int block_table_stride;
  const std::int32_t* query_start_loc;
  const std::int32_t* seq_lens;
  const std::int32_t* num_requests;
  int requests_bucket;
};

struct GatherParams {
  PagedSource compressed;
  PagedSource window;
  ChunkArrays chunk;
  int compress_ratio;
  int requests_bucket;
  std::int64_t max_rows;
  bool with_compressed;
  bool with_window;
  __nv_bfloat16* kv;
  StepStatus* status;
  int window_offset;  // N of a standalone call (chunk.scalars null)
};

/// Programmatic dependent launch (no-ops for a kernel launched without it): let the stream's next
/// kernel be scheduled as this grid's CTAs retire; wait until the previous kernel has completed
/// and its writes are visible.
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  std::uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/// The two bf16 values of a word, exactly, as floats (bf16 is the top half of a float).
__device__ __forceinline__ float bf16_lo(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(std::uint32_t w) { return __uint_as_float(w & 0xFFFF0000U); }

/// The UE8M0 exponent of a tile: the smallest e with amax <= 448 * 2^e, i.e. ceil(log2(amax / 448))
/// computed exactly from amax's bits (448 = 1.75 * 2^8, so compare the significand with 1.75).
__device__ __forceinline__ int tile_exponent(float amax) {
  const std::uint32_t bits = __float_as_uint(amax);
  const int biased = static_cast<int>(bits >> 23);
  const std::uint32_t significand = bits & 0x7FFFFFU;
  return biased - 127 - 8 + (significand > 0x600000U ? 1 : 0);
}

/// Quantizes 16 bf16 values (8 words) with the tile's exponent into 16 e4m3 bytes.
__device__ __forceinline__ uint4 quantize16(uint4 v0, uint4 v1, float inv_scale) {
  const std::uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  std::uint32_t out[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // x / 2^e is exact (a power-of-two scale); satfinite then clamps to +-448 as the spec's clamp.
    const __nv_fp8x2_storage_t qa = __nv_cvt_float2_to_fp8x2(
        make_float2(bf16_lo(w[2 * k]) * inv_scale, bf16_hi(w[2 * k]) * inv_scale), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t qb = __nv_cvt_float2_to_fp8x2(
        make_float2(bf16_lo(w[2 * k + 1]) * inv_scale, bf16_hi(w[2 * k + 1]) * inv_scale), __NV_SATFINITE,
        __NV_E4M3);
    out[k] = static_cast<std::uint32_t>(qa) | (static_cast<std::uint32_t>(qb) << 16);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

/// Derived slots: the slot of insert row `row` from the block table (KvInsertArgs), or -1 after
/// counting why it is skipped. Request b owns rows [s_start[b], s_start[b + 1]); its first row is
/// cache row s_first[b]; s_ok[b] is false when its rows run past the table's width.
__device__ __forceinline__ int derive_slot(const InsertParams& p, int row, int num_requests, const int* s_start,
                                           const int* s_first, const bool* s_ok, bool lane0) {
  if (row >= s_start[num_requests]) return -1;  // past the rows the lengths account for
  int lo = 0;
  int hi = num_requests;
  while (hi - lo > 1) {  // the last request whose first row is <= row
    const int mid = (lo + hi) / 2;
    if (s_start[mid] <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int b = lo;
  if (!s_ok[b]) {
    if (lane0 && row == s_start[b]) record_fault(p.status, Fault::seq_len, 1, b, s_first[b], row);
    return -1;
  }
  const int pos = s_first[b] + (row - s_start[b]);
  const int block = __ldg(p.block_table + std::int64_t{b} * p.block_table_stride + pos / p.block_size);
  if (block < 0 || block >= p.num_blocks) {
    if (lane0) record_fault(p.status, Fault::block_id, 1, b, pos, block);
    return -1;
  }
  return static_cast<int>(block_slot(block, p.block_size, pos));
}

__global__ void __launch_bounds__(kInsertThreads) kv_insert_kernel(InsertParams p) {
  allow_dependent_launch();  // a gather launched after this kernel may resolve its rows meanwhile
  __shared__ int s_start[kMaxRequestsBucket + 1];
  __shared__ int s_first[kMaxRequestsBucket];
  __shared__ bool s_ok[kMaxRequestsBucket];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int row = static_cast<int>(blockIdx.x) * (kInsertThreads / kWarpSize) + tid / kWarpSize;
  // Derived slots (the flag is the same for all threads): request b completes the cache rows
  // floor((seq - q) / r) .. floor(seq / r) - 1, rows of the launch in request order.
  const bool derive = p.derive != nullptr && __ldg(p.derive) != 0;
  int num_requests = 0;
  if (derive) {
    num_requests = __ldg(p.num_requests);
    if (tid == 0 && num_requests >= 0 && num_requests <= p.requests_bucket) {
      int start = 0;
      int q_begin = __ldg(p.query_start_loc);
      for (int b = 0; b < num_requests; ++b) {
        const int q_end = __ldg(p.query_start_loc + b + 1);
        const int q = q_end - q_begin;
        q_begin = q_end;
        const int seq = __ldg(p.seq_lens + b);
        const bool fits = q >= 0 && seq >= q;
        const int first = fits ? (seq - q) / p.compress_ratio : 0;
        // Lengths that do not fit skip the request; for r = 1 its rows are still its tokens.
        const int count = fits ? seq / p.compress_ratio - first : (p.compress_ratio == 1 ? max(q, 0) : 0);
        s_start[b] = start;
        s_first[b] = first;
        s_ok[b] = fits && (count == 0 || (first + count - 1) / p.block_size < p.block_table_stride);
        start += count;
      }
      s_start[num_requests] = start;
    }
    __syncthreads();
  }
  if (row >= p.rows_bucket) return;
  // A chunk run alone: the row's values are in bounds for any row of the bucket, so they load
  // alongside the count and the slot rather than after them. A chunk of a step (row_offset) reads
  // only its own rows of the step's buffer, once the count says the row is real.
  const bool in_step = p.row_offset != nullptr;
  const int first = in_step ? __ldg(p.row_offset) : 0;
  const uint4* src = reinterpret_cast<const uint4*>(p.rows + (std::int64_t{first} + row) * kKvDim) + 2 * lane;
  uint4 v0 = make_uint4(0U, 0U, 0U, 0U);
  uint4 v1 = v0;
  if (!in_step) {
    v0 = __ldg(src);
    v1 = __ldg(src + 1);
  }
  const int n = p.num_rows != nullptr ? __ldg(p.num_rows) : p.rows_bucket;
  int slot = derive ? -1 : __ldg(p.slot_mapping + row);
  const bool requests_ok = !derive || (num_requests >= 0 && num_requests <= p.requests_bucket);
  const bool rows_ok = !in_step || (first >= 0 && std::int64_t{first} + n <= p.source_rows);
  if (n < 0 || n > p.rows_bucket || !requests_ok || !rows_ok) {
    if (row == 0 && lane == 0) {
      record_fault(p.status, Fault::scalars, 1, -1, rows_ok ? -1 : first, requests_ok ? n : num_requests);
    }
    return;
  }
  if (row >= n) return;
  if (in_step) {
    v0 = __ldg(src);
    v1 = __ldg(src + 1);
  }
  if (derive) {
    if (num_requests == 0) return;
    slot = derive_slot(p, row, num_requests, s_start, s_first, s_ok, lane == 0);
  }
  if (slot == -1) return;
  if (slot < -1 || std::int64_t{slot} >= std::int64_t{p.num_blocks} * p.block_size) {
    if (lane == 0) record_fault(p.status, Fault::slot, 1, -1, row, slot);
    return;
  }
  std::uint8_t* block = p.cache + std::int64_t{slot / p.block_size} * p.block_stride;
  const int offset = slot % p.block_size;
  std::uint8_t* data = block + std::int64_t{offset} * kKvRowBytes;

  const std::uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  float amax = 0.0F;
#pragma unroll
  for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(w[k])), fabsf(bf16_hi(w[k]))));
  // Four lanes hold one 64-value tile; lanes 28-31 (RoPE) reduce among themselves and ignore it.
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFU, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFU, amax, 2));
  const int e = tile_exponent(fmaxf(amax, 1e-4F));
  const int scale_byte = min(max(e + 127, 0), 255);
  if (lane < kNopeLanes) {
    // For bf16 input e lies in [-22, 120], so 2^-e is a normal float.
    const float inv_scale = __uint_as_float(static_cast<std::uint32_t>(127 - e) << 23);
    *reinterpret_cast<uint4*>(data + 16 * lane) = quantize16(v0, v1, inv_scale);
  } else {
    uint4* rope = reinterpret_cast<uint4*>(data + kKvNopeDim + 32 * (lane - kNopeLanes));
    rope[0] = v0;
    rope[1] = v1;
  }
  // Lane 0 assembles the 8-byte scale row (7 exponents, pad 0) from the first lane of each tile.
  std::uint32_t lo = 0;
  std::uint32_t hi = 0;
#pragma unroll
  for (int t = 0; t < kKvTiles; ++t) {
    const auto b = static_cast<std::uint32_t>(__shfl_sync(0xFFFFFFFFU, scale_byte, 4 * t));
    if (t < 4) {
      lo |= b << (8 * t);
    } else {
      hi |= b << (8 * (t - 4));
    }
  }
  if (lane == 0) {
    *reinterpret_cast<uint2*>(block + std::int64_t{p.block_size} * kKvRowBytes + offset * kKvScaleBytes) =
        make_uint2(lo, hi);
  }
}

/// e4m3 * 2^(byte - 127) for one lane's tile exponent: one multiply by 2^(byte - 127), except
/// that 2^128 is no float, so byte 255 multiplies by 2^127 and then by 2. Every product is exact
/// (or overflows to inf), so the only rounding is the final one to bf16.
struct TileScale {
  float factor;
  bool times_two;
};

__device__ __forceinline__ TileScale tile_scale(std::uint32_t byte) {
  const float factor = byte == 0 ? __uint_as_float(0x00400000U) : __uint_as_float(min(byte, 254U) << 23);
  return TileScale{factor, byte == 255};
}

__device__ __forceinline__ uint4 dequantize8(std::uint32_t w0, std::uint32_t w1, TileScale s) {
  std::uint32_t out[4];
  const std::uint32_t w[2] = {w0, w1};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(w[k] >> (16 * h));
      float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      f.x *= s.factor;
      f.y *= s.factor;
      if (s.times_two) {
        f.x *= 2.0F;
        f.y *= 2.0F;
      }
      out[2 * k + h] = pack_bf16x2(f.x, f.y);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

/// Row states of a warp's batch.
inline constexpr int kRowNone = 0;  // past the launch's rows
inline constexpr int kRowCopy = 1;
inline constexpr int kRowZero = 2;  // block id outside the cache: written as zeros

/// Number of blocks `rows` rows take, without overflow.
__device__ __forceinline__ int blocks_for(int rows, int block_size) {
  return rows / block_size + (rows % block_size != 0 ? 1 : 0);
}

__global__ void __launch_bounds__(kGatherThreads, kGatherCtasPerSm) kv_gather_kernel(GatherParams p) {
  using Scan = cub::BlockScan<int, kGatherThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int s_row_start[kMaxRequestsBucket + 1];  // first flattened row of each request
  __shared__ int s_compressed_rows[kMaxRequestsBucket];
  __shared__ int s_window_start[kMaxRequestsBucket];    // seq_len - gather_len

  allow_dependent_launch();
  const int tid = static_cast<int>(threadIdx.x);
  // The per-request arrays hold requests_bucket entries whatever the step: load them alongside the
  // scalars instead of after them (one memory round trip less before the first row).
  int seq = 0;
  int gather = 0;
  if (tid < p.requests_bucket) {
    seq = __ldg(p.chunk.seq_lens + tid);
    if (p.with_window) gather = __ldg(p.chunk.gather_lens + tid);
  }
  // A standalone call (KvGatherArgs) has every request of the bucket, M = M_max and N as arguments.
  const ChunkScalars sc = p.chunk.scalars != nullptr
                              ? *p.chunk.scalars
                              : ChunkScalars{p.requests_bucket, 0, p.window_offset, static_cast<std::int32_t>(p.max_rows),
                                             0, 0, 0, 0};
  const bool scalars_ok = sc.num_requests >= 0 && sc.num_requests <= p.requests_bucket && sc.n_rows >= 0 &&
                          sc.n_rows <= sc.m_rows && std::int64_t{sc.m_rows} <= p.max_rows;
  if (!scalars_ok) {
    if (blockIdx.x == 0 && tid == 0) record_fault(p.status, Fault::scalars, 1, -1, -1, sc.num_requests);
    return;
  }
  // Flattened work: each request's compressed rows, then its window rows.
  int rows = 0;
  if (tid < sc.num_requests) {
    const int compressed = p.with_compressed && seq > 0 ? seq / p.compress_ratio : 0;
    bool ok = seq >= 0;
    if (p.with_compressed) {
      ok = ok && compressed <= sc.n_rows &&
           blocks_for(compressed, p.compressed.block_size) <= p.compressed.block_table_stride;
    }
    if (p.with_window) {
      ok = ok && gather >= 0 && gather <= seq && sc.n_rows + gather <= sc.m_rows &&
           blocks_for(seq, p.window.block_size) <= p.window.block_table_stride;
    }
    if (ok) {
      rows = compressed + gather;
      s_compressed_rows[tid] = compressed;
      s_window_start[tid] = seq - gather;
    } else if (blockIdx.x == 0) {
      record_fault(p.status, Fault::seq_len, 1, tid, p.with_window ? gather : -1, seq);
    }
  }
  int start = 0;
  int total = 0;
  Scan(scan_storage).ExclusiveSum(rows, start, total);
  if (tid < kMaxRequestsBucket) s_row_start[tid] = start;
  __syncthreads();

  const int num_requests = sc.num_requests;
  const int lane = tid % kWarpSize;
  const int warps = static_cast<int>(gridDim.x) * kGatherWarps;
  const int first = static_cast<int>(blockIdx.x) * kGatherWarps + tid / kWarpSize;
  const bool nope_lane = lane < kNopeLanes;
  // Byte offset of this lane's 16 (NoPE) or 32 (RoPE) source bytes within a data row.
  const int src_offset = nope_lane ? 16 * lane : kKvNopeDim + 32 * (lane - kNopeLanes);

  // Rows are dealt round-robin: warp w takes rows w, w + warps, w + 2 * warps, ... so every warp
  // gets the same number within one, and the warps of a wave read neighbouring rows. A warp takes
  // its rows 32 at a time: each lane resolves one row (request, block table entry, addresses) so
  // the dependent block table loads of 32 rows overlap; then the warp copies the 32 rows
  // kGatherRowsInFlight at a time, all lanes on one row, with every row's loads issued first.
  for (int group = first; group < total; group += kWarpSize * warps) {
    const int u = group + lane * warps;  // this lane's row
    int state = kRowNone;
    int dst = 0;                         // kv row: b * M + (i or N + j), < requests_bucket * M_max < 2^31
    const std::uint8_t* data = nullptr;  // the row's 576 data bytes
    const std::uint8_t* scales = nullptr;
    if (u < total) {
      // The last request whose first row is <= u (it is never empty).
      int lo = 0;
      int hi = num_requests;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (s_row_start[mid] <= u) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      const int b = lo;
      const int i = u - s_row_start[b];
      const int compressed_rows = s_compressed_rows[b];
      const bool c = i < compressed_rows;
      const PagedSource& src = c ? p.compressed : p.window;
      const int pos = c ? i : s_window_start[b] + (i - compressed_rows);
      dst = b * sc.m_rows + (c ? i : sc.n_rows + (i - compressed_rows));
      const int block_id = __ldg(src.block_table + std::int64_t{b} * src.block_table_stride + pos / src.block_size);
      if (block_id < 0 || block_id >= src.num_blocks) {
        state = kRowZero;
        record_fault(p.status, Fault::block_id, 1, b, pos, block_id);
      } else {
        state = kRowCopy;
        const int offset = pos % src.block_size;
        const std::uint8_t* block = src.cache + std::int64_t{block_id} * src.block_stride;
        data = block + std::int64_t{offset} * kKvRowBytes;
        scales = block + std::int64_t{src.block_size} * kKvRowBytes + offset * kKvScaleBytes;
      }
    }
    const int rows_here = min(kWarpSize, (total - group + warps - 1) / warps);
    // Rows resolved; from here on the caches are read and kv written (KvGatherArgs::overlap_prologue).
    wait_for_previous_kernel();
    for (int batch = 0; batch < rows_here; batch += kGatherRowsInFlight) {
      int row_state[kGatherRowsInFlight];
      int row_dst[kGatherRowsInFlight];
      uint4 d0[kGatherRowsInFlight];
      uint4 d1[kGatherRowsInFlight];  // RoPE lanes: their second 16 bytes; NoPE lanes: .x = scale byte
#pragma unroll
      for (int q = 0; q < kGatherRowsInFlight; ++q) {
        const int from = batch + q;  // < 32 + kGatherRowsInFlight; lanes past rows_here give kRowNone
        row_state[q] = __shfl_sync(0xFFFFFFFFU, state, from & (kWarpSize - 1));
        if (from >= kWarpSize) row_state[q] = kRowNone;
        row_dst[q] = __shfl_sync(0xFFFFFFFFU, dst, from & (kWarpSize - 1));
        const auto row_data = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xFFFFFFFFU, reinterpret_cast<unsigned long long>(data), from & (kWarpSize - 1)));
        const auto row_scales = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xFFFFFFFFU, reinterpret_cast<unsigned long long>(scales), from & (kWarpSize - 1)));
        d0[q] = make_uint4(0, 0, 0, 0);
        d1[q] = make_uint4(0, 0, 0, 0);
        if (row_state[q] != kRowCopy) continue;
        d0[q] = __ldg(reinterpret_cast<const uint4*>(row_data + src_offset));
        if (nope_lane) {
          d1[q].x = __ldg(row_scales + lane / 4);
        } else {
          d1[q] = __ldg(reinterpret_cast<const uint4*>(row_data + src_offset + 16));
        }
      }
#pragma unroll
      for (int q = 0; q < kGatherRowsInFlight; ++q) {
        if (row_state[q] == kRowNone) continue;
        uint4* out = reinterpret_cast<uint4*>(p.kv + std::int64_t{row_dst[q]} * kKvDim + 16 * lane);
        if (row_state[q] == kRowZero) {
          out[0] = make_uint4(0, 0, 0, 0);
          out[1] = make_uint4(0, 0, 0, 0);
        } else if (nope_lane) {
          const TileScale s = tile_scale(d1[q].x);
          out[0] = dequantize8(d0[q].x, d0[q].y, s);
          out[1] = dequantize8(d0[q].z, d0[q].w, s);
        } else {
          out[0] = d0[q];
          out[1] = d1[q];
        }
      }
    }
  }
}

}  // namespace spg::kernels::detail
