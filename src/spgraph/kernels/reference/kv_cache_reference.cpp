// CPU references of the FP8 cache format and stages 0-2: see kv_cache_reference.hpp.
#include "spgraph/kernels/reference/kv_cache_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace spg::kernels::reference {

double e4m3_value(std::uint8_t bits) noexcept {
  const bool negative = (bits & 0x80U) != 0;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  // Subnormals: m * 2^-9; normals: (1 + m/8) * 2^(e - 7) = (8 + m) * 2^(e - 10).
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
  return negative ? -magnitude : magnitude;
}

std::uint8_t e4m3_round(double v) noexcept {
  if (std::isnan(v)) return 0x7F;
  const std::uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::min(std::fabs(v), 448.0);
  // Both branches scale by a power of two (exact), then round to an integer with ties to even
  // (nearbyint in the default rounding mode).
  if (a < std::ldexp(1.0, -6)) {
    // Subnormal range, steps of 2^-9; q = 8 is the smallest normal, whose bits are also 8.
    const auto q = static_cast<int>(std::nearbyint(std::ldexp(a, 9)));
    return static_cast<std::uint8_t>(sign | q);
  }
  int x = 0;
  (void)std::frexp(a, &x);  // a = f * 2^x, f in [0.5, 1): a's exponent is x - 1
  const int exponent = x - 1;
  const auto q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exponent)));  // in [8, 16]
  // q = 16 carries into the exponent field, which is the right encoding of the next binade.
  return static_cast<std::uint8_t>(sign | (((exponent + 7) << 3) + (q - 8)));
}

float bf16_value(std::uint16_t bits) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f = 0.0F;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint16_t bf16_round(float v) noexcept {
  if (std::isnan(v)) return 0x7FFF;
  std::uint32_t u = 0;
  std::memcpy(&u, &v, sizeof u);
  // bf16 is a float's top half: add just under half an ulp, plus one if the kept lsb is odd.
  u += 0x7FFFU + ((u >> 16) & 1U);
  return static_cast<std::uint16_t>(u >> 16);
}

int tile_exponent(float amax) noexcept {
  const float a = std::fmax(amax, 1e-4F);
  // An infinite tile takes the exponent of the largest finite values (bf16 max is 1.99 * 2^127).
  if (std::isinf(a)) return 120;
  // amax / 448 is a power of two only when amax = 448 * 2^e exactly, and then double division and
  // log2 are exact; elsewhere it is far from a power of two compared with double rounding.
  return static_cast<int>(std::ceil(std::log2(static_cast<double>(a) / 448.0)));
}

void quantize_row(const std::uint16_t* row, std::uint8_t* data, std::uint8_t* scales) noexcept {
  for (int t = 0; t < kKvTiles; ++t) {
    float amax = 0.0F;
    for (int j = 0; j < kKvTile; ++j) amax = std::fmax(amax, std::fabs(bf16_value(row[t * kKvTile + j])));
    const int e = tile_exponent(amax);
    scales[t] = static_cast<std::uint8_t>(std::clamp(e + 127, 0, 255));
    for (int j = 0; j < kKvTile; ++j) {
      const double x = bf16_value(row[t * kKvTile + j]);
      data[t * kKvTile + j] = e4m3_round(std::ldexp(x, -e));
    }
  }
  scales[kKvTiles] = 0;
  for (int j = 0; j < kKvRopeDim; ++j) {
    const std::uint16_t v = row[kKvNopeDim + j];
    data[kKvNopeDim + 2 * j] = static_cast<std::uint8_t>(v & 0xFF);
    data[kKvNopeDim + 2 * j + 1] = static_cast<std::uint8_t>(v >> 8);
  }
}

void dequantize_row(const std::uint8_t* data, const std::uint8_t* scales, std::uint16_t* out) noexcept {
  for (int j = 0; j < kKvNopeDim; ++j) {
    // e4m3 * 2^k is exact in double; in float it is exact too unless it overflows, so the only
    // rounding is the one to bf16.
    const double d = std::ldexp(e4m3_value(data[j]), static_cast<int>(scales[j / kKvTile]) - 127);
    float f = 0.0F;
    if (std::isnan(d)) {
      f = std::numeric_limits<float>::quiet_NaN();
    } else if (std::fabs(d) >= std::ldexp(1.0, 128)) {
      f = d > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    } else {
      f = static_cast<float>(d);
    }
    out[j] = bf16_round(f);
  }
  for (int j = 0; j < kKvRopeDim; ++j) {
    out[kKvNopeDim + j] =
        static_cast<std::uint16_t>(data[kKvNopeDim + 2 * j] | (data[kKvNopeDim + 2 * j + 1] << 8));
  }
}

