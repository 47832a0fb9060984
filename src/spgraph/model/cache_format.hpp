// The V4 FP8 paged cache format's constants, defined once: the model's head dim, a token's data and
// scale rows, and their split into e4m3 NoPE tiles and bf16 RoPE values (docs/pipeline.md,
// "FP8 paged KV cache"). The kernels' own names for them (src/spgraph/kernels/kv_cache/kv_cache.hpp) are these.
#pragma once

namespace spg::model {

/// Values per K row, per gathered workspace row and per output row (d_qk = d_v = 512).
inline constexpr int kHeadDim = 512;
/// NoPE values (stored as e4m3 in tiles of kCacheTile) and RoPE values (stored as bf16).
inline constexpr int kCacheNopeDim = 448;
inline constexpr int kCacheRopeDim = kHeadDim - kCacheNopeDim;
inline constexpr int kCacheTile = 64;
inline constexpr int kCacheTiles = kCacheNopeDim / kCacheTile;
/// Bytes of one token's data row: 448 e4m3 + 64 bf16 = 576.
inline constexpr int kCacheRowBytes = kCacheNopeDim + 2 * kCacheRopeDim;
/// Bytes of one token's scale row: one UE8M0 exponent per NoPE tile (7), one zero pad byte.
inline constexpr int kCacheScaleBytes = kCacheTiles + 1;

static_assert(kCacheRowBytes == 576 && kCacheScaleBytes == 8 && kCacheNopeDim % kCacheTile == 0);

}  // namespace spg::model
