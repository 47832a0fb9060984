// The attention kernel's shared-memory matrix descriptors (kernels/sparse_mla/wgmma_desc.hpp)
// against the descriptor format: every operand descriptor the kernel forms, at every
// 1024-byte-aligned tile of shared memory, equals the descriptor of its address built field by
// field (the kernel forms a tile's low word once and adds each step's offset to it).
#include <cstdint>

#include "common/catch.hpp"
#include "spgraph/kernels/sparse_mla/wgmma_desc.hpp"

namespace {

namespace d = spg::kernels::detail;

/// The descriptor of a 128B-swizzled operand at `addr`, field by field (PTX ISA, "Matrix
/// Descriptor Format"): address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base
/// offset 0, swizzle mode 1 (128B) in bits 62-63.
std::uint64_t format_desc(std::uint32_t addr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((addr >> 4) & 0x3FFFu) | static_cast<std::uint64_t>((lbo >> 4) & 0x3FFFu) << 16 |
         static_cast<std::uint64_t>((sbo >> 4) & 0x3FFFu) << 32 | std::uint64_t{1} << 62;
}

constexpr std::uint32_t kSharedBytes = 232448;  // 227 KiB, the most a CTA can take on sm_90

}  // namespace

TEST_CASE("wgmma descriptors: a tile's low word plus the step equals the step's descriptor", "[sparse_mla]") {
  // The steps' offsets come from the tile layout (swz_offset), not from the descriptors' own
  // arithmetic: a K-major k16 step ks starts at column 16 ks of row 0, an MN-major (V) step kk at
  // row 16 kk of column 0. Every K-major tile of the kernel has 64 rows a panel; V's 64-column
  // atoms are one panel apart.
  constexpr int kRows = 64;
  constexpr std::uint32_t kVLbo = kRows * 128;
  std::int64_t checked = 0;
  std::int64_t wrong = 0;
  for (std::uint32_t tile = 0; tile < kSharedBytes; tile += 1024) {
    for (int ks = 0; ks < 36; ++ks) {  // d_qk 576: 36 k16 steps
      const std::uint32_t off = d::swz_offset(0, 16 * ks, kRows);
      if (tile + off >= kSharedBytes) continue;
      ++checked;
      wrong += d::desc_kmajor(tile, ks, kRows) != format_desc(tile + off, 16, 1024);
    }
    for (int kk = 0; kk < 4; ++kk) {
      const std::uint32_t off = d::swz_offset(16 * kk, 0, kRows);
      if (tile + off >= kSharedBytes) continue;
      ++checked;
      wrong += d::desc_mnmajor(tile, kk, kVLbo, 1024) != format_desc(tile + off, kVLbo, 1024);
    }
  }
  INFO(checked << " descriptors checked, " << wrong << " wrong");
  CHECK(checked > 7000);  // 7,916: every tile, step and form above
  CHECK(wrong == 0);
  // The constant form agrees as well (the kernel's descriptors are formed in registers).
  static_assert(d::desc_kmajor(1024, 5, 64) == ((std::uint64_t{1} << 62) | (std::uint64_t{64} << 32) | (1u << 16) |
                                                ((1024u + 8192u + 32u) >> 4)));
}
