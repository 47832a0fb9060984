// The shared-memory tile layout and matrix descriptors of the wgmma sparse MLA kernel
// (wgmma_sm90.cuh): integer arithmetic only, host and device, so tests/cpu/test_wgmma_desc.cpp
// checks every descriptor the kernel forms against the format and the layout on the CPU.
//
// Descriptor format (PTX ISA, "Matrix Descriptor Format" of wgmma):
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset (LBO) >> 4
//   bits 32-45  stride-dimension byte offset (SBO) >> 4
//   bits 49-51  matrix base offset (0: every tile here starts 1024-byte aligned)
//   bits 62-63  swizzle mode: 0 none, 1 128B, 2 64B, 3 32B
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace spg::kernels::detail {

/// Byte offset of element (row, col) of a 128B-swizzled K-major tile with `rows` rows per panel
/// (the layout wgmma_sm90.cuh describes).
__host__ __device__ constexpr std::uint32_t swz_offset(int row, int col, int rows) {
  return static_cast<std::uint32_t>((col >> 6) * rows * 128 + row * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4) +
                                    (col & 7) * 2);
}

inline constexpr std::uint32_t kSwizzle128B = 1;

/// The descriptor of the operand `offset_bytes` (a multiple of 16) into the tile at shared::cta
/// address `tile_addr`: the tile's low word (address and LBO fields) plus offset_bytes >> 4, and
/// the high word (SBO, 128-byte swizzle). That is the descriptor of address tile_addr +
/// offset_bytes exactly, as long as that address is below 2^18 bytes (every shared::cta address
/// is: 227 KiB at most), so the address field never carries into the fields above it. The tile's
/// low word is the same expression at every step of a tile, so the compiler forms it once and a
/// step costs one add, against five operations for the descriptor of each step's address formed
/// whole (issue 15 round 13, docs/benchmark_history.md).
__host__ __device__ constexpr std::uint64_t tile_desc(std::uint32_t tile_addr, std::uint32_t offset_bytes,
                                                      std::uint32_t lbo_bytes, std::uint32_t sbo_bytes) {
  const std::uint32_t lo = (((tile_addr >> 4) & 0x3FFFu) | (((lbo_bytes >> 4) & 0x3FFFu) << 16)) + (offset_bytes >> 4);
  const std::uint32_t hi = ((sbo_bytes >> 4) & 0x3FFFu) | (kSwizzle128B << 30);
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

/// K-major operand (Q, K, P as A): 8-row core-matrix groups 1024 bytes apart (SBO); LBO is unused
/// by the swizzled K-major form (one k16 step never leaves the 128-byte row) and set to 16 bytes.
/// k16 step `ks` of a tile with `rows` rows per panel: panel ks / 4, +32 bytes per step inside it.
__host__ __device__ constexpr std::uint64_t desc_kmajor(std::uint32_t tile_addr, int ks, int rows) {
  return tile_desc(tile_addr, static_cast<std::uint32_t>((ks >> 2) * rows * 128 + (ks & 3) * 32), 16u, 1024u);
}

/// MN-major B operand (V = the K tile read transposed: MMA K = kv rows, MMA N = value columns).
/// Canonical 128B MN-major form ((8 chunks of 8 elements, m atoms), (8 rows, k groups)):
/// LBO = byte distance between 64-column atoms along N (= one panel: rows * 128), SBO = byte
/// distance between 8-row groups along K (1024). k16 step `kk` starts 16 rows (2048 bytes) on.
__host__ __device__ constexpr std::uint64_t desc_mnmajor(std::uint32_t tile_addr, int kk, std::uint32_t lbo_bytes,
                                                         std::uint32_t sbo_bytes) {
  return tile_desc(tile_addr, static_cast<std::uint32_t>(kk * 2048), lbo_bytes, sbo_bytes);
}

}  // namespace spg::kernels::detail
