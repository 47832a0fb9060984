// Device code of the synthetic model front (see synthetic_front.hpp).
#pragma once

#include <cuda_bf16.h>

#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"

namespace spg::kernels::detail {

// Grid: (row blocks, layers). Each thread writes 8 values of a K row or 8 top-k entries.
__global__ void synthetic_front_kernel(const SyntheticFrontArgs args) {
  const int layer = static_cast<int>(blockIdx.y);
  const FrontLayer& l = args.layers[layer];
  const int ri = l.compress_ratio == 4 ? 1 : (l.compress_ratio == 128 ? 2 : 0);
  const int k_items = args.num_tokens * 64;  // 64 groups of 8 values per row
  const int c_items = ri > 0 ? args.new_compressed_rows[ri] * 64 : 0;
  const int t_items = ri > 0 ? args.num_tokens * (l.top_k / 8) : 0;
  const int total = k_items + c_items + t_items;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < total;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    if (i < k_items + c_items) {
      const bool compressed = i >= k_items;
      const int item = compressed ? i - k_items : i;
      const int row = item / 64;
      const int d0 = (item % 64) * 8;
      const int stream = 2 * layer + (compressed ? 1 : 0);
      __nv_bfloat16* dst = (compressed ? l.compressed_k_rows : l.k_rows) + static_cast<long long>(row) * 512 + d0;
      __align__(16) __nv_bfloat16 v[8];
      for (int k = 0; k < 8; ++k) v[k] = __float2bfloat16_rn(front_k_value(args.seed, args.step, stream, row, d0 + k));
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
    } else {
      const int item = i - k_items - c_items;
      const int per_token = l.top_k / 8;
      const int token = item / per_token;
      const int j0 = (item % per_token) * 8;
      int b = 0;
      while (b + 1 < args.num_requests && args.query_start_loc[b + 1] <= token) ++b;
      const int rows = args.seq_lens[b] / l.compress_ratio;
      __align__(16) int v[8];
      for (int k = 0; k < 8; ++k) v[k] = front_topk(args.seed, args.step, layer, token, j0 + k, l.top_k, rows);
      int* dst = l.topk_indices + static_cast<long long>(token) * l.top_k + j0;
      reinterpret_cast<int4*>(dst)[0] = *reinterpret_cast<const int4*>(v);
      reinterpret_cast<int4*>(dst)[1] = *reinterpret_cast<const int4*>(v + 4);
    }
  }
}

__global__ void fill_query_kernel(__nv_bfloat16* q, std::size_t elems, std::uint64_t seed, int layer) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < elems;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    q[i] = __float2bfloat16_rn(front_q_value(seed, layer, i));
  }
}

// One thread per 16 bytes of a block's data rows, then its scale rows.
__global__ void fill_cache_kernel(std::uint8_t* cache, std::int64_t blocks, int block_size, std::int64_t stride,
                                  std::uint64_t seed) {
  const std::int64_t per_block = static_cast<std::int64_t>(block_size) * (576 + 8) / 8;  // 8-byte words
  const std::int64_t total = blocks * per_block;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = i / per_block;
    const std::int64_t w = i % per_block;
    const std::uint64_t h = front_hash(seed, 77, static_cast<std::uint64_t>(b), static_cast<std::uint64_t>(w));
    std::uint64_t word = 0;
    const std::int64_t data_words = static_cast<std::int64_t>(block_size) * 72;
    if (w < data_words) {
      const int in_row = static_cast<int>(w % 72);  // 56 words of e4m3, then 16 of bf16
      for (int k = 0; k < 8; ++k) {
        std::uint64_t byte;
        if (in_row < 56) {
          byte = (h >> (8 * k)) & 0xFF;
          if ((byte & 0x7F) == 0x7F) byte ^= 0x01;  // no NaN encodings
        } else {
          // bf16 values of magnitude 2^-5 .. 2^-4 (high byte 0x3D / 0xBD) with random mantissas
          byte = (k % 2 == 1) ? (0x3D | ((h >> (8 * k)) & 0x80)) : ((h >> (8 * k)) & 0xFF);
        }
        word |= byte << (8 * k);
      }
    } else {
      for (int k = 0; k < 8; ++k) {
        // scales 2^-15 .. 2^-12: |values| up to 448 * 2^-12 = 0.11
        const std::uint64_t byte = k == 7 ? 0 : 112 + ((h >> (8 * k)) % 4);
        word |= byte << (8 * k);
      }
    }
    *reinterpret_cast<std::uint64_t*>(cache + b * stride + w * 8) = word;
  }
}

}  // namespace spg::kernels::detail
