// The CPU references of stages 0-3 on hand-worked values: e4m3 and bf16 rounding at every
// boundary, tile exponents, the cache block layout, a quantized row, and a combined index row.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/reference/combine_indices_reference.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"

using namespace spg::kernels;
using namespace spg::kernels::reference;

namespace {
/// The CUDA headers' host conversion (a software path on the CPU): an independent cross-check.
std::uint8_t cuda_e4m3(double v) { return __nv_cvt_double_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
}  // namespace

TEST_CASE("e4m3 bytes decode to their OCP values", "[kv_cache][reference]") {
  CHECK(e4m3_value(0x00) == 0.0);
  CHECK(e4m3_value(0x01) == std::ldexp(1.0, -9));   // smallest subnormal
  CHECK(e4m3_value(0x07) == 7 * std::ldexp(1.0, -9));
  CHECK(e4m3_value(0x08) == std::ldexp(1.0, -6));   // smallest normal
  CHECK(e4m3_value(0x38) == 1.0);
  CHECK(e4m3_value(0x3A) == 1.25);
  CHECK(e4m3_value(0x70) == 128.0);
  CHECK(e4m3_value(0x7E) == 448.0);
  CHECK(e4m3_value(0xFE) == -448.0);
  CHECK(std::isnan(e4m3_value(0x7F)));
  CHECK(std::isnan(e4m3_value(0xFF)));
  CHECK(std::signbit(e4m3_value(0x80)));
}

TEST_CASE("e4m3 rounding is to nearest, ties to even, at every boundary", "[kv_cache][reference]") {
  for (int bits = 0; bits <= 0x7E; ++bits) {
    for (const std::uint8_t sign : {std::uint8_t{0}, std::uint8_t{0x80}}) {
      const auto code = static_cast<std::uint8_t>(bits | sign);
      const double v = e4m3_value(code);
      INFO("e4m3 0x" << std::hex << int(code));
      CHECK(e4m3_round(v) == code);
      CHECK(cuda_e4m3(v) == code);
    }
  }
  for (int bits = 0; bits < 0x7E; ++bits) {
    const double lo = e4m3_value(static_cast<std::uint8_t>(bits));
    const double hi = e4m3_value(static_cast<std::uint8_t>(bits + 1));
    const double mid = (lo + hi) / 2;
    const auto even = static_cast<std::uint8_t>(bits % 2 == 0 ? bits : bits + 1);
    for (const double s : {1.0, -1.0}) {
      const std::uint8_t sign = s < 0 ? 0x80 : 0x00;
      INFO("between 0x" << std::hex << bits << " and 0x" << bits + 1 << ", sign " << s);
      CHECK(e4m3_round(s * mid) == (even | sign));
      CHECK(e4m3_round(s * std::nextafter(mid, 0.0)) == (bits | sign));
      CHECK(e4m3_round(s * std::nextafter(mid, 1e9)) == ((bits + 1) | sign));
      // The same values as floats just around the midpoint (what the kernel rounds).
      const float below = std::nextafter(static_cast<float>(mid), 0.0F);
      const float above = std::nextafter(static_cast<float>(mid), 1e9F);
      CHECK(e4m3_round(s * below) == (bits | sign));
      CHECK(e4m3_round(s * above) == ((bits + 1) | sign));
      CHECK(cuda_e4m3(s * mid) == e4m3_round(s * mid));
      CHECK(cuda_e4m3(s * below) == e4m3_round(s * below));
      CHECK(cuda_e4m3(s * above) == e4m3_round(s * above));
    }
  }
  // Saturation and underflow.
  CHECK(e4m3_round(448.0) == 0x7E);
  CHECK(e4m3_round(464.0) == 0x7E);
  CHECK(e4m3_round(1e30) == 0x7E);
  CHECK(e4m3_round(std::numeric_limits<double>::infinity()) == 0x7E);
  CHECK(e4m3_round(-std::numeric_limits<double>::infinity()) == 0xFE);
  CHECK(e4m3_round(std::ldexp(1.0, -10)) == 0x00);  // tie between 0 and 2^-9: even
  CHECK(e4m3_round(std::nextafter(std::ldexp(1.0, -10), 1.0)) == 0x01);
  CHECK(e4m3_round(-1e-30) == 0x80);
  CHECK(e4m3_round(std::numeric_limits<double>::quiet_NaN()) == 0x7F);
  // A sweep of random values against the CUDA headers' conversion.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> mant(-2.0, 2.0);
  std::uniform_int_distribution<int> ex(-14, 10);
  for (int i = 0; i < 100000; ++i) {
    const double v = std::ldexp(mant(rng), ex(rng));
    INFO("v = " << v);
    REQUIRE(e4m3_round(v) == cuda_e4m3(v));
  }
}

TEST_CASE("bf16 rounding is to nearest, ties to even", "[kv_cache][reference]") {
  CHECK(bf16_round(1.0F) == 0x3F80);
  CHECK(bf16_round(1.0F + std::ldexp(1.0F, -8)) == 0x3F80);      // tie: even
  CHECK(bf16_round(1.0F + 3 * std::ldexp(1.0F, -8)) == 0x3F82);  // tie: even, upwards
  CHECK(bf16_round(std::nextafter(1.0F + std::ldexp(1.0F, -8), 2.0F)) == 0x3F81);
  CHECK(bf16_round(-2.0F) == 0xC000);
  CHECK(bf16_round(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(bf16_round(std::numeric_limits<float>::max()) == 0x7F80);  // rounds past bf16 max
  CHECK(bf16_round(std::numeric_limits<float>::quiet_NaN()) == 0x7FFF);
  CHECK(bf16_value(0x3F80) == 1.0F);
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xFFFFFFFFU);
  for (int i = 0; i < 100000; ++i) {
    std::uint32_t u = bits(rng);
    float f = 0.0F;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    const __nv_bfloat16 h = __float2bfloat16_rn(f);
    std::uint16_t want = 0;
    std::memcpy(&want, &h, 2);
    INFO("float bits 0x" << std::hex << u);
    REQUIRE(bf16_round(f) == want);
  }
}

TEST_CASE("tile exponents are ceil(log2(max(amax, 1e-4) / 448))", "[kv_cache][reference]") {
  CHECK(tile_exponent(448.0F) == 0);
  CHECK(tile_exponent(bf16_value(static_cast<std::uint16_t>(bf16_round(448.0F) + 1))) == 1);
  CHECK(tile_exponent(224.0F) == -1);
  CHECK(tile_exponent(224.5F) == 0);
  CHECK(tile_exponent(3.5F) == -7);  // 3.5 / 448 = 2^-7 exactly
  CHECK(tile_exponent(1.0F) == -8);
  CHECK(tile_exponent(0.0F) == -22);   // 1e-4 floor: log2(1e-4 / 448) = -22.09
  CHECK(tile_exponent(1e-30F) == -22);
  CHECK(tile_exponent(std::ldexp(448.0F, 100)) == 100);
  CHECK(tile_exponent(bf16_value(0x7F7F)) == 120);  // bf16 max
  CHECK(tile_exponent(std::numeric_limits<float>::infinity()) == 120);
}

TEST_CASE("cache blocks hold data rows, then scale rows, padded to a multiple of 576", "[kv_cache][reference]") {
  const CacheLayout swa = CacheLayout::make(64, 10);
  CHECK(swa.block_stride == 37440);  // 64 * 584 = 37376 -> 65 * 576
  CHECK(swa.bytes() == 374400U);
  CHECK(swa.capacity() == 640);
  CHECK(swa.row_offset(130) == 2 * 37440 + 2 * 576);
  CHECK(swa.scale_offset(130) == 2 * 37440 + 64 * 576 + 2 * 8);
  const CacheLayout c128 = CacheLayout::make(2, 5);
  CHECK(c128.block_stride == 1728);  // 2 * 584 = 1168 -> 3 * 576
  CHECK(c128.row_offset(3) == 1728 + 576);
  CHECK(c128.scale_offset(3) == 1728 + 2 * 576 + 8);
  CHECK(CacheLayout::make(1, 1).block_stride == 1152);
}

TEST_CASE("a row quantizes to hand-worked bytes and dequantizes back", "[kv_cache][reference]") {
  std::vector<std::uint16_t> row(kKvDim, bf16_round(0.0F));
  // Tile 0: amax 3.5 -> exponent -7 (byte 120); 3.5 -> 448 (0x7E), 1.0 -> 128 (0x70),
  // 0.01 -> 1.28 -> 1.25 (0x3A), -0.5 -> -64 (0xE8).
  row[0] = bf16_round(3.5F);
  row[1] = bf16_round(1.0F);
  row[2] = bf16_round(0.01F);
  row[3] = bf16_round(-0.5F);
  // Tile 1: all zero -> exponent -22 (byte 105), zeros stay zero.
  // Tile 2: amax 448 -> exponent 0; 300 -> 288 (0x79: 1.125 * 2^8).
  row[128] = bf16_round(448.0F);
  row[129] = bf16_round(300.0F);
  // RoPE: stored as bf16, little-endian.
  row[448] = 0x1234;
  row[511] = 0xBEEF;
  std::vector<std::uint8_t> data(kKvRowBytes);
  std::vector<std::uint8_t> scales(kKvScaleBytes, 0xCC);
  quantize_row(row.data(), data.data(), scales.data());
  CHECK(int(scales[0]) == 120);
  CHECK(int(scales[1]) == 105);
  CHECK(int(scales[2]) == 127);
  CHECK(int(scales[7]) == 0);
  CHECK(int(data[0]) == 0x7E);
  CHECK(int(data[1]) == 0x70);
  CHECK(int(data[2]) == 0x3A);
  CHECK(int(data[3]) == 0xE8);
  CHECK(int(data[64]) == 0x00);
  CHECK(int(data[128]) == 0x7E);
  CHECK(int(data[129]) == 0x79);
  CHECK(int(data[448]) == 0x34);
  CHECK(int(data[449]) == 0x12);
  CHECK(int(data[574]) == 0xEF);
  CHECK(int(data[575]) == 0xBE);
  std::vector<std::uint16_t> back(kKvDim);
  dequantize_row(data.data(), scales.data(), back.data());
  CHECK(bf16_value(back[0]) == 3.5F);
  CHECK(bf16_value(back[1]) == 1.0F);
  CHECK(bf16_value(back[2]) == 1.25F / 128.0F);
  CHECK(bf16_value(back[3]) == -0.5F);
  CHECK(bf16_value(back[129]) == 288.0F);
  CHECK(back[448] == 0x1234);
  CHECK(back[511] == 0xBEEF);
  // Extreme scale bytes: 2^128 overflows to inf; 2^-127 lands in bf16's subnormals (step 2^-133).
  std::vector<std::uint8_t> extreme = data;
  extreme[64] = 0x38;  // 1.0 * 2^-127 = 64 * 2^-133
  extreme[65] = 0x09;  // 9 * 2^-136 = 1.125 * 2^-133 -> 2^-133
  extreme[66] = 0x0C;  // 12 * 2^-136 = 1.5 * 2^-133 -> tie -> 2 * 2^-133
  extreme[67] = 0x01;  // 2^-136 -> 0
  const std::vector<std::uint8_t> extreme_scales = {255, 0, 127, 127, 127, 127, 127, 0};
  dequantize_row(extreme.data(), extreme_scales.data(), back.data());
  CHECK(back[0] == 0x7F80);  // 448 * 2^128 = inf
  CHECK(back[3] == 0xFF80);  // -64 * 2^128 = -inf
  CHECK(back[64] == 0x0040);
  CHECK(back[65] == 0x0001);
  CHECK(back[66] == 0x0002);
  CHECK(back[67] == 0x0000);
}

TEST_CASE("combined rows follow the stage 3 formulas on a hand-worked chunk", "[combine][reference]") {
  // r = 4, W = 4, top_k = 3. Request 0: seq 10, query 2 (positions 8, 9), gather 5.
  // Request 1: seq 12, query 3 (positions 9, 10, 11), gather 6. N = 3, M = 9. One padded token.
  HostChunk c;
  c.scalars = ChunkScalars{2, 5, 3, 9, 0, {}};
  c.query_start_loc = {0, 2, 5};
  c.seq_lens = {10, 12};
  c.gather_lens = {5, 6};
  const std::vector<std::int32_t> topk = {
      1,  -1, 0,   // t0: topk_len 2
      0,  1,  7,   // t1: topk_len 2 (7 is past topk_len: never read)
      2,  -1, 2,   // t2: request 1, 2 -> 2 + 9
      0,  3,  99,  // t3: 3 is not below 12 / 4 = 3: a fault
      -1, 1,  2,   // t4: topk_len 3; -1 stays -1 in request 1
      5,  5,  5,   // t5: padding
  };
  std::vector<std::int32_t> combined(6 * 8, -99);
  std::vector<std::int32_t> lens(6, -99);
  FaultLog log;
  combine_indices(topk.data(), 3, 4, 4, c, 6, 2, combined.data(), 8, lens.data(), log);
  CHECK(lens == std::vector<std::int32_t>{6, 6, 6, 6, 7, 0});
  auto row = [&](int t) {
    return std::vector<std::int32_t>(combined.begin() + t * 8, combined.begin() + t * 8 + lens[std::size_t(t)]);
  };
  CHECK(row(0) == std::vector<std::int32_t>{1, -1, 3, 4, 5, 6});
  CHECK(row(1) == std::vector<std::int32_t>{0, 1, 4, 5, 6, 7});
  CHECK(row(2) == std::vector<std::int32_t>{11, -1, 12, 13, 14, 15});
  CHECK(row(3) == std::vector<std::int32_t>{9, -1, 13, 14, 15, 16});
  CHECK(row(4) == std::vector<std::int32_t>{-1, 10, 11, 14, 15, 16, 17});
  CHECK(log.count(spg::kernels::Fault::topk_index) == 1);
  CHECK(log.contains(FaultRecord{static_cast<std::int32_t>(spg::kernels::Fault::topk_index), 1, 3, 3}));
  CHECK(log.records.size() == 1);
}