void FaultLog::add(Fault kind, int request, int position, int value, std::uint32_t n) {
  counts[static_cast<int>(kind)] += n;
  records.push_back(FaultRecord{static_cast<std::int32_t>(kind), request, position, value});
}

bool FaultLog::contains(const FaultRecord& r) const noexcept {
  return std::any_of(records.begin(), records.end(), [&](const FaultRecord& x) {
    return x.kind == r.kind && x.request == r.request && x.position == r.position && x.value == r.value;
  });
}

void kv_insert(const std::uint16_t* rows, const std::int32_t* slot_mapping, int num_rows, int rows_bucket,
               std::uint8_t* cache, const CacheLayout& layout, FaultLog& log) {
  if (num_rows < 0 || num_rows > rows_bucket) {
    log.add(Fault::scalars, -1, -1, num_rows);
    return;
  }
  for (int i = 0; i < num_rows; ++i) {
    const std::int32_t slot = slot_mapping[i];
    if (slot == -1) continue;
    if (slot < -1 || slot >= layout.capacity()) {
      log.add(Fault::slot, -1, i, slot);
      continue;
    }
    quantize_row(rows + static_cast<std::size_t>(i) * kKvDim, cache + layout.row_offset(slot),
                 cache + layout.scale_offset(slot));
  }
}

namespace {

std::int64_t blocks_for(std::int64_t rows, int block_size) { return (rows + block_size - 1) / block_size; }

/// Dequantizes row `pos` of request b (through its block table row) into `out`.
void gather_row(const CacheView& v, int b, int pos, std::uint16_t* out, FaultLog& log) {
  const std::int32_t block = v.block_table[static_cast<std::size_t>(b) * v.block_table_stride + pos / v.layout.block_size];
  if (block < 0 || block >= v.layout.num_blocks) {
    std::fill(out, out + kKvDim, std::uint16_t{0});
    log.add(Fault::block_id, b, pos, block);
    return;
  }
  const std::int64_t slot = block_slot(block, v.layout.block_size, pos);
  dequantize_row(v.cache + v.layout.row_offset(slot), v.cache + v.layout.scale_offset(slot), out);
}

}  // namespace

void kv_gather(const CacheView& cache, const CacheView& window_cache, const HostChunk& chunk, GatherPart part,
               int compress_ratio, int requests_bucket, std::int64_t max_rows_per_request, std::uint16_t* kv,
               FaultLog& log) {
  const ChunkScalars& sc = chunk.scalars;
  if (sc.num_requests < 0 || sc.num_requests > requests_bucket || sc.n_rows < 0 || sc.n_rows > sc.m_rows ||
      sc.m_rows > max_rows_per_request) {
    log.add(Fault::scalars, -1, -1, sc.num_requests);
    return;
  }
  const bool with_compressed = part != GatherPart::window;
  const bool with_window = part != GatherPart::compressed;
  const CacheView& compressed_source = cache;
  const CacheView& window_source = part == GatherPart::both ? window_cache : cache;
  const std::int64_t m = sc.m_rows;
  for (int b = 0; b < sc.num_requests; ++b) {
    const int seq = chunk.seq_lens[static_cast<std::size_t>(b)];
    const int gather = with_window ? chunk.gather_lens[static_cast<std::size_t>(b)] : 0;
    const int rows = with_compressed && seq > 0 ? seq / compress_ratio : 0;
    bool ok = seq >= 0;
    if (with_compressed) {
      ok = ok && rows <= sc.n_rows &&
           blocks_for(rows, compressed_source.layout.block_size) <= compressed_source.block_table_stride;
    }
    if (with_window) {
      ok = ok && gather >= 0 && gather <= seq && std::int64_t{sc.n_rows} + gather <= m &&
           blocks_for(seq, window_source.layout.block_size) <= window_source.block_table_stride;
    }
    if (!ok) {
      log.add(Fault::seq_len, b, with_window ? gather : -1, seq);
      continue;
    }
    for (int i = 0; i < rows; ++i) {
      gather_row(compressed_source, b, i, kv + static_cast<std::size_t>(b * m + i) * kKvDim, log);
    }
    for (int j = 0; j < gather; ++j) {
      gather_row(window_source, b, seq - gather + j, kv + static_cast<std::size_t>(b * m + sc.n_rows + j) * kKvDim,
                 log);
    }
  }
}

}  // namespace spg::kernels::reference
